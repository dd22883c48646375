package sink

import (
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestDefaultBatchIsLarge runs the sink with its default batching on
// 40,000 events already in the topic: it writes them in INSERTs of more
// than 10,000 rows and at most DefaultMaxBatchRecords records each. Every
// INSERT costs ClickHouse a part per table it writes, the ledger's and
// each analyst view's, with buffers per column whatever its rows; at
// 10,000 rows per INSERT that fixed cost was most of what the analyst
// views cost the sink (docs/benchmarks.md, "The analyst views").
func TestDefaultBatchIsLarge(t *testing.T) {
	e := newEnv(t, 4)
	recs, n := e.events(10_000, base)
	e.produce(recs...)
	r := e.start(func(c *Config) {
		c.MaxBatchRecords, c.MaxBatchWait, c.CommitInterval = 0, 0, 0 // the defaults
	})
	e.waitCaughtUp(2*time.Minute, e.names.DedupedTopic())
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	e.exact(TableEvents, uint64(n))
	ctx := ctxT(t, time.Minute)
	if err := e.conn.Exec(ctx, "SYSTEM FLUSH LOGS"); err != nil {
		t.Fatal(err)
	}
	out, err := tsv(ctx, e.conn, `SELECT written_rows FROM system.query_log
WHERE type = 2 AND query LIKE 'INSERT INTO `+e.db+`.usage_events%' ORDER BY event_time`)
	if err != nil {
		t.Fatal(err)
	}
	sizes := strings.Fields(out)
	largest := 0
	for _, s := range sizes {
		v, err := strconv.Atoi(s)
		if err != nil {
			t.Fatalf("written_rows %q: %v", s, err)
		}
		largest = max(largest, v)
	}
	if largest <= 10_000 || largest > DefaultMaxBatchRecords {
		t.Fatalf("rows of the INSERTs into usage_events: %v; want one of more than 10,000 and none of more than %d", sizes, DefaultMaxBatchRecords)
	}
	t.Logf("%d rows in %d INSERTs: %v", n, len(sizes), sizes)
}
