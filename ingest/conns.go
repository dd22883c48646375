package ingest

import (
	"container/list"
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
)

// The states of the connections the cap closes (conns.admit), the label
// of meterline_ingest_connections_shed_total.
const (
	shedIdle     = "idle"     // a keep-alive connection between requests
	shedUnused   = "unused"   // open, but no request read from it yet
	shedIncoming = "incoming" // the new connection: every open one had a request in flight
)

// conns bounds the connections open at once (Config.MaxConnections). A
// request in flight is bounded (inflight), but a connection is not by
// itself: a client with a key sends the empty batch "[]" (answered 204,
// nothing taken from its bucket) and keeps the connection idle for
// IdleTimeout, and one without a key opens connections and sends
// nothing; each holds a file descriptor, a goroutine and about 16 KB. At
// the process's open-file limit new connections fail for every tenant,
// and the ingest's own Kafka client cannot dial.
//
// The states come from http.Server.ConnState; the bound is applied where
// connections are accepted (capListener), before net/http serves them,
// so that a connection closed at once costs no goroutine, no TLS
// handshake and no log line of the HTTP server. A connection past the
// bound makes room: the one that has waited the longest without a
// request in flight (idle between requests, or not having sent one yet)
// is closed, as HTTP/1.1 lets a server close an idle connection at any
// time; when every open connection has a request in flight, the new one
// is closed at once. A connection with a request in flight is never
// closed: it leaves spare under mu (StateActive) before its handler
// runs, and a request read on a connection closed meanwhile is not
// served (guard).
type conns struct {
	max int // <= 0: no bound (the connections are still counted)
	mu  sync.Mutex
	// open are the connections admitted and not closed; spare those of
	// them without a request in flight, the longest waiting first.
	open  map[net.Conn]*connEntry
	spare list.List
	// shed counts the connections closed by the bound, by state (a
	// shed* constant); it may be nil.
	shed func(state string)
	// malformed counts a request net/http refused itself (connState); it
	// may be nil. stopping is set once the server shuts down, whose
	// connections net/http closes without serving what they read.
	malformed func()
	stopping  atomic.Bool
	log       *zap.Logger
	// logs bounds the lines: a client can cause one a connection.
	logs *logBound
}

// connEntry is an open connection.
type connEntry struct {
	conn  net.Conn
	state string        // shedUnused or shedIdle while in spare
	since time.Time     // when it entered spare
	elem  *list.Element // in spare; nil while a request is in flight
	// closed is set, under conns.mu, when the bound closed the
	// connection: a request read from it is not served.
	closed atomic.Bool
	// talking is set (under conns.mu) once the connection carries HTTP:
	// bytes of a request were read, or it went idle after an answer (a
	// pipelined request is read from what is buffered). served is set
	// once a request reaches the handler (guard), cleared when the
	// connection goes idle. watch is the TCP connection under it (nil in
	// tests that serve other listeners).
	talking bool
	served  atomic.Bool
	watch   *watchConn
}

func newConns(max int, log *zap.Logger) *conns {
	return &conns{max: max, open: map[net.Conn]*connEntry{}, log: log, logs: newLogBound()}
}

// admit registers nc, just accepted, making room for it when max are
// open, and reports whether it may be served; a connection refused is
// closed.
func (c *conns) admit(nc net.Conn) bool {
	now := time.Now()
	var victim *connEntry
	c.mu.Lock()
	if c.max > 0 && len(c.open) >= c.max {
		if front := c.spare.Front(); front != nil {
			victim = front.Value.(*connEntry)
			c.forget(victim)
			victim.closed.Store(true)
		}
	}
	admitted := c.max <= 0 || len(c.open) < c.max
	if admitted {
		e := &connEntry{conn: nc, state: shedUnused, since: now, watch: watchOf(nc)}
		e.elem = c.spare.PushBack(e)
		c.open[nc] = e
	}
	open := len(c.open)
	c.mu.Unlock()
	// Counted before the close, so that the metric has every connection
	// a client has seen closed.
	if victim != nil {
		c.countShed(victim.state)
		closeConn(victim.conn)
		c.logShed(victim.state, victim.conn, open, now.Sub(victim.since))
	}
	if !admitted {
		c.countShed(shedIncoming)
		closeConn(nc)
		c.logShed(shedIncoming, nc, open, 0)
	}
	return admitted
}

// forget drops e from open and spare. c.mu is held.
func (c *conns) forget(e *connEntry) {
	if e.elem != nil {
		c.spare.Remove(e.elem)
		e.elem = nil
	}
	delete(c.open, e.conn)
}

// closeConn closes nc at once: the TCP connection under a TLS one, so
// that no close_notify alert is written (which could wait on a client
// that does not read).
func closeConn(nc net.Conn) {
	if tc, ok := nc.(*tls.Conn); ok {
		nc = tc.NetConn()
	}
	_ = nc.Close()
}

// countShed counts a connection the bound closes.
func (c *conns) countShed(state string) {
	if c.shed != nil {
		c.shed(state)
	}
}

// logShed logs a connection closed by the bound.
func (c *conns) logShed(state string, nc net.Conn, open int, waited time.Duration) {
	fs, ok := c.logs.allow()
	if !ok {
		return
	}
	fs = append(fs, zap.Int("max_connections", c.max), zap.Int("open", open), zap.String("state", state), zap.String("remote", nc.RemoteAddr().String()))
	if state == shedIncoming {
		c.log.Warn("ingest: connection limit reached and every connection has a request in flight: closed the new connection (--max-connections)", fs...)
		return
	}
	c.log.Warn("ingest: connection limit reached: closed the connection that waited the longest without a request (--max-connections)",
		append(fs, zap.Duration("waited", waited.Round(time.Millisecond)))...)
}

// connState is the http.Server's ConnState hook.
//
// It also counts the requests net/http refuses itself, which never reach
// the handler: a request line or header it cannot parse (a control byte
// in a header, a line that is not HTTP), headers over MaxHeaderBytes, a
// version or transfer coding it does not take. net/http answers them
// 400, 431, 501 or 505 on the connection and closes it, and reports them
// nowhere. A connection closed after bytes of a request were read
// (StateActive) or after it went idle, before a request reached the
// handler since, had a request refused so when net/http wrote to it
// meanwhile (under TLS, more than the
// close_notify alert of its close), no read from its TCP connection
// failed (the client left mid-headers, or --read-header-timeout passed:
// net/http answers nothing) and the server is not shutting down. (A TLS
// client that closes with a close_notify mid-headers is answered 400 and
// counted: its leaving is seen by crypto/tls, not on the TCP connection.)
func (c *conns) connState(nc net.Conn, st http.ConnState) {
	refused := false
	c.mu.Lock()
	if e := c.open[nc]; e != nil { // nil: closed by the bound
		switch st {
		case http.StateActive:
			// A request is read: from here to its answer the connection is
			// never closed by the bound.
			if e.elem != nil {
				c.spare.Remove(e.elem)
				e.elem = nil
			}
			e.talking = true
		case http.StateIdle:
			if e.elem == nil {
				e.state, e.since = shedIdle, time.Now()
				e.elem = c.spare.PushBack(e)
			}
			// net/http ends the read it kept pending during the answer
			// with a deadline: that failed read is no client's.
			e.talking = true
			e.served.Store(false)
			if e.watch != nil {
				e.watch.readFailed.Store(false)
				e.watch.writes.Store(0)
			}
		case http.StateClosed, http.StateHijacked:
			refused = st == http.StateClosed && e.talking && !e.served.Load() && e.watch != nil &&
				e.watch.answered(nc) && !c.stopping.Load()
			c.forget(e)
		}
	}
	c.mu.Unlock()
	if refused && c.malformed != nil {
		c.malformed()
	}
}

// count is the connections open.
func (c *conns) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.open)
}

// connKey is the context key of a connection's entry (connContext).
type connKey struct{}

// connContext is the http.Server's ConnContext: it hands the connection's
// entry to guard.
func (c *conns) connContext(ctx context.Context, nc net.Conn) context.Context {
	c.mu.Lock()
	e := c.open[nc]
	c.mu.Unlock()
	if e == nil {
		return ctx
	}
	return context.WithValue(ctx, connKey{}, e)
}

// guard serves no request of a connection the bound closed: one whose
// request was read just as the connection was closed, while it still
// counted as idle. Its answer could not reach the client, which sees its
// connection closed, as with any idle connection closed by a server; it
// is not served, so that none of its events is written.
func guard(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if e, _ := r.Context().Value(connKey{}).(*connEntry); e != nil {
			e.served.Store(true)
			if e.closed.Load() {
				panic(http.ErrAbortHandler)
			}
		}
		next.ServeHTTP(w, r)
	})
}

// capListener applies the bound of conns to the connections it accepts.
type capListener struct {
	net.Listener
	conns *conns
}

func (l capListener) Accept() (net.Conn, error) {
	for {
		nc, err := l.Listener.Accept()
		if err != nil || l.conns.admit(nc) {
			return nc, err
		}
	}
}

// problemMalformedRequest is the problem label of the requests net/http
// refuses itself, before the handler (conns.malformed).
const problemMalformedRequest = "malformed-request"

// watchListener wraps the TCP connections it accepts in watchConn, under
// TLS when the server speaks it.
type watchListener struct{ net.Listener }

func (l watchListener) Accept() (net.Conn, error) {
	nc, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &watchConn{Conn: nc}, nil
}

// watchConn notes whether a read from the client failed (connState): the
// client closed the connection, or a deadline passed; and the writes to
// it. Both are cleared when the connection goes idle.
type watchConn struct {
	net.Conn
	readFailed atomic.Bool
	writes     atomic.Int32
}

func (w *watchConn) Write(p []byte) (int, error) {
	n, err := w.Conn.Write(p)
	if n > 0 {
		w.writes.Add(1)
	}
	return n, err
}

// answered reports whether net/http answered the request read from nc
// (the connection over w) itself: something was written, more than the
// close_notify alert a TLS connection writes as it is closed, and no
// read from the client failed.
func (w *watchConn) answered(nc net.Conn) bool {
	least := int32(1)
	if _, ok := nc.(*tls.Conn); ok {
		least = 2
	}
	return !w.readFailed.Load() && w.writes.Load() >= least
}

func (w *watchConn) Read(p []byte) (int, error) {
	n, err := w.Conn.Read(p)
	if err != nil {
		w.readFailed.Store(true)
	}
	return n, err
}

// CloseWrite half-closes the TCP connection, as net/http does after a 431
// (and crypto/tls under a TLS connection's CloseWrite).
func (w *watchConn) CloseWrite() error {
	if cw, ok := w.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// watchOf is the watchConn under nc, a connection capListener accepted;
// nil when there is none.
func watchOf(nc net.Conn) *watchConn {
	if tc, ok := nc.(*tls.Conn); ok {
		nc = tc.NetConn()
	}
	w, _ := nc.(*watchConn)
	return w
}
