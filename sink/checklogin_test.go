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

// A server that takes the connection and drops it during the TLS
// handshake, as ClickHouse may do when it refuses the client certificate,
// is a TLS failure CheckLogin reports, not an unreachable server it waits
// for.
func TestCheckLoginConnectionDroppedDuringTLS(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			_ = c.Close()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s := Server{Addr: l.Addr().String(), TLS: tlsconfig.Files{Enabled: true}}
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
	certs := testenv.NewCerts(t)
	l, err := tls.Listen("tcp", "127.0.0.1:0", certs.ServerTLS(true))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				_ = c.SetDeadline(time.Now().Add(5 * time.Second))
				_ = c.(*tls.Conn).Handshake()
				_ = c.Close()
			}()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s := Server{Addr: l.Addr().String()}
	err = s.CheckLogin(ctx)
	if err == nil {
		t.Fatal("CheckLogin = nil for a plain client at a port that serves only TLS")
	}
	for _, want := range []string{l.Addr().String(), "speaks TLS", "--clickhouse-tls"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not say %q: %v", want, err)
		}
	}
	// Any other server that drops the connection is not said to speak
	// TLS.
	plain, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	go func() {
		for {
			c, err := plain.Accept()
			if err != nil {
				return
			}
			_ = c.Close()
		}
	}()
	if _, err := (Server{Addr: plain.Addr().String()}).open(ctx, "default"); err == nil || strings.Contains(err.Error(), "speaks TLS") {
		t.Errorf("a server that drops every connection: %v, want an error that does not say it speaks TLS", err)
	}
}
