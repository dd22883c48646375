package service

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// TestServerBoundsSlowClients: the metrics, health and status server may
// listen on every interface (docs/operations.md, HTTP servers), and a
// client that holds connections open must not hold them for ever: one
// that sends its headers slowly, one that sends a body slowly, one that
// reads the answer slowly and one that keeps an idle keep-alive
// connection are each cut off after a bounded time. Go's server bounds
// none of these unless told (a zero timeout is no timeout; an idle
// connection falls back to ReadTimeout).
func TestServerBoundsSlowClients(t *testing.T) {
	s, err := Listen("127.0.0.1:0", prometheus.NewRegistry(), zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	defer s.ln.Close()
	for _, c := range []struct {
		name string
		d    time.Duration
	}{
		{"ReadHeaderTimeout", s.srv.ReadHeaderTimeout},
		{"ReadTimeout", s.srv.ReadTimeout},
		{"WriteTimeout", s.srv.WriteTimeout},
		{"IdleTimeout", s.srv.IdleTimeout},
	} {
		if c.d <= 0 || c.d > 5*time.Minute {
			t.Errorf("%s = %s, want a bound of at most 5m", c.name, c.d)
		}
	}
}
