package testenv

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
)

// TestClickHouseDriverAndFeatures checks, on the real server, what the sink
// and its migrations rely on: a throwaway database per test, native batch
// inserts with an explicit column list (clickhouse-go v2.51 against the
// Debian 18.16 server), ReplacingMergeTree(version) with PARTITION BY and
// ORDER BY, argMax, and read_rows in system.query_log.
func TestClickHouseDriverAndFeatures(t *testing.T) {
	conn, db := ClickHouseDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ddl := `CREATE TABLE ` + db + `.revisions (
		k String, revision UInt64, value Int64, ts DateTime, topic_partition Int32, topic_offset Int64
	) ENGINE = ReplacingMergeTree(revision) PARTITION BY toYYYYMM(ts) ORDER BY (k, revision)`
	if err := conn.Exec(ctx, ddl); err != nil {
		t.Fatal(err)
	}
	batch, err := conn.PrepareBatch(ctx, "INSERT INTO "+db+".revisions (k, revision, value, ts, topic_partition, topic_offset)")
	if err != nil {
		t.Fatal(err)
	}
	jan := time.Date(2026, 1, 15, 0, 0, 0, 0, time.UTC)
	feb := time.Date(2026, 2, 15, 0, 0, 0, 0, time.UTC)
	rows := []struct {
		k   string
		rev uint64
		v   int64
		ts  time.Time
	}{{"a", 1, 10, jan}, {"a", 2, 15, jan}, {"b", 1, 7, feb}, {"a", 3, 30, feb}}
	for i, r := range rows {
		if err := batch.Append(r.k, r.rev, r.v, r.ts, int32(0), int64(i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := batch.Send(); err != nil {
		t.Fatal(err)
	}
	var n uint64
	if err := conn.QueryRow(ctx, "SELECT count() FROM "+db+".revisions").Scan(&n); err != nil || n != 4 {
		t.Fatalf("count = %d, %v; want 4 (every revision kept)", n, err)
	}
	var latest int64
	if err := conn.QueryRow(ctx, "SELECT argMax(value, revision) FROM "+db+".revisions WHERE k = 'a'").Scan(&latest); err != nil || latest != 30 {
		t.Fatalf("argMax = %d, %v; want 30", latest, err)
	}
	var parts uint64
	if err := conn.QueryRow(ctx, "SELECT count() FROM system.parts WHERE database = '"+db+"' AND table = 'revisions' AND active").Scan(&parts); err != nil || parts != 2 {
		t.Fatalf("active parts = %d, %v; one INSERT of two months makes 2 parts", parts, err)
	}
	// The server logs a query's finish just after answering it, so poll.
	var readRows uint64
	q := "SELECT read_rows FROM system.query_log WHERE type = 2 AND query LIKE '%argMax(value, revision) FROM " + db + ".revisions%' ORDER BY event_time DESC LIMIT 1"
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		if err := conn.Exec(ctx, "SYSTEM FLUSH LOGS"); err != nil {
			t.Fatal(err)
		}
		err := conn.QueryRow(ctx, q).Scan(&readRows)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("query_log has no finished argMax query: %v", err)
		}
	}
	if readRows != 4 {
		t.Fatalf("query_log read_rows = %d, want the 4 rows of the table", readRows)
	}
}

// TestDropDatabaseRetriesNewTable: a drop the server refuses because a
// table appeared in the database meanwhile (code 219, "Try dropping it
// again") is run again; any other error is returned at once.
func TestDropDatabaseRetriesNewTable(t *testing.T) {
	calls := 0
	err := dropDatabase(context.Background(), func(context.Context) error {
		if calls++; calls < 3 {
			return &clickhouse.Exception{Code: 219, Message: "New table appeared in database being dropped. Try dropping it again."}
		}
		return nil
	})
	if err != nil || calls != 3 {
		t.Fatalf("dropDatabase: %v after %d calls, want nil after 3", err, calls)
	}
	calls = 0
	other := &clickhouse.Exception{Code: 81, Message: "Database does not exist"}
	if err := dropDatabase(context.Background(), func(context.Context) error { calls++; return other }); !errors.Is(err, other) || calls != 1 {
		t.Fatalf("dropDatabase: %v after %d calls, want code 81 after 1", err, calls)
	}
}
