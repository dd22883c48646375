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

// TestQueriesRunsAndLeavesNothingBehind runs bench queries small on kfake
// and the real ClickHouse: every documented query is timed for both
// customers where it names one, the resume lookup and the sink with and
// without the views are measured, and its database, topics and groups
// are gone when it returns.
func TestQueriesRunsAndLeavesNothingBehind(t *testing.T) {
	addr := testenv.RealClickHouse(t)
	_, brokers := testenv.KFake(t)
	before := benchDatabases(t, addr)
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
	left = append(left, newBenchDatabases(t, addr, before, w.buf.String())...)
	if len(left) > 0 {
		t.Errorf("left behind: %v", left)
	}
}
