package sink

import (
	"context"
	"crypto/tls"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/internal/tlsconfig"
)

// serveEach accepts l's connections until it is closed, closed when the
// test ends, and hands each to serve.
func serveEach(t *testing.T, l net.Listener, serve func(net.Conn)) string {
	t.Helper()
	t.Cleanup(func() { _ = l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go serve(c)
		}
	}()
	return l.Addr().String()
}

// droppingServer is the address of a server that closes every
// connection at once.
func droppingServer(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return serveEach(t, l, func(c net.Conn) { _ = c.Close() })
}

// tlsOnlyServer is the address of a server that speaks only TLS (a
// client certificate required) and closes a connection after its
// handshake, as ClickHouse's tcp_port_secure drops a plain client's.
func tlsOnlyServer(t *testing.T) string {
	l, err := tls.Listen("tcp", "127.0.0.1:0", testenv.NewCerts(t).ServerTLS(true))
	if err != nil {
		t.Fatal(err)
	}
	return serveEach(t, l, func(c net.Conn) {
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		_ = c.(*tls.Conn).Handshake()
		_ = c.Close()
	})
}

// A server that takes the connection and drops it during the TLS
// handshake, as ClickHouse may do when it refuses the client certificate,
// is a TLS failure CheckLogin reports, not an unreachable server it waits
// for.
func TestCheckLoginConnectionDroppedDuringTLS(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s := Server{Addr: droppingServer(t), TLS: tlsconfig.Files{Enabled: true}}
	if err := s.CheckLogin(ctx); err == nil {
		t.Fatal("CheckLogin = nil for a server that drops every TLS session")
	} else {
		t.Log(err)
	}
}

// A client without TLS at a port that serves only TLS (ClickHouse's
// tcp_port_secure) is refused at start with an error that says the server
// speaks TLS, not taken for an unreachable server and waited for: the
// server drops the connection without a ClickHouse answer, as ClickHouse
// does when its TLS port gets a plain hello.
func TestCheckLoginPlainClientAtTLSPort(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	addr := tlsOnlyServer(t)
	err := Server{Addr: addr}.CheckLogin(ctx)
	if err == nil {
		t.Fatal("CheckLogin = nil for a plain client at a port that serves only TLS")
	}
	for _, want := range []string{addr, "speaks TLS", "--clickhouse-tls"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not say %q: %v", want, err)
		}
	}
	// Any other server that drops the connection is not said to speak
	// TLS.
	if _, err := (Server{Addr: droppingServer(t)}).open(ctx, "default"); err == nil || strings.Contains(err.Error(), "speaks TLS") {
		t.Errorf("a server that drops every connection: %v, want an error that does not say it speaks TLS", err)
	}
}
