package sink

import (
	"context"
	"net"
	"testing"
	"time"

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
