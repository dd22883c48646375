package demo

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/meterline/meterline/internal/testenv"
)

// TestDemoTablesWhileViewsDropped tells the demo's database, and lists a
// database that is not the demo's, while another connection creates and
// drops materialized views in it (another demo run migrating the same
// database). ClickHouse 18.16 fails a read of system.tables that meets a
// table being dropped, and may then abort: neither may fail.
func TestDemoTablesWhileViewsDropped(t *testing.T) {
	for _, mark := range []bool{true, false} {
		conn, db := testenv.ClickHouseDB(t)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		stmts := []string{
			"CREATE TABLE usage_events (a UInt64) ENGINE = MergeTree ORDER BY a",
			"CREATE TABLE usage_target (a UInt64) ENGINE = MergeTree ORDER BY a",
		}
		if mark {
			stmts = append(stmts, "CREATE TABLE "+demoMarker+" (created DateTime) ENGINE = TinyLog")
		}
		for _, q := range stmts {
			if err := conn.Exec(ctx, q); err != nil {
				t.Fatal(err)
			}
		}
		reads, failed, ddl, first := readWhileChurned(t, ctx, conn, db, mark)
		t.Logf("marked %v: %d reads, %d failed, %d view DDLs meanwhile", mark, reads, failed, ddl)
		if failed > 0 {
			t.Errorf("marked %v: %d of %d reads of the demo database's tables failed while views were dropped; the first: %v", mark, failed, reads, first)
		}
		if err := conn.Ping(ctx); err != nil {
			t.Fatalf("the server after the reads: %v", err)
		}
	}
}

func readWhileChurned(t *testing.T, ctx context.Context, conn driver.Conn, db string, mark bool) (reads, failed, ddl int, first error) {
	stop := testenv.ChurnViews(t, conn, "usage_events", "usage_target")
	for end := time.Now().Add(4 * time.Second); time.Now().Before(end); reads++ {
		tables, marked, err := demoTables(ctx, conn, db)
		if err == nil && (marked != mark || !mark && !slices.Contains(tables, "usage_events")) {
			err = fmt.Errorf("demoTables = %v, %v", tables, marked)
		}
		if err != nil {
			failed++
			if first == nil {
				first = err
			}
		}
	}
	return reads, failed, stop(), first
}
