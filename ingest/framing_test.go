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
