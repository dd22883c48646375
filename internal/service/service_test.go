package service

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/meterline/meterline/internal/testenv"
)

// TestServerBoundsSlowClients: the metrics, health and status server may
// listen on every interface (docs/operations.md, HTTP servers), and a
// client that holds connections open must not hold them for ever: one
// that sends its headers slowly, one that sends a body slowly, one that
// reads the answer slowly and one that keeps an idle keep-alive
// connection are each cut off after a bounded time. Go's server bounds
// none of these unless told (a zero timeout is no timeout; an idle
// connection falls back to ReadTimeout).
func TestServerBoundsSlowClients(t *testing.T) {
	s, err := Listen("127.0.0.1:0", prometheus.NewRegistry(), zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	defer s.ln.Close()
	for _, c := range []struct {
		name string
		d    time.Duration
	}{
		{"ReadHeaderTimeout", s.srv.ReadHeaderTimeout},
		{"ReadTimeout", s.srv.ReadTimeout},
		{"WriteTimeout", s.srv.WriteTimeout},
		{"IdleTimeout", s.srv.IdleTimeout},
	} {
		if c.d <= 0 || c.d > 5*time.Minute {
			t.Errorf("%s = %s, want a bound of at most 5m", c.name, c.d)
		}
	}
}

// TestServerBoundsHeaders: a client that reaches the port must not make
// the process hold a megabyte per connection: net/http reads up to 1 MB
// of headers unless told, and a connection that sends them and stalls
// holds them for ReadHeaderTimeout (about 2 MB of heap each, measured).
// What the server's clients send fits well within 16 KB: a scrape
// (a few hundred bytes), a browser's request for the status page with
// the host's cookies (common servers refuse a header line over 8 KB),
// a reverse proxy's headers. A request with 8 KB of cookies is answered;
// one with 32 KB of headers is answered 431 and closed.
func TestServerBoundsHeaders(t *testing.T) {
	s, err := Listen("127.0.0.1:0", prometheus.NewRegistry(), zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	defer func() { cancel(); <-done }()
	for _, c := range []struct {
		header string
		size   int
		want   int
	}{
		{"Cookie", 8 << 10, http.StatusOK},
		{"X-Large", 32 << 10, http.StatusRequestHeaderFieldsTooLarge},
	} {
		req, err := http.NewRequest(http.MethodGet, "http://"+s.Addr()+"/healthz", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set(c.header, strings.Repeat("a", c.size))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("%d bytes of %s: %v", c.size, c.header, err)
		}
		resp.Body.Close()
		if resp.StatusCode != c.want {
			t.Errorf("%d bytes of %s: %d, want %d", c.size, c.header, resp.StatusCode, c.want)
		}
	}
}

// TestServerRefusesForeignHosts: a browser on the operator's machine
// must not read the server through DNS rebinding (a page of some domain
// whose name is made to resolve to 127.0.0.1 then reads the answers as
// its own; docs/operations.md, HTTP servers). Bound to loopback, the
// server answers only a Host that is an IP address, localhost or a
// .localhost name, or one given to AllowHosts; bound to every interface,
// any Host (Prometheus scrapes it by the names of its network), unless
// AllowHosts names the hosts.
func TestServerRefusesForeignHosts(t *testing.T) {
	serve := func(addr string, allowed ...string) string {
		t.Helper()
		s, err := Listen(addr, prometheus.NewRegistry(), zap.NewNop())
		if err != nil {
			t.Fatal(err)
		}
		s.AllowHosts(allowed...)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- s.Run(ctx) }()
		t.Cleanup(func() { cancel(); <-done })
		_, port, _ := net.SplitHostPort(s.Addr())
		return port
	}
	check := func(what, port string, want map[string]int) {
		t.Helper()
		for host, code := range want {
			for _, path := range []string{"/", "/status.json", "/metrics", "/healthz", "/readyz"} {
				if got := testenv.StatusWithHost(t, "http://127.0.0.1:"+port+path, strings.ReplaceAll(host, "PORT", port)); got != code {
					t.Errorf("%s: Host %q %s: %d, want %d", what, host, path, got, code)
				}
			}
		}
	}
	check("loopback", serve("127.0.0.1:0"), map[string]int{
		"127.0.0.1:PORT": 200, "localhost:PORT": 200, "LocalHost.:PORT": 200, "localhost": 200, "status.localhost:PORT": 200,
		"[::1]:PORT": 200, "10.1.2.3:PORT": 200,
		"rebound.example:PORT": 403, "rebound.example": 403, "localhost.example:PORT": 403, "dedup:PORT": 403,
	})
	check("loopback, allowed", serve("127.0.0.1:0", "metrics.example"), map[string]int{
		"metrics.example:PORT": 200, "Metrics.Example.:PORT": 200, "127.0.0.1:PORT": 200, "localhost:PORT": 200,
		"rebound.example:PORT": 403,
	})
	check("every interface", serve(":0"), map[string]int{
		"dedup:PORT": 200, "rebound.example:PORT": 200, "127.0.0.1:PORT": 200,
	})
	check("every interface, allowed", serve(":0", "dedup"), map[string]int{
		"dedup:9464": 200, "127.0.0.1:PORT": 200, "localhost:PORT": 200,
		"rebound.example:PORT": 403,
	})
}

// TestServerBoundsRefusedHostLogs: a request refused for its Host is
// logged, and a client that can reach the port decides how many there
// are and how long their Host and path are (up to maxHeaderBytes
// together). Behind the logger's sampling (the first 100 lines a second
// of a message), the lines would be 100 a second of up to that each. The
// server writes at most refusedLogBurst lines at once, then one a
// second, the next counting those left out, each quoting at most
// refusedLogQuote bytes of the Host and of the path.
func TestServerBoundsRefusedHostLogs(t *testing.T) {
	core, logs := observer.New(zap.WarnLevel)
	sampled := zapcore.NewSamplerWithOptions(core, time.Second, 100, 0)
	s, err := Listen("127.0.0.1:0", prometheus.NewRegistry(), zap.New(sampled))
	if err != nil {
		t.Fatal(err)
	}
	defer s.ln.Close()
	long := strings.Repeat("x", 100<<10)
	const n = 1000
	for range n {
		r := httptest.NewRequest(http.MethodGet, "/"+long, nil)
		r.Host = "rebound-" + long + ".example"
		w := httptest.NewRecorder()
		s.serveHTTP(w, r)
		if w.Code != http.StatusForbidden {
			t.Fatalf("GET with a foreign Host: %d, want 403", w.Code)
		}
	}
	quoted := 0
	for _, e := range logs.All() {
		for _, f := range e.Context {
			quoted += len(f.String)
		}
	}
	if lines := logs.Len(); lines > 20 || quoted > 64<<10 {
		t.Errorf("%d requests refused for their Host logged %d lines quoting %d bytes of Host and path, want at most 20 lines and %d bytes",
			n, lines, quoted, 64<<10)
	}
	if logs.Len() == 0 || !strings.HasPrefix(logs.All()[0].ContextMap()["host"].(string), "rebound-xxx") {
		t.Fatalf("the refused Host is not logged")
	}
	// After a pause, a line again; the lines count every request refused.
	lines := logs.Len()
	time.Sleep(1100 * time.Millisecond)
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.Host = "rebound.example"
	s.serveHTTP(httptest.NewRecorder(), r)
	var leftOut int64
	for _, e := range logs.All() {
		n, _ := e.ContextMap()["left_out"].(int64)
		leftOut += n
	}
	if logs.Len() != lines+1 || leftOut+int64(logs.Len()) != n+1 {
		t.Errorf("%d requests refused: %d lines, counting %d left out", n+1, logs.Len(), leftOut)
	}
}
