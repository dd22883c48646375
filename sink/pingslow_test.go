package sink

import (
	"context"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// slowPingConn is a ClickHouse connection whose pings are answered after
// delay (only Ping is called).
type slowPingConn struct {
	driver.Conn
	delay time.Duration
}

func (c slowPingConn) Ping(ctx context.Context) error {
	select {
	case <-time.After(c.delay):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// TestSlowPingIsNotDown: with a ping interval shorter than the time a
// loaded ClickHouse takes to answer (100 ms against 300 ms), the health
// check still finds it up: a ping has at least minPingTimeout to be
// answered, whatever the interval.
func TestSlowPingIsNotDown(t *testing.T) {
	w := &Writer{log: zap.NewNop(), m: newMetrics(prometheus.NewRegistry()),
		cfg: Config{ClickHouse: "ch:9000", PingInterval: 100 * time.Millisecond}, conn: slowPingConn{delay: 300 * time.Millisecond}}
	w.up.Store(true)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); w.pingLoop(ctx) }()
	for end := time.Now().Add(1500 * time.Millisecond); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if !w.up.Load() {
			cancel()
			<-done
			t.Fatalf("a ClickHouse answering pings in 300 ms was taken for down: %s", w.lastUp.Load())
		}
	}
	cancel()
	<-done
}
