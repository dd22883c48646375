package ingest

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// slowRequest sends the headers of a request and the first 10 bytes of
// its body of n bytes to addr; the rest never comes. extra are more
// header lines ("Name: value\r\n").
func slowRequest(t *testing.T, addr, method, path, extra string, n int) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	fmt.Fprintf(conn, "%s %s HTTP/1.1\r\nHost: x\r\n%sContent-Length: %d\r\n\r\n0123456789", method, path, extra, n)
	return conn
}

// answeredAndClosed checks that the request on conn is answered with
// status within a second, and its connection closed within a second
// more, without the rest of its body.
func answeredAndClosed(t *testing.T, name string, conn net.Conn, status int) {
	t.Helper()
	start := time.Now()
	_ = conn.SetReadDeadline(start.Add(time.Second))
	line := make([]byte, 12)
	if _, err := io.ReadFull(conn, line); err != nil {
		t.Errorf("%s: no answer within 1s (%v): net/http waits for the body", name, err)
		return
	}
	if want := fmt.Sprintf("HTTP/1.1 %d", status); string(line) != want {
		t.Errorf("%s: answered %q, want %q", name, line, want)
	}
	_ = conn.SetReadDeadline(time.Now().Add(2 * time.Second))
	_, err := io.Copy(io.Discard, conn)
	if err != nil && !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("%s: connection not closed %s after the answer: %v", name, time.Since(start).Round(time.Millisecond), err)
	}
}

// TestEarlyAnswersCloseTheConnection: every answer given before the body
// is read closes the connection, as the refusals of the in-flight bounds
// and of the key's bucket do (unread). Otherwise net/http reads the body
// before it sends the answer, as slowly as the client sends it, up to
// --read-timeout (30 s): a 415 or a 413 on its Content-Length, whose
// in-flight slot is free once the handler returns, and a 404, a 405 or a
// 503 before the keys are loaded, with no key at all, would each keep a
// connection and a goroutine that long, outside every bound.
func TestEarlyAnswersCloseTheConnection(t *testing.T) {
	// No refusal budget: the 413 would spend it, and the requests go at once.
	e := newEnv(t, func(c *Config) { c.MaxBodyBytes = 4096; c.RefusalRate = -1 })
	auth := "Authorization: Bearer " + e.token + "\r\n"
	var wg sync.WaitGroup
	for _, c := range []struct {
		name, method, path, extra string
		n, status                 int
	}{
		{"415, content type", "POST", "/v1/events", auth + "Content-Type: text/plain\r\n", 1000, http.StatusUnsupportedMediaType},
		{"415, charset", "POST", "/api/v1/events", auth + "Content-Type: application/json; charset=latin1\r\n", 1000, http.StatusUnsupportedMediaType},
		{"415, content encoding", "POST", "/v1/events", auth + "Content-Type: application/json\r\nContent-Encoding: gzip\r\n", 1000, http.StatusUnsupportedMediaType},
		{"413, Content-Length", "POST", "/v1/events", auth + "Content-Type: application/json\r\n", 8192, http.StatusRequestEntityTooLarge},
		{"404", "POST", "/api/v1/event", "Content-Type: application/json\r\n", 1000, http.StatusNotFound},
		{"405", "PUT", "/api/v1/events", "Content-Type: application/json\r\n", 1000, http.StatusMethodNotAllowed},
	} {
		conn := slowRequest(t, e.srv.Addr(), c.method, c.path, c.extra, c.n)
		wg.Go(func() { answeredAndClosed(t, c.name, conn, c.status) })
	}
	wg.Wait()
	if n := e.srv.inflight.count(); n != 0 {
		t.Errorf("%d requests in flight", n)
	}

	// A replica whose keys are not loaded yet answers 503.
	var cfg Config
	newEnv(t, func(c *Config) { cfg = *c })
	srv, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.srv.Serve(srv.ln) }() // not Run: the keys are never loaded
	t.Cleanup(func() { _ = srv.srv.Close(); srv.close() })
	answeredAndClosed(t, "503, keys not loaded", slowRequest(t, srv.Addr(), "POST", "/v1/events", auth+"Content-Type: application/json\r\n", 1000),
		http.StatusServiceUnavailable)
}

// TestUnreadableBodyNamesNoAddress: a body that does not arrive within
// --read-timeout, or that breaks off, is answered 400 unreadable-body
// saying why, without the error of the connection's read, which names
// the replica's own address and port ("read tcp 10.0.3.7:8888->…"):
// behind a load balancer, that is the inside of the network.
func TestUnreadableBodyNamesNoAddress(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.ReadTimeout = 500 * time.Millisecond })
	cases := []struct{ name, extra, body, want string }{
		{"timeout", "Content-Length: 100\r\n", "[{", "the body did not arrive within the read timeout (500ms)"},
		{"bad chunk", "Transfer-Encoding: chunked\r\n", "zz\r\n", "reading the body: invalid byte in chunk length"},
	}
	for _, c := range cases {
		conn, err := net.Dial("tcp", e.srv.Addr())
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(conn, "POST /api/v1/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\n%s\r\n%s", e.token, c.extra, c.body)
		_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		b, _ := io.ReadAll(resp.Body)
		conn.Close()
		p := problem(t, b)
		if resp.StatusCode != http.StatusBadRequest || p.Type != "urn:meterline:problem:unreadable-body" || p.Detail != c.want {
			t.Errorf("%s: %d %s, want 400 unreadable-body %q", c.name, resp.StatusCode, b, c.want)
		}
		if host, _, _ := net.SplitHostPort(e.srv.Addr()); strings.Contains(p.Detail, host) {
			t.Errorf("%s: the answer names the replica's address: %s", c.name, p.Detail)
		}
	}
}
