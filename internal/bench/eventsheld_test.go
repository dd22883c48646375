package bench

import (
	"context"
	"testing"
	"time"

	"github.com/meterline/meterline/internal/testenv"
)

// TestEventsHeldWhileViewsDropped counts the events of a database that
// --reuse would take, while another connection creates and drops
// materialized views in it. ClickHouse 18.16 fails a read of
// system.tables that meets a table being dropped, and may then abort: the
// count must read the one table, and never fail.
func TestEventsHeldWhileViewsDropped(t *testing.T) {
	conn, _ := testenv.ClickHouseDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if n, err := eventsHeld(ctx, conn); err != nil || n != 0 {
		t.Fatalf("eventsHeld of an empty database = %d, %v", n, err)
	}
	for _, q := range []string{
		"CREATE TABLE usage_events (a UInt64) ENGINE = MergeTree ORDER BY a",
		"CREATE TABLE usage_target (a UInt64) ENGINE = MergeTree ORDER BY a",
		"INSERT INTO usage_events SELECT number FROM system.numbers LIMIT 3",
	} {
		if err := conn.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	stop := testenv.ChurnViews(t, conn, "usage_events", "usage_target")
	reads, failed := 0, 0
	var first error
	for end := time.Now().Add(6 * time.Second); time.Now().Before(end); reads++ {
		n, err := eventsHeld(ctx, conn)
		if err == nil && n != 3 {
			t.Fatalf("eventsHeld = %d, want 3", n)
		}
		if err != nil {
			failed++
			if first == nil {
				first = err
			}
		}
	}
	ddl := stop()
	t.Logf("%d reads, %d failed, %d view DDLs meanwhile", reads, failed, ddl)
	if failed > 0 {
		t.Errorf("%d of %d counts failed while views were dropped; the first: %v", failed, reads, first)
	}
	if err := conn.Ping(ctx); err != nil {
		t.Fatalf("the server after the reads: %v", err)
	}
}
