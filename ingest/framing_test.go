package ingest

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// rawExchange sends req as written on a new connection to the server and
// reads one answer; closed says whether the server then closed the
// connection (within 2 s) instead of waiting for the next request.
func rawExchange(t *testing.T, e *env, req string) (resp *http.Response, body string, closed bool) {
	t.Helper()
	u, err := url.Parse(e.srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.Dial("tcp", u.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, req); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	br := bufio.NewReader(conn)
	method, _, _ := strings.Cut(req, " ")
	if resp, err = http.ReadResponse(br, &http.Request{Method: method}); err != nil {
		t.Fatalf("no answer: %v", err)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(2 * time.Second))
	_, err = br.ReadByte()
	return resp, string(b), err == io.EOF
}

// TestChunkedWithContentLengthClosesConnection: a request framed both by
// Transfer-Encoding: chunked and by Content-Length is read by its chunks
// (net/http drops the Content-Length), and RFC 9112 (6.1) requires the
// server to close the connection after answering it: a proxy in front
// that framed it by its Content-Length sends the rest of the chunks as
// the start of the next request on that connection, maybe another
// client's (request smuggling). net/http keeps the connection
// (golang/go#80942), and the Content-Length is gone before the handler
// sees the request, so every chunked request closes its connection.
func TestChunkedWithContentLengthClosesConnection(t *testing.T) {
	e := newEnv(t, nil)
	ev := `{"specversion":"1.0","id":"te-cl","source":"s","type":"prompt","subject":"acme-1","time":"2026-11-29T12:00:00Z","data":{"tokens":{"input":5},"user":"u"}}`
	head := "POST /api/v1/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + e.token + "\r\nContent-Type: application/cloudevents+json\r\n"
	chunked := fmt.Sprintf("Transfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n", len(ev), ev)
	for _, c := range []struct {
		name, req string
		close     bool
	}{
		{"chunked and Content-Length", head + "Content-Length: 3\r\n" + chunked, true},
		{"chunked", head + chunked, true},
		{"Content-Length", head + fmt.Sprintf("Content-Length: %d\r\n\r\n%s", len(ev), ev), false},
	} {
		resp, body, closed := rawExchange(t, e, c.req)
		if resp.StatusCode != http.StatusNoContent {
			t.Errorf("%s: %d %s, want 204", c.name, resp.StatusCode, body)
		}
		if closed != c.close || resp.Close != c.close {
			t.Errorf("%s: connection closed %v (Connection: close %v), want %v", c.name, closed, resp.Close, c.close)
		}
	}
}

// TestPathsAnsweredAsProblems: a path the endpoints' routes do not take
// is 404, and only a method other than POST on an endpoint's path is
// 405. "/api%2Fv1/events" is "/api/v1/events" decoded, but no route
// (ServeMux matches "%2F" as a character of a segment): a POST to it was
// answered 405 `"POST" is not allowed; POST events`. A CONNECT, whose
// target has no path, was answered by ServeMux in plain text, not as
// problem details, and without closing the connection.
func TestPathsAnsweredAsProblems(t *testing.T) {
	e := newEnv(t, nil)
	for _, c := range []struct {
		name, req string
		status    int
	}{
		{"POST escaped slash", "POST /api%2Fv1/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + e.token + "\r\nContent-Type: application/cloudevents+json\r\nContent-Length: 2\r\n\r\n{}", http.StatusNotFound},
		{"POST escaped slash, /v1", "POST /v1%2Fevents HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n", http.StatusNotFound},
		{"GET escaped slash", "GET /api%2Fv1/events HTTP/1.1\r\nHost: x\r\n\r\n", http.StatusNotFound},
		{"GET escaped letter", "GET /api/v1/%65vents HTTP/1.1\r\nHost: x\r\n\r\n", http.StatusMethodNotAllowed},
		{"HEAD", "HEAD /v1/events HTTP/1.1\r\nHost: x\r\n\r\n", http.StatusMethodNotAllowed},
		{"CONNECT", "CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n", http.StatusNotFound},
	} {
		resp, body, closed := rawExchange(t, e, c.req)
		if resp.StatusCode != c.status {
			t.Errorf("%s: %d %s, want %d", c.name, resp.StatusCode, body, c.status)
			continue
		}
		if ct := resp.Header.Get("Content-Type"); ct != "application/problem+json" {
			t.Errorf("%s: Content-Type %q, want problem details", c.name, ct)
		}
		if resp.Request.Method != http.MethodHead && !strings.Contains(body, fmt.Sprintf(`"status":%d`, c.status)) {
			t.Errorf("%s: body %s", c.name, body)
		}
		if !closed {
			t.Errorf("%s: connection kept", c.name)
		}
	}
}

// TestUnroutedRequestsCounted: a request no endpoint takes (404, 405) is
// counted in meterline_ingest_requests_total under tenant none, as every
// other answer is: a client posting to a wrong path (an SDK given a base
// URL that already ends in /api/v1) was answered 404 and showed in no
// metric, so the dashboard's requests by status showed nothing of it.
func TestUnroutedRequestsCounted(t *testing.T) {
	e := newEnv(t, nil)
	for _, path := range []string{"/api/v1/api/v1/events", "//api/v1/events"} {
		if status, _, b := e.post(path, "application/cloudevents+json", e.token, []byte(`{}`)); status != http.StatusNotFound {
			t.Fatalf("%s: %d %s", path, status, b)
		}
	}
	req, err := http.NewRequest(http.MethodGet, e.srv.URL()+"/api/v1/events", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	for code, want := range map[string]float64{"404": 2, "405": 1} {
		if got := testutil.ToFloat64(e.srv.metrics.requests.WithLabelValues(noTenant, code)); got != want {
			t.Errorf("requests_total{tenant=none,code=%s} = %v, want %v", code, got, want)
		}
	}
}

// TestUnacknowledgedLogBounded: the warning of a request answered 503
// because Kafka did not take its records is bounded as the HTTP server's
// error log is. With the producer's buffer full every request is answered
// at once, and each wrote a line: as many lines a second as requests, at
// the moment an operator reads the log to find what is wrong.
func TestUnacknowledgedLogBounded(t *testing.T) {
	core, logs := observer.New(zap.InfoLevel)
	e := newEnv(t, func(c *Config) { c.Logger = zap.New(core) })
	e.srv.maxBuffered = -1 // every request finds the producer's buffer full
	ev := `{"specversion":"1.0","id":"k","source":"s","type":"prompt","subject":"acme-1","time":"2026-11-29T12:00:00Z","data":{"tokens":{"input":5},"user":"u"}}`
	const n = 40
	for i := range n {
		if status, _, b := e.post("/api/v1/events", "application/cloudevents+json", e.token, []byte(ev)); status != http.StatusServiceUnavailable {
			t.Fatalf("request %d: %d %s, want 503", i, status, b)
		}
	}
	if lines := logs.FilterMessageSnippet("Kafka did not acknowledge").Len(); lines > errorLogBurst+2 {
		t.Fatalf("%d requests answered 503 logged %d lines, want at most about %d", n, lines, errorLogBurst)
	}
}
