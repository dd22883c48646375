package sink

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/meterline/meterline/internal/testenv"
)

// TestAppliedCheckWhileViewsDropped checks an ALTER's sort key, as a
// migration run does after an ALTER that another run applied, while
// another connection creates and drops materialized views in the same
// database, as a concurrent run's migration does. ClickHouse 18.16 fails a
// read of system.tables that meets a table being dropped, and once in a
// while the server aborts after that failure ("pure virtual method
// called"), taking every client down: the check must read the one table
// only, and never fail.
func TestAppliedCheckWhileViewsDropped(t *testing.T) {
	conn, _ := testenv.ClickHouseDB(t)
	ctx := ctxT(t, time.Minute)
	for _, q := range []string{
		"CREATE TABLE usage_events (a UInt64, b UInt64) ENGINE = MergeTree ORDER BY (a, b)",
		"CREATE TABLE usage_target (a UInt64) ENGINE = MergeTree ORDER BY a",
	} {
		if err := conn.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	a := &addColumns{table: "usage_events", cols: map[string]string{"b": "UInt64"}, sortKey: "(a, b)"}
	churn, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	ddl := 0
	go func() {
		defer wg.Done()
		for churn.Err() == nil {
			for i := range 5 {
				v := fmt.Sprintf("churn_%d_mv", i)
				if err := conn.Exec(churn, "CREATE MATERIALIZED VIEW IF NOT EXISTS "+v+" TO usage_target AS SELECT a FROM usage_events"); err != nil && churn.Err() == nil {
					t.Errorf("create %s: %v", v, err)
					return
				}
				if err := conn.Exec(churn, "DROP TABLE IF EXISTS "+v); err != nil && churn.Err() == nil {
					t.Errorf("drop %s: %v", v, err)
					return
				}
				ddl += 2
			}
		}
	}()
	checks, failed := 0, 0
	var first error
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); checks++ {
		ok, err := a.applied(ctx, conn)
		if err != nil || !ok {
			failed++
			if first == nil {
				first = fmt.Errorf("applied = %v, %v", ok, err)
			}
		}
	}
	stop()
	wg.Wait()
	t.Logf("%d checks, %d failed, %d view DDLs meanwhile", checks, failed, ddl)
	if failed > 0 {
		t.Errorf("%d of %d checks of an applied ALTER failed while views were dropped; the first: %v", failed, checks, first)
	}
	if err := conn.Ping(ctx); err != nil {
		t.Fatalf("the server after the checks: %v", err)
	}
}

// TestSortingKey reads the sort key out of SHOW CREATE TABLE as 18.16 and
// current ClickHouse print it.
func TestSortingKey(t *testing.T) {
	for _, c := range []struct{ create, want string }{
		{"CREATE TABLE d.usage_events (`a` UInt64, `b` UInt64) ENGINE = MergeTree PARTITION BY toYYYYMM(t) ORDER BY (a, intDiv(b, 65536)) SETTINGS index_granularity = 8192", "(a, intDiv(b, 65536))"},
		{"CREATE TABLE d.usage_events\n(\n    `a` UInt64\n)\nENGINE = ReplacingMergeTree(v)\nPARTITION BY toYYYYMM(t)\nORDER BY (a, b)\nSETTINGS index_granularity = 8192", "(a, b)"},
		{"CREATE TABLE d.t (`a` UInt64) ENGINE = MergeTree ORDER BY a SETTINGS index_granularity = 8192", "a"},
		{"CREATE TABLE d.t\n(\n    `a` UInt64\n)\nENGINE = MergeTree\nORDER BY tuple()\nSETTINGS index_granularity = 8192", "tuple()"},
		{"CREATE TABLE d.t (`a` UInt64) ENGINE = MergeTree ORDER BY (a, b)", "(a, b)"},
	} {
		got, ok := sortingKey(c.create)
		if !ok || got != c.want {
			t.Errorf("sortingKey(%q) = %q, %v; want %q", c.create, got, ok, c.want)
		}
	}
	if got, ok := sortingKey("CREATE VIEW d.v AS SELECT a FROM t ORDER BY a"); ok {
		t.Errorf("sortingKey of a view = %q", got)
	}
	for _, c := range []struct{ key, want string }{
		{"(a, intDiv(b, 65536))", "a,intDiv(b,65536)"},
		{"a, intDiv(b, 65536)", "a,intDiv(b,65536)"},
		{"(a) + (b)", "(a)+(b)"},
		{"tuple()", "tuple()"},
	} {
		if got := bareKey(c.key); got != c.want {
			t.Errorf("bareKey(%q) = %q, want %q", c.key, got, c.want)
		}
	}
}
