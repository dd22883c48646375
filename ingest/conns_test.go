package ingest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// rawConn is a client's HTTP/1.1 connection, written by hand.
type rawConn struct {
	net.Conn
	r *bufio.Reader
}

func dialRaw(t *testing.T, addr string) *rawConn {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	return &rawConn{nc, bufio.NewReader(nc)}
}

// emptyBatch is the body that costs a key nothing: answered 204.
const emptyBatch = "[          ]"

// send writes the headers of a batch of body on the OpenMeter path and
// the first n bytes of body.
func (c *rawConn) send(t *testing.T, token string, n int) {
	t.Helper()
	if _, err := fmt.Fprintf(c, "POST /api/v1/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/cloudevents-batch+json\r\nContent-Length: %d\r\n\r\n%s",
		token, len(emptyBatch), emptyBatch[:n]); err != nil {
		t.Fatal(err)
	}
}

// status reads an answer within 2 s and returns its status code.
func (c *rawConn) status(t *testing.T, name string) int {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
	resp, err := http.ReadResponse(c.r, nil)
	if err != nil {
		t.Fatalf("%s: no answer: %v", name, err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// closedBy reports whether the server closed the connection within d
// (without writing anything).
func (c *rawConn) closedBy(t *testing.T, d time.Duration) bool {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(d))
	b, err := c.r.ReadByte()
	if err == nil {
		t.Fatalf("unexpected byte %q from the server", b)
	}
	var ne net.Error
	return !errors.As(err, &ne) || !ne.Timeout()
}

// waitSpare waits until the server holds n connections without a
// request in flight.
func waitSpare(t *testing.T, s *Server, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		s.conns.mu.Lock()
		got := s.conns.spare.Len()
		s.conns.mu.Unlock()
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d connections without a request in flight, want %d", got, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// metricValue is the value of the series of name in reg whose labels
// end in value ("": the one series of a metric without labels).
func metricValue(t *testing.T, reg *prometheus.Registry, name, value string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			if mf.GetName() != name || value != "" && m.GetLabel()[len(m.GetLabel())-1].GetValue() != value {
				continue
			}
			if m.GetCounter() != nil {
				return m.GetCounter().GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	t.Fatalf("no series %s %q", name, value)
	return 0
}

// shed is meterline_ingest_connections_shed_total{state}.
func shed(t *testing.T, reg *prometheus.Registry, state string) float64 {
	t.Helper()
	return metricValue(t, reg, "meterline_ingest_connections_shed_total", state)
}

// TestIdleConnectionsCapped: a client that holds keep-alive connections
// idle after the empty batch (which costs its key nothing), or opens
// connections and sends nothing, holds a file descriptor each until
// --idle-timeout (120 s) or --read-header-timeout: without a bound on
// connections, one client takes every descriptor of the process, and
// then every tenant's new connections, and the ingest's own Kafka
// client's, fail. With --max-connections, a new connection past the bound
// closes the one that waited the longest without a request, and is
// served; the open connections never pass the bound.
func TestIdleConnectionsCapped(t *testing.T) {
	const max, extra = 4, 6
	reg := prometheus.NewRegistry()
	e := newEnv(t, func(c *Config) { c.MaxConnections = max; c.Registerer = reg })
	addr := e.srv.Addr()
	var cs []*rawConn
	for i := range max + extra {
		c := dialRaw(t, addr)
		c.send(t, e.token, len(emptyBatch))
		if got := c.status(t, fmt.Sprintf("connection %d", i)); got != http.StatusNoContent {
			t.Fatalf("connection %d: the empty batch answered %d, want 204", i, got)
		}
		cs = append(cs, c)
		waitSpare(t, e.srv, min(i+1, max))
		if n := e.srv.conns.count(); n > max {
			t.Fatalf("%d connections open, want at most %d", n, max)
		}
	}
	for i, c := range cs {
		if closed := c.closedBy(t, 50*time.Millisecond); closed != (i < extra) {
			t.Errorf("idle connection %d of %d (the oldest first): closed %v, want %v", i, len(cs), closed, i < extra)
		}
	}
	if got := metricValue(t, reg, "meterline_ingest_open_connections", ""); got != max {
		t.Errorf("meterline_ingest_open_connections %v, want %d", got, max)
	}
	if got := shed(t, reg, shedIdle); got != extra {
		t.Errorf("shed idle %v, want %d", got, extra)
	}

	// Connections that send nothing take the place of the idle ones,
	// then of each other, the oldest first; a client that sends is
	// served all along.
	var silent []*rawConn
	for range max + 2 {
		silent = append(silent, dialRaw(t, addr))
		waitSpare(t, e.srv, max)
	}
	c := dialRaw(t, addr)
	c.send(t, e.token, len(emptyBatch))
	if got := c.status(t, "after the silent connections"); got != http.StatusNoContent {
		t.Errorf("a client among silent connections: %d, want 204", got)
	}
	for i, c := range cs[extra:] {
		if !c.closedBy(t, time.Second) {
			t.Errorf("idle connection %d not closed for the silent ones", extra+i)
		}
	}
	for i, s := range silent {
		if closed := s.closedBy(t, 50*time.Millisecond); closed != (i < 3) {
			t.Errorf("silent connection %d: closed %v, want %v", i, closed, i < 3)
		}
	}
	if got := shed(t, reg, shedUnused); got != 3 {
		t.Errorf("shed unused %v, want 3", got)
	}
}

// TestInFlightConnectionsNeverClosed: a connection with a request in
// flight is never closed by --max-connections: when every open one has
// one, the new connection is closed at once, unanswered, and each
// request in flight is answered once its body is in.
func TestInFlightConnectionsNeverClosed(t *testing.T) {
	const max = 4
	reg := prometheus.NewRegistry()
	e := newEnv(t, func(c *Config) { c.MaxConnections = max; c.Registerer = reg })
	addr := e.srv.Addr()
	var busy []*rawConn
	for range max {
		c := dialRaw(t, addr)
		c.send(t, e.token, 4) // the body's first bytes; the rest later
		busy = append(busy, c)
	}
	deadline := time.Now().Add(5 * time.Second)
	for e.srv.inflight.count() < max {
		if time.Now().After(deadline) {
			t.Fatalf("%d requests in flight, want %d", e.srv.inflight.count(), max)
		}
		time.Sleep(5 * time.Millisecond)
	}
	for i := range 3 {
		c := dialRaw(t, addr)
		if !c.closedBy(t, time.Second) {
			t.Fatalf("new connection %d not closed at once, with %d requests in flight on %d connections", i, max, max)
		}
	}
	if got := shed(t, reg, shedIncoming); got != 3 {
		t.Errorf("shed incoming %v, want 3", got)
	}
	for i, c := range busy {
		if _, err := io.WriteString(c, emptyBatch[4:]); err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		if got := c.status(t, fmt.Sprintf("request %d", i)); got != http.StatusNoContent {
			t.Errorf("request %d in flight: %d, want 204", i, got)
		}
		// The server counts the connection idle a moment after the
		// client has its answer: wait for it, so that the connections
		// go idle in order (the next answer could otherwise be counted
		// first).
		waitSpare(t, e.srv, i+1)
	}
	if n := shed(t, reg, shedIdle) + shed(t, reg, shedUnused); n != 0 {
		t.Errorf("%v connections shed while requests were in flight", n)
	}
	// Now idle: a new connection takes the place of the oldest.
	waitSpare(t, e.srv, max)
	c := dialRaw(t, addr)
	c.send(t, e.token, len(emptyBatch))
	if got := c.status(t, "after the requests"); got != http.StatusNoContent {
		t.Errorf("a new client once the requests were answered: %d, want 204", got)
	}
	if !busy[0].closedBy(t, time.Second) {
		t.Error("the connection idle the longest was not closed")
	}
}

// TestDefaultMaxConnections: half the open-file limit, leaving the other
// half to the Kafka clients and files, at most the ceiling.
func TestDefaultMaxConnections(t *testing.T) {
	for nofile, want := range map[uint64]int{1024: 512, 4096: 2048, 8192: 4096, 65536: 4096, 1 << 20: 4096, 0: 4096, 20: 16} {
		if got := defaultMaxConnections(nofile); got != want {
			t.Errorf("open-file limit %d: %d connections, want %d", nofile, got, want)
		}
	}
}

// TestGuardServesNoRequestOfAClosedConnection: a request read from a
// connection just as the bound closed it (it counted as idle) is not
// served: its answer could not reach the client, and its events are not
// written.
func TestGuardServesNoRequestOfAClosedConnection(t *testing.T) {
	c := newConns(1, zap.NewNop())
	a, b := net.Pipe()
	defer b.Close()
	if !c.admit(a) {
		t.Fatal("first connection refused")
	}
	ctx := c.connContext(context.Background(), a)
	c2, d := net.Pipe()
	defer d.Close()
	if !c.admit(c2) { // a, unused, makes room
		t.Fatal("second connection refused")
	}
	served := false
	h := guard(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { served = true }))
	func() {
		defer func() {
			if r := recover(); r != http.ErrAbortHandler {
				t.Errorf("recovered %v, want http.ErrAbortHandler", r)
			}
		}()
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequestWithContext(ctx, http.MethodPost, "/v1/events", nil))
	}()
	if served {
		t.Error("a request of a connection closed by the bound was served")
	}
	h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequestWithContext(c.connContext(context.Background(), c2), http.MethodPost, "/v1/events", nil))
	if !served {
		t.Error("a request of an open connection was not served")
	}
}
