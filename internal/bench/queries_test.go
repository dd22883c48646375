package bench

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/sink"
)

// queriesDatabases lists the ClickHouse databases bench queries makes.
func queriesDatabases(t *testing.T, addr string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := sink.Dial(ctx, addr, "default", false)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rows, err := conn.Query(ctx, "SELECT name FROM system.databases WHERE name LIKE 'bench_queries_%' OR name LIKE 'bench_sink%'")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var dbs []string
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			t.Fatal(err)
		}
		dbs = append(dbs, name)
	}
	return dbs
}

// TestQueriesRunsAndLeavesNothingBehind runs bench queries small on kfake
// and the real ClickHouse: every documented query is timed for both
// customers where it names one, the resume lookup and the sink with and
// without the views are measured, and its database, topics and groups
// are gone when it returns.
func TestQueriesRunsAndLeavesNothingBehind(t *testing.T) {
	addr := testenv.RealClickHouse(t)
	_, brokers := testenv.KFake(t)
	before := queriesDatabases(t, addr)
	w := &watcher{}
	env, out := testEnv(t, brokers, w)
	env.ClickHouse = addr
	err := Queries(context.Background(), env, QueriesConfig{Events: 20_000, Revisions: 2_000, Customers: 100, Months: 2, Partitions: 4,
		Runs: 2, SinkRows: 2_000, SinkRounds: 1, Settle: 8 * time.Second})
	t.Logf("progress:\n%s\nresult:\n%s", w.buf.String(), out.String())
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range sink.AnalystQueries {
		if !strings.Contains(out.String(), "\n"+q.Name+" ") {
			t.Errorf("no timing of %s", q.Name)
		}
	}
	for _, want := range []string{"median customer", "largest customer", "resume lookup near the end of partition 1 ", "with the analyst views:", "without the analyst views:"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the result does not say %q", want)
		}
	}
	left := leftBehind(t, testenv.Admin(t, brokers), "", filepath.Join(t.TempDir(), "none"))
	for _, db := range queriesDatabases(t, addr) {
		if !containsString(before, db) {
			left = append(left, "database "+db)
		}
	}
	if len(left) > 0 {
		t.Errorf("left behind: %v", left)
	}
}

func containsString(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}
