package sink

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
)

// zoneRestart is a ClickHouse connection on a server that goes away
// (INSERTs into usage_events fail as on a closed connection while down)
// and comes back in zone (the time zones it answers once zone is set).
type zoneRestart struct {
	driver.Conn
	down atomic.Bool
	zone atomic.Value // string
}

func (c *zoneRestart) PrepareBatch(ctx context.Context, q string, opts ...driver.PrepareBatchOption) (driver.Batch, error) {
	if c.down.Load() && strings.Contains(q, TableEvents) {
		return nil, &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}
	}
	return c.Conn.PrepareBatch(ctx, q, opts...)
}

func (c *zoneRestart) QueryRow(ctx context.Context, q string, args ...any) driver.Row {
	if z, _ := c.zone.Load().(string); z != "" && (q == timeZonesSQL(true) || q == timeZonesSQL(false)) {
		return zoneRow{z}
	}
	return c.Conn.QueryRow(ctx, q, args...)
}

// zoneRow answers the time zone query with zone as the server's and the
// session's.
type zoneRow struct{ zone string }

func (r zoneRow) Err() error { return nil }
func (r zoneRow) Scan(dest ...any) error {
	for _, d := range dest {
		p, ok := d.(*string)
		if !ok {
			return fmt.Errorf("zoneRow: scan into %T", d)
		}
		*p = r.zone
	}
	return nil
}
func (r zoneRow) ScanStruct(any) error { return errors.New("zoneRow: no struct") }

// TestServerBackInAnotherZone: ClickHouse goes away under a running sink
// and comes back in another time zone (its config changed across the
// restart): the sink writes none of the rows it holds, whose days and
// months the views would compute in that zone, and stops with
// ErrServerTimeZone, as it refuses such a server at start.
func TestServerBackInAnotherZone(t *testing.T) {
	e := newEnv(t, 1)
	topic := e.names.DedupedTopic()
	e.produce(deduped(topic, 0, 0, base))
	conn := &zoneRestart{Conn: e.conn}
	r := e.start(func(c *Config) { c.Conn = conn })
	e.waitCaughtUp(time.Minute, topic)
	e.exact(TableEvents, 1)

	conn.down.Store(true)
	conn.zone.Store("Europe/Berlin")
	e.produce(deduped(topic, 0, 1, base.Add(time.Second)))
	for deadline := time.Now().Add(30 * time.Second); metric(t, r.reg, "meterline_sink_blocked") != 1; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("not blocked while usage_events could not be written")
		}
	}
	conn.down.Store(false)
	select {
	case <-r.exited:
	case <-time.After(30 * time.Second):
		t.Fatal("the sink still runs 30 s after the server came back in Europe/Berlin")
	}
	if !errors.Is(r.err, ErrServerTimeZone) {
		t.Fatalf("the sink stopped with %v, want ErrServerTimeZone", r.err)
	}
	e.exact(TableEvents, 1)
	if c := e.committed(topic); c[0] > 1 {
		t.Fatalf("offsets committed past the row not written: %v", c)
	}
}
