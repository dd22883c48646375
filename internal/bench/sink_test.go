package bench

import (
	"context"
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/sink"
)

// benchDatabases lists the ClickHouse databases bench sink and bench
// queries make.
func benchDatabases(t *testing.T, addr string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := sink.Dial(ctx, addr, "default", false)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rows, err := conn.Query(ctx, "SELECT name FROM system.databases WHERE name LIKE 'bench_sink%' OR name LIKE 'bench_queries_%'")
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
	// A listing cut short would hide a database left behind.
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return dbs
}

// benchStamp finds, in the progress lines of a bench sink or bench
// queries run, the stamp that names its databases: in its topics' prefix,
// or (modulo 1e9) in its bench queries database.
var benchStamp = regexp.MustCompile(`bench-(?:queries-)?sink-(\d+)\.|bench_queries_(\d+)\.`)

// newBenchDatabases lists, as "database <name>", the databases of
// benchDatabases that are not in before and that belong to the run whose
// progress lines are progress: another package's tests may run bench on
// the same server meanwhile (make test's lanes). Without a stamp in
// progress, every new one counts.
func newBenchDatabases(t *testing.T, addr string, before []string, progress string) []string {
	t.Helper()
	ours := func(string) bool { return true }
	if m := benchStamp.FindStringSubmatch(progress); m != nil {
		stamp, err := strconv.ParseInt(m[1]+m[2], 10, 64)
		if err != nil {
			t.Fatalf("stamp %q: %v", m[0], err)
		}
		// bench_queries_<stamp>, bench_sink_<what>_<stamp>_<round>.
		mark := fmt.Sprintf("_%d_", stamp%1e9)
		ours = func(db string) bool { return strings.Contains(db+"_", mark) }
	}
	var dbs []string
	for _, db := range benchDatabases(t, addr) {
		if !slices.Contains(before, db) && ours(db) {
			dbs = append(dbs, "database "+db)
		}
	}
	return dbs
}

// TestSinkLeavesNothingBehind runs bench sink on kfake and the real
// ClickHouse, to the end and stopped by Ctrl-C after a sink run: its
// topics, consumer groups and databases are gone when it returns.
func TestSinkLeavesNothingBehind(t *testing.T) {
	addr := testenv.RealClickHouse(t)
	for _, stop := range []string{"", "round 2 meterline sink"} {
		t.Run(map[string]string{"": "to the end"}[stop]+map[bool]string{true: "Ctrl-C after a sink run"}[stop != ""], func(t *testing.T) {
			_, brokers := testenv.KFake(t)
			before := benchDatabases(t, addr)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			w := &watcher{at: stop, cancel: cancel}
			env, out := testEnv(t, brokers, w)
			env.ClickHouse = addr
			err := Sink(ctx, env, SinkConfig{Rows: 500, Partitions: 2, Rounds: 2, BatchRows: 100, Customers: 10})
			t.Logf("progress:\n%s", w.buf.String())
			switch {
			case stop == "" && err != nil:
				t.Fatalf("bench: %v", err)
			case stop != "" && err == nil:
				t.Fatal("bench returned no error")
			case stop == "" && !strings.Contains(out.String(), "median of per-round ratios:  "):
				t.Errorf("no result table:\n%s", out.String())
			}
			left := leftBehind(t, testenv.Admin(t, brokers), "", filepath.Join(t.TempDir(), "none"))
			left = append(left, newBenchDatabases(t, addr, before, w.buf.String())...)
			if len(left) > 0 {
				t.Errorf("left behind: %v", left)
			}
		})
	}
}

// TestSinkAgainstNoViews runs bench sink comparing the sink with one
// analyst view against the sink without any, and reports both and their
// ratio.
func TestSinkAgainstNoViews(t *testing.T) {
	addr := testenv.RealClickHouse(t)
	_, brokers := testenv.KFake(t)
	w := &watcher{}
	env, out := testEnv(t, brokers, w)
	env.ClickHouse = addr
	err := Sink(context.Background(), env, SinkConfig{Rows: 500, Partitions: 2, Rounds: 2, BatchRows: 100, Customers: 10,
		AgainstNoViews: true, Views: []string{"usage_daily_mv"}})
	t.Logf("progress:\n%s\nresult:\n%s", w.buf.String(), out.String())
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"without the analyst views:", "with views usage_daily_mv:", "ratio of medians:", "round 2 meterline sink, no analyst views:", "round 2 meterline sink, views usage_daily_mv:"} {
		if !strings.Contains(out.String()+w.buf.String(), want) {
			t.Errorf("the output does not say %q", want)
		}
	}
	if strings.Contains(w.buf.String(), "baseline") {
		t.Error("the bare batch loop ran")
	}
}
