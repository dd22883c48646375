package testenv

import (
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// Proxy forwards TCP connections to a server, both ways, until cut or
// silenced: a server that goes away (Cut) or stops answering (Silence)
// while its address stays in the client's configuration, then comes back
// (Restore). It closes when the test ends.
type Proxy struct {
	ln   net.Listener
	to   string
	mu   sync.Mutex
	mode proxyMode
	cs   map[net.Conn]bool
	wg   sync.WaitGroup
}

type proxyMode int

const (
	proxyForward proxyMode = iota
	proxyCut               // every connection closed at once
	proxySilent            // new connections held without a byte
)

// NewProxy starts a proxy to the server at to.
func NewProxy(t testing.TB, to string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{ln: ln, to: to, cs: map[net.Conn]bool{}}
	p.wg.Go(p.accept)
	t.Cleanup(p.close)
	return p
}

// Addr is the proxy's address, for the client.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Cut closes every forwarded connection, and from now on each new one at
// once (a server gone: the client's reads end), until Restore.
func (p *Proxy) Cut() { p.set(proxyCut) }

// Silence closes every forwarded connection and from now on holds each
// new one without a byte (a server paused, or its host cut off), until
// Restore.
func (p *Proxy) Silence() { p.set(proxySilent) }

// Restore forwards new connections again.
func (p *Proxy) Restore() { p.set(proxyForward) }

func (p *Proxy) set(m proxyMode) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.mode = m
	if m != proxyForward {
		for c := range p.cs {
			c.Close()
		}
	}
}

func (p *Proxy) close() {
	p.ln.Close()
	p.Cut()
	p.wg.Wait()
}

func (p *Proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.wg.Go(func() { p.forward(c) })
	}
}

// forward copies between c and a new connection to the server, both
// ways, until either ends or the proxy is cut or silenced.
func (p *Proxy) forward(c net.Conn) {
	defer c.Close()
	mode, ok := p.track(c)
	if !ok {
		return
	}
	defer p.untrack(c)
	if mode == proxySilent {
		_, _ = io.Copy(io.Discard, c) // until the client or the proxy closes it
		return
	}
	b, err := net.DialTimeout("tcp", p.to, 5*time.Second)
	if err != nil {
		return
	}
	defer b.Close()
	m, ok := p.track(b)
	if !ok {
		return
	}
	defer p.untrack(b)
	if m != proxyForward { // silenced meanwhile
		return
	}
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(b, c); done <- struct{}{} }()
	go func() { _, _ = io.Copy(c, b); done <- struct{}{} }()
	<-done
	c.Close()
	b.Close()
	<-done
}

// track registers c unless the proxy is cut; it returns the mode c
// was taken in.
func (p *Proxy) track(c net.Conn) (proxyMode, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.mode == proxyCut {
		return p.mode, false
	}
	p.cs[c] = true
	return p.mode, true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.cs, c)
}
