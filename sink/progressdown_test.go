package sink

import (
	"context"
	"net"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// progressDown is a ClickHouse connection whose writes of sink_progress
// fail as on a server that went away while down is set.
type progressDown struct {
	driver.Conn
	down atomic.Bool
}

func (c *progressDown) PrepareBatch(ctx context.Context, q string, opts ...driver.PrepareBatchOption) (driver.Batch, error) {
	if c.down.Load() && strings.Contains(q, ProgressTable) {
		return nil, &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}
	}
	return c.Conn.PrepareBatch(ctx, q, opts...)
}

// TestProgressOutageLoggedAsOutage: ClickHouse going away first met by a
// window's progress (sink_progress), not by an INSERT of rows, is the same
// outage to an SRE: the same warning ("clickhouse unavailable: pausing
// fetching and backing off"), naming sink_progress, counted in
// meterline_sink_insert_errors_total as unavailable.
func TestProgressOutageLoggedAsOutage(t *testing.T) {
	e := newEnv(t, 1)
	topic := e.names.DedupedTopic()
	e.produce(deduped(topic, 0, 0, base))
	core, logs := observer.New(zapcore.InfoLevel)
	conn := &progressDown{Conn: e.conn}
	r := e.start(func(c *Config) { c.Logger = zap.New(core); c.Conn = conn })
	e.waitCaughtUp(time.Minute, topic)
	conn.down.Store(true)
	e.produce(watermark(topic, 0, base.Add(time.Second)))
	for deadline := time.Now().Add(30 * time.Second); metric(t, r.reg, "meterline_sink_blocked") != 1; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("not blocked while sink_progress could not be written")
		}
	}
	warned := logs.FilterMessageSnippet("clickhouse unavailable: pausing fetching and backing off").FilterField(zap.String("table", ProgressTable))
	if warned.Len() != 1 {
		t.Errorf("%d warnings of the outage naming %s, want 1", warned.Len(), ProgressTable)
	}
	if n := metric(t, r.reg, "meterline_sink_insert_errors_total", "table", ProgressTable, "kind", errUnavailable); n < 1 {
		t.Errorf("meterline_sink_insert_errors_total{table=%q,kind=%q} = %v, want at least 1", ProgressTable, errUnavailable, n)
	}
	conn.down.Store(false)
	for deadline := time.Now().Add(30 * time.Second); metric(t, r.reg, "meterline_sink_blocked") != 0; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("still blocked after sink_progress takes rows again")
		}
	}
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	e.exact(TableEvents, 1)
}
