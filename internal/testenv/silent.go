package testenv

import (
	"net"
	"sync"
	"testing"
)

// SilentBroker returns the address of a listener that accepts connections
// and never answers, as a broker whose process is paused or whose host is
// cut off does once the cluster has fenced it: it stays in every client's
// seed list. It closes when the test ends.
func SilentBroker(t testing.TB) string { return fakeBroker(t, false) }

// ClosingBroker returns the address of a listener that closes every
// connection it accepts at once, as a broker shutting down does, or a
// proxy before a broker that is down. It closes when the test ends.
func ClosingBroker(t testing.TB) string { return fakeBroker(t, true) }

// fakeBroker returns the address of a listener that accepts connections
// and never answers: it closes each at once when closing, else when the
// test ends, as it does itself.
func fakeBroker(t testing.TB, closing bool) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if closing {
				c.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
		for _, c := range conns {
			c.Close()
		}
	})
	return ln.Addr().String()
}
