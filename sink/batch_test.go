package sink

import (
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/schemas"
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

// TestBatchClosesAtMaxBatchBytes: a batch closes at MaxBatchBytes however
// few its records. Twelve events of about 16 KiB each (the largest an
// event may be, schemas.MaxEventBytes), already in the topic, with
// MaxBatchBytes of 40 KiB and record and time bounds that would put them
// all in one INSERT: each INSERT into usage_events holds two of them, the
// most that fit, and every row is written once.
func TestBatchClosesAtMaxBatchBytes(t *testing.T) {
	e := newEnv(t, 1)
	topic := e.names.DedupedTopic()
	const n = 12
	var recs []*kgo.Record
	size := 0
	for i := 0; i < n; i++ {
		r := deduped(topic, 0, i, base.Add(time.Duration(i)*time.Second))
		r.Value = schemas.MustEncode(bigEvent(r, 16<<10-200))
		size = max(size, len(r.Key)+len(r.Value))
		recs = append(recs, r)
	}
	if size > schemas.MaxEventBytes || size < 15<<10 {
		t.Fatalf("test records of %d bytes, want about %d", size, schemas.MaxEventBytes)
	}
	e.produce(recs...)
	var mu sync.Mutex
	var inserts []int64
	hook := func(ev hookEvent) {
		if ev.kind == hookInsert && ev.table == TableEvents {
			mu.Lock()
			s := ev.spans[0]
			inserts = append(inserts, s[1]-s[0]+1)
			mu.Unlock()
		}
	}
	r := e.start(func(c *Config) {
		c.MaxBatchBytes = 40 << 10
		c.MaxBatchRecords, c.MaxBatchWait, c.CommitInterval = 1000, 5*time.Second, 5*time.Second
		c.testHook = hook
	})
	e.waitCaughtUp(time.Minute, topic)
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	e.exact(TableEvents, n)
	mu.Lock()
	defer mu.Unlock()
	for _, rows := range inserts {
		if rows != 2 {
			t.Fatalf("rows of the INSERTs into usage_events: %v; want 2 each (records of about %d bytes, at most %d bytes a batch)", inserts, size, 40<<10)
		}
	}
}

// bigEvent is r's DedupedEvent with a property that takes its value to
// about size bytes.
func bigEvent(r *kgo.Record, size int) *schemas.DedupedEvent {
	var ev schemas.DedupedEvent
	if err := schemas.DecodeInto(r.Value, &ev); err != nil {
		panic(err)
	}
	ev.Properties = append(ev.Properties, schemas.Property{Name: "payload", Value: strings.Repeat("x", max(0, size-len(r.Value)))})
	return &ev
}
