package ingest

import (
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// malformedCount is meterline_ingest_refused_requests_total{tenant="none",
// problem="malformed-request"} of reg; -1 when the series is not there.
func malformedCount(t *testing.T, reg *prometheus.Registry) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "meterline_ingest_refused_requests_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["tenant"] == noTenant && labels["problem"] == problemMalformedRequest {
				return m.GetCounter().GetValue()
			}
		}
	}
	return -1
}

// waitMalformed waits until the count is want (a connection is counted
// as net/http closes it, after its answer).
func waitMalformed(t *testing.T, reg *prometheus.Registry, want float64, what string) {
	t.Helper()
	var got float64
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if got = malformedCount(t, reg); got == want {
			return
		}
	}
	t.Fatalf("after %s: malformed-request count %v, want %v", what, got, want)
}

// statusLineOf writes text on a new connection (dial) and returns the
// status line of the answer, "" when the connection is closed without one.
func statusLineOf(t *testing.T, dial func() net.Conn, text string) string {
	t.Helper()
	conn := dial()
	defer conn.Close()
	if _, err := io.WriteString(conn, text); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	// Read to the end, as the server closes the connection: a client
	// gone first could make its answer fail.
	b, _ := io.ReadAll(conn)
	line, _, _ := strings.Cut(string(b), "\n")
	return strings.TrimSpace(line)
}

// TestMalformedRequestsCounted: a request net/http refuses itself, before
// the handler (a control byte in a header, a request line that is not
// HTTP, headers over the bound, another HTTP version), is counted in
// meterline_ingest_refused_requests_total{tenant="none",
// problem="malformed-request"}, exported at 0 from the start, over plain
// HTTP and TLS alike; a client that leaves mid-headers (answered nothing),
// a request the handler answers, and a good request on a connection
// before a malformed one are not counted as malformed.
func TestMalformedRequestsCounted(t *testing.T) {
	for _, useTLS := range []bool{false, true} {
		t.Run(fmt.Sprintf("tls=%v", useTLS), func(t *testing.T) {
			reg := prometheus.NewRegistry()
			var certFile, keyFile string
			var clientTLS *tls.Config
			if useTLS {
				cf, kf, roots := selfSigned(t, t.TempDir())
				certFile, keyFile, clientTLS = cf, kf, &tls.Config{RootCAs: roots, ServerName: "127.0.0.1"}
			}
			e := newEnv(t, func(c *Config) { c.Registerer = reg; c.TLSCertFile, c.TLSKeyFile = certFile, keyFile })
			dial := func() net.Conn {
				var conn net.Conn
				var err error
				if useTLS {
					conn, err = tls.Dial("tcp", e.srv.Addr(), clientTLS)
				} else {
					conn, err = net.Dial("tcp", e.srv.Addr())
				}
				if err != nil {
					t.Fatal(err)
				}
				return conn
			}
			waitMalformed(t, reg, 0, "the start")
			good := "POST /v1/events HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
			// Answered 204, the connection kept.
			keepAlive := "POST /api/v1/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + e.token +
				"\r\nContent-Type: application/cloudevents-batch+json\r\nContent-Length: 2\r\n\r\n[]"
			// Answered by the handler (401): not malformed.
			if got := statusLineOf(t, dial, good); !strings.HasPrefix(got, "HTTP/1.1 401") {
				t.Fatalf("a request without a key: %q; want 401", got)
			}
			// Gone mid-headers (the TCP connection closed, as a client
			// that crashed or gave up): not counted.
			conn := dial()
			_, _ = io.WriteString(conn, "POST /v1/events HTTP/1.1\r\nHost: x\r\n")
			time.Sleep(50 * time.Millisecond)
			if tc, ok := conn.(*tls.Conn); ok {
				conn = tc.NetConn() // gone, without a close_notify
			}
			conn.Close()
			time.Sleep(100 * time.Millisecond)
			waitMalformed(t, reg, 0, "a 401 and a client gone mid-headers")
			n := 0.0
			for _, c := range []struct{ what, text, status string }{
				{"a control byte in a header", "POST /v1/events HTTP/1.1\r\nHost: x\r\nX-Trace: a\x01b\r\nContent-Length: 0\r\n\r\n", "HTTP/1.1 400"},
				{"a request line that is not HTTP", "HELLO\r\n\r\n", "HTTP/1.1 400"},
				{"headers over the bound", "POST /v1/events HTTP/1.1\r\nHost: x\r\nX-Pad: " + strings.Repeat("a", 40<<10) + "\r\n\r\n", "HTTP/1.1 431"},
				{"HTTP/2.0 on the request line", "POST /v1/events HTTP/2.0\r\nHost: x\r\n\r\n", "HTTP/1.1 505"},
				{"a good request then a malformed one", keepAlive + "POST /v1/events HTTP/1.1\r\nHost: x\r\nX-A: \x7f\r\n\r\n", "HTTP/1.1 204"},
			} {
				if got := statusLineOf(t, dial, c.text); !strings.HasPrefix(got, c.status) {
					t.Fatalf("%s: %q; want %s", c.what, got, c.status)
				}
				n++
				waitMalformed(t, reg, n, c.what)
			}
			// And nothing more counts for the mid-headers client and 401s.
			time.Sleep(100 * time.Millisecond)
			waitMalformed(t, reg, n, "the others")
		})
	}
}
