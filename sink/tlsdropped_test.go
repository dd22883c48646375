package sink

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/internal/tlsconfig"
)

// droppingTLSServer serves TLS on a local port and closes each connection
// once its handshake is done, as a server that refuses the client's
// certificate may under TLS 1.3 (the client's handshake has ended by
// then: it reads EOF or a reset at its hello).
func droppingTLSServer(t *testing.T, c *testenv.Certs) string {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", c.ServerTLS(false))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
				_ = conn.(*tls.Conn).Handshake()
				if tc, ok := conn.(*tls.Conn).NetConn().(*net.TCPConn); ok {
					_ = tc.SetLinger(0) // a reset, as ClickHouse's
				}
				_ = conn.Close()
			}()
		}
	}()
	return ln.Addr().String()
}

// TestTLSDroppedAtHelloNamesTLS: a server that takes the TLS handshake and
// then closes the connection (a client certificate refused under TLS 1.3)
// is reported as a failed TLS handshake naming the likely causes, not as
// a server that does not answer.
func TestTLSDroppedAtHelloNamesTLS(t *testing.T) {
	c := testenv.NewCerts(t)
	s := Server{Addr: droppingTLSServer(t, c), TLS: tlsconfig.Files{Enabled: true, CAFile: c.CAFile, ServerName: "localhost"}}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := s.open(ctx, "default")
	if err == nil {
		t.Fatal("open succeeded against a server that closes every connection")
	}
	if !strings.Contains(err.Error(), "TLS handshake failed (CA, client certificate or server name?)") {
		t.Errorf("open: %v; want it to name the TLS handshake and its likely causes", err)
	}
	if err := s.CheckLogin(ctx); err == nil || strings.Count(err.Error(), "client certificate") != 1 {
		t.Errorf("CheckLogin: %v; want the TLS failure", err)
	}
}

// TestConnectStopsWhenTLSSessionsDropped: a sink whose every TLS session
// the server closes at the hello stops, as at a refused handshake, after
// droppedTLSLimit of them, instead of retrying for ever as for a server
// that does not answer.
func TestConnectStopsWhenTLSSessionsDropped(t *testing.T) {
	c := testenv.NewCerts(t)
	s := Server{Addr: droppingTLSServer(t, c), TLS: tlsconfig.Files{Enabled: true, CAFile: c.CAFile, ServerName: "localhost"}}
	if err := connectWith(t, s); !errors.Is(err, errTLSDropped) {
		t.Errorf("connect: %v; want the TLS sessions closed at the hello", err)
	}
}
