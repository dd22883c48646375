package sink

import (
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/schemas"
)

// poisonAt returns the env's events (n per partition) with the events at
// the given (partition, event index) pairs given customer "poison", and
// those records by (partition, index).
func (e *env) poisonAt(n int, at ...[2]int) ([]*kgo.Record, int, map[[2]int]*kgo.Record) {
	recs, rows := e.events(n, base)
	targets := map[[2]int]*kgo.Record{}
	for _, r := range recs {
		var ev schemas.DedupedEvent
		if schemas.DecodeInto(r.Value, &ev) != nil {
			continue
		}
		for _, a := range at {
			if ev.SourcePartition == int32(a[0]) && ev.SourceOffset == int64(a[1]) {
				ev.CustomerID = "poison"
				r.Value = schemas.MustEncode(&ev)
				targets[a] = r
			}
		}
	}
	if len(targets) != len(at) {
		e.t.Fatalf("found %d of %d poison targets", len(targets), len(at))
	}
	return recs, rows, targets
}

// TestParkBeforeHigherOffsets checks the order of docs/design.md, The
// ClickHouse ledger, "Refused blocks": a refused row is parked (its
// transaction committed) before any higher offset of its partition is
// inserted. Partition 2 has two refused rows in the middle of its block,
// partition 1 one. Evidence, from two sides:
//   - ClickHouse: when the transaction that parks (p, o) has committed, the
//     table holds no row of partition p above o (queried from the commit
//     hook, while the sink inserts nothing);
//   - the sink's own sequence of successful INSERTs and commits: no INSERT
//     holding a row of p above o comes before that commit.
//
// Every other row arrives exactly once and each refused row is parked
// exactly once. A record that does not decode, held back behind a refused
// row, is parked exactly once too (not in the window that parks the row,
// which does not commit its offset).
func TestParkBeforeHigherOffsets(t *testing.T) {
	e := newEnv(t, 4)
	e.exec("ALTER TABLE " + e.db + ".usage_events ADD COLUMN poison UInt8 MATERIALIZED throwIf(customer_id = 'poison')")
	poison := [][2]int{{2, 150}, {2, 170}, {1, 50}}
	recs, rows, targets := e.poisonAt(400, poison...)
	garbage := &kgo.Record{Topic: e.names.DedupedTopic(), Partition: 2, Value: []byte("not a deduped event"), Timestamp: base}
	for i, r := range recs {
		if r == targets[[2]int{2, 150}] { // right after the first refused row of partition 2
			recs = append(recs[:i+1], append([]*kgo.Record{garbage}, recs[i+1:]...)...)
			break
		}
	}
	e.produce(recs...) // sets each record's Offset
	type key struct {
		p   int32
		off int64
	}
	want := map[key]bool{}
	for _, r := range targets {
		want[key{r.Partition, r.Offset}] = true
	}

	var mu sync.Mutex
	var seq []hookEvent
	var problems []string
	topic := e.names.DedupedTopic()
	hook := func(ev hookEvent) {
		mu.Lock()
		seq = append(seq, ev)
		mu.Unlock()
		if ev.kind != hookCommit {
			return
		}
		for _, pk := range ev.parked {
			// Called on the sink's run loop right after End committed:
			// no INSERT of this sink is in flight.
			q := fmt.Sprintf("SELECT count() FROM %s.usage_events WHERE kafka_topic = '%s' AND kafka_partition = %d AND kafka_offset > %d",
				e.db, topic, pk.partition, pk.offset)
			var n uint64
			err := e.conn.QueryRow(ctxT(t, 30*time.Second), q).Scan(&n)
			mu.Lock()
			switch {
			case err != nil:
				problems = append(problems, fmt.Sprintf("%s: %v", q, err))
			case n != 0:
				problems = append(problems, fmt.Sprintf("when the park of partition %d offset %d committed, the table already held %d rows of that partition at higher offsets",
					pk.partition, pk.offset, n))
			}
			mu.Unlock()
		}
	}
	r := e.start(func(c *Config) { c.testHook = hook })
	e.waitCaughtUp(2*time.Minute, topic)
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, p := range problems {
		t.Error(p)
	}

	// The sequence: position of each park's commit, then no INSERT of a
	// higher offset of its partition before it.
	parkedAtIdx := map[key]int{}
	for i, ev := range seq {
		if ev.kind != hookCommit {
			continue
		}
		for _, pk := range ev.parked {
			if pk.topic != topic {
				continue
			}
			k := key{pk.partition, pk.offset}
			if _, dup := parkedAtIdx[k]; dup {
				t.Errorf("partition %d offset %d parked by two committed transactions", k.p, k.off)
			}
			parkedAtIdx[k] = i
		}
	}
	if len(parkedAtIdx) != len(want) {
		t.Errorf("parks committed for %v, want %v", parkedAtIdx, want)
	}
	inserts := 0
	for k, at := range parkedAtIdx {
		if !want[k] {
			t.Errorf("unexpected park of partition %d offset %d", k.p, k.off)
		}
		for i, ev := range seq[:at] {
			if ev.kind != hookInsert || ev.topic != topic {
				continue
			}
			if s, ok := ev.spans[k.p]; ok && s[1] > k.off {
				t.Errorf("INSERT #%d wrote partition %d offsets %d..%d before the park of offset %d committed (event #%d)",
					i, k.p, s[0], s[1], k.off, at)
			}
		}
	}
	for _, ev := range seq {
		if ev.kind == hookInsert && ev.topic == topic {
			inserts++
		}
	}
	t.Logf("%d events: %d INSERTs into usage_events, parks committed at events %v", len(seq), inserts, parkedAtIdx)

	e.exact(TableEvents, uint64(rows-len(poison)))
	if n := e.count(TableEvents, "customer_id = 'poison'"); n != 0 {
		t.Fatalf("refused rows in the table: %d", n)
	}
	got := e.parkedRecords()
	var gotKeys []string
	seen := map[key]int{}
	garbageParked := 0
	var uninsertable []*schemas.Rejected
	for _, p := range got {
		if p.SourcePartition == 2 && p.SourceOffset == garbage.Offset {
			garbageParked++
			continue
		}
		uninsertable = append(uninsertable, p)
	}
	if garbageParked != 1 {
		t.Errorf("the record that does not decode (partition 2 offset %d) parked %d times, want 1", garbage.Offset, garbageParked)
	}
	got = uninsertable
	for _, p := range got {
		if p.Reason != schemas.ReasonUninsertable || p.SourceTopic != topic || p.CustomerID != "poison" {
			t.Errorf("parked record: %+v", p)
		}
		seen[key{p.SourcePartition, p.SourceOffset}]++
		gotKeys = append(gotKeys, fmt.Sprintf("%d@%d", p.SourcePartition, p.SourceOffset))
	}
	sort.Strings(gotKeys)
	for k := range want {
		if seen[k] != 1 {
			t.Errorf("partition %d offset %d parked %d times, want 1 (parked: %s)", k.p, k.off, seen[k], strings.Join(gotKeys, " "))
		}
	}
	if len(got) != len(want) {
		t.Errorf("%d rows parked, want %d: %s", len(got), len(want), strings.Join(gotKeys, " "))
	}
	if got := metric(t, r.reg, "meterline_sink_rows_total", "table", TableEvents, "outcome", outcomeParked); got != float64(len(want)) {
		t.Errorf("parked rows metric = %v, want %d", got, len(want))
	}
}

// TestCrashAfterParkCommit kills the real binary right after the
// transaction that parked a refused row committed (its partition's offset
// just past the row), before the rows held back behind it are fetched
// again. At that moment the table holds no row of the partition above the
// parked one. The restart parks nothing again and writes every other row
// exactly once.
func TestCrashAfterParkCommit(t *testing.T) {
	waitsMostly(t)
	e := newEnv(t, 4)
	e.exec("ALTER TABLE " + e.db + ".usage_events ADD COLUMN poison UInt8 MATERIALIZED throwIf(customer_id = 'poison')")
	recs, rows, target := e.poisoned(400, func(ev *schemas.DedupedEvent) { ev.CustomerID = "poison" })
	e.produce(recs...)
	p := e.spawn(FaultAfterParkCommit, e.sinkArgs()...)
	p.ExpectFaultKill(t, FaultAfterParkCommit, 2*time.Minute)

	topic := e.names.DedupedTopic()
	// Kafka writes the transaction's markers asynchronously: wait for the
	// committed offset to show.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		c := e.committed(topic)
		if c[2] == target.Offset+1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("committed offset of partition 2 after the park = %d, want %d (just past the parked row)", c[2], target.Offset+1)
		}
	}
	if n := e.count(TableEvents, fmt.Sprintf("kafka_partition = 2 AND kafka_offset > %d", target.Offset)); n != 0 {
		t.Fatalf("the park committed, yet the table holds %d rows of partition 2 above it", n)
	}
	checkParked(t, e.parkedRecords(), e, target, target.Offset, "poison")

	p = e.spawn("", e.sinkArgs()...)
	e.waitCaughtUp(2*time.Minute, topic)
	p.Stop(t)
	e.exact(TableEvents, uint64(rows-1))
	checkParked(t, e.parkedRecords(), e, target, target.Offset, "poison")
}
