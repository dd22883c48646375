package aggregator

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/entitlements"
	"github.com/meterline/meterline/internal/stream"
	"github.com/meterline/meterline/schemas"
)

// smallRecordRun is partition 0 of a stage with entitlements on
// stream.Local, with the bench plan and rate card read, and a customer
// whose versions take about 270 KB: a record of
// entitlements.MaxGrants grants with ids of entitlements.MaxNameBytes
// bytes (bigGrants), then a small record in effect, committed.
type smallRecordRun struct {
	tb    testing.TB
	l     *stream.Local
	pt    *partition
	topic string
	cust  string
	off   int64
	at    time.Time
	// sched is the effective_from of the small records that change the
	// customer's versions (record): a day ahead.
	sched int64
}

func newSmallRecordRun(tb testing.TB) *smallRecordRun {
	tb.Helper()
	in, err := procBenchInput()
	if err != nil {
		tb.Fatal(err)
	}
	o := &openCapture{processor: procBenchProcessor(tb, in.names, true)}
	l, err := stream.NewLocal(o, 0, in.names.DedupedTopic())
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = l.Close() })
	r := &smallRecordRun{tb: tb, l: l, pt: o.pt, topic: in.names.EntitlementsTopic(), off: int64(len(in.ent)),
		at: procBenchNow.Add(time.Second), sched: procBenchNow.Add(24 * time.Hour).UnixMilli()}
	if err := l.Process(in.ent); err != nil {
		tb.Fatal(err)
	}
	r.cust = partition0Customers("big", 1)[0]
	allow := schemas.Overdraft{Policy: schemas.OverdraftAllow}
	r.put(&schemas.Entitlements{CustomerID: r.cust, Plan: "big", Grants: bigGrants("g"), Overdraft: allow})
	r.put(&schemas.Entitlements{CustomerID: r.cust, Plan: "small", Overdraft: allow})
	r.commit()
	return r
}

// partition0Customers returns n customers of partition 0 (of
// procBenchPartitions), named prefix and a number.
func partition0Customers(prefix string, n int) []string {
	var cs []string
	for i := 0; len(cs) < n; i++ {
		if c := fmt.Sprint(prefix, i); schemas.Partition(schemas.CustomerKey(c), procBenchPartitions) == 0 {
			cs = append(cs, c)
		}
	}
	return cs
}

// put reads a record of its customer, a millisecond after the last one.
func (r *smallRecordRun) put(e *schemas.Entitlements) {
	r.tb.Helper()
	r.at = r.at.Add(time.Millisecond)
	rec := &kgo.Record{Topic: r.topic, Offset: r.off, Key: schemas.CustomerKey(e.CustomerID), Value: schemas.MustEncode(e), Timestamp: r.at}
	r.off++
	if err := r.l.Process([]*kgo.Record{rec}); err != nil {
		r.tb.Fatal(err)
	}
}

// record reads the i-th small record (about 30 bytes): a plan scheduled a
// day ahead, "a" or "b" in turn, which replaces the one scheduled before
// it (changed), or the small record in effect written again (unchanged).
func (r *smallRecordRun) record(i int, changed bool) {
	e := &schemas.Entitlements{CustomerID: r.cust, Plan: "small", Overdraft: schemas.Overdraft{Policy: schemas.OverdraftAllow}}
	if changed {
		e.Plan, e.EffectiveFrom = string(rune('a'+i%2)), r.sched
	}
	r.put(e)
}

func (r *smallRecordRun) commit() {
	r.tb.Helper()
	if err := r.l.Commit(); err != nil {
		r.tb.Fatal(err)
	}
}

// TestSmallRecordCostIndependentOfVersions: a small record of a customer
// whose versions take about 270 KB cost the aggregator the whole version
// list, decoded and validated, and encoded (its size counted, its value
// written), several times: 2 to 3.5 ms, so that about 1 MB/s of such
// records stalled a partition. The versions are kept decoded between
// records and written once per transaction: what a record allocates in
// its transaction is a small share of the versions' bytes, whether it
// changes them (a plan scheduled ahead, replaced) or not (the record in
// effect written again); the transaction's commit writes the versions
// once.
func TestSmallRecordCostIndependentOfVersions(t *testing.T) {
	const n = 40
	const versions = 270_000
	for _, changed := range []bool{true, false} {
		t.Run(fmt.Sprintf("changed=%v", changed), func(t *testing.T) {
			r := newSmallRecordRun(t)
			r.record(0, changed) // the first after a commit reads the versions again
			var m0, m1 runtime.MemStats
			runtime.ReadMemStats(&m0)
			for i := 1; i <= n; i++ {
				r.record(i, changed)
			}
			runtime.ReadMemStats(&m1)
			if per := int(m1.TotalAlloc-m0.TotalAlloc) / n; per > versions/16 {
				t.Errorf("a small record allocates %d bytes, want at most %d (the versions take about %d)", per, versions/16, versions)
			}
			r.l.Keep()
			r.commit()
			var writes int
			for _, c := range r.l.Changelog() {
				if r.pt.pr.ledger.IsTimeline(c.Key) {
					writes++
				}
			}
			if writes != 1 {
				t.Errorf("the transaction wrote the versions %d times, want once", writes)
			}
		})
	}
}

// BenchmarkSmallRecordBigVersions is what a small record of a customer
// whose versions take about 270 KB costs a partition, with a commit every
// 100 records (a transaction's share included).
func BenchmarkSmallRecordBigVersions(b *testing.B) {
	for _, changed := range []bool{true, false} {
		b.Run(fmt.Sprintf("changed=%v", changed), func(b *testing.B) {
			r := newSmallRecordRun(b)
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				r.record(i, changed)
				if i++; i%100 == 0 {
					r.commit()
				}
			}
		})
	}
}

// TestAbortDropsKeptVersions: the versions a partition keeps decoded and
// changes in place are dropped with an aborted transaction: a record the
// aborted transaction applied (a plan scheduled a day ahead) is gone, and
// the transaction that reads the next record in its place writes the
// state a partition that never read it writes.
func TestAbortDropsKeptVersions(t *testing.T) {
	allow := schemas.Overdraft{Policy: schemas.OverdraftAllow}
	state := func(abort bool) map[string]string {
		r := newSmallRecordRun(t)
		if abort {
			at, off := r.at, r.off
			r.put(&schemas.Entitlements{CustomerID: r.cust, Plan: "x", EffectiveFrom: r.sched, Overdraft: allow})
			r.l.Abort()
			r.at, r.off = at, off
		}
		r.put(&schemas.Entitlements{CustomerID: r.cust, Plan: "y", EffectiveFrom: r.sched + 3_600_000, Overdraft: allow})
		r.l.Keep()
		r.commit()
		m := map[string]string{}
		for _, c := range r.l.Changelog() {
			m[string(c.Key)] = string(c.Value)
		}
		return m
	}
	want, got := state(false), state(true)
	for k, v := range want {
		if got[k] != v {
			t.Errorf("state key %q: %d bytes after an aborted record, %d without", k, len(got[k]), len(v))
		}
	}
	if len(got) != len(want) {
		t.Errorf("%d state keys written after an aborted record, %d without", len(got), len(want))
	}
}

// TestKeptVersionsBoundedInBytes: the versions a partition keeps decoded
// are bounded in bytes (maxTimelineBytes), as the ledger's other caches:
// a transaction that reads records of many customers whose versions take
// about 270 KB each keeps at most the bound, writes the versions it
// changed to the transaction before it drops them, and writes each
// customer's once; the next transaction reads them back from the state.
func TestKeptVersionsBoundedInBytes(t *testing.T) {
	r := newSmallRecordRun(t)
	allow := schemas.Overdraft{Policy: schemas.OverdraftAllow}
	custs := partition0Customers("many", maxTimelineBytes/decodedBytes(270_000)*3/2)
	r.l.Keep()
	spilled := false
	for _, c := range custs {
		n := len(r.pt.ent.timelines)
		r.put(&schemas.Entitlements{CustomerID: c, Plan: "big", Grants: bigGrants("g"), Overdraft: allow})
		sum := 0
		for k, h := range r.pt.ent.timelines {
			sum += timelineSize(k, h.t)
		}
		if e := r.pt.ent; e.timelineBytes > maxTimelineBytes || e.timelineBytes != sum {
			t.Fatalf("the kept versions take %d bytes (counted %d), the bound is %d", sum, e.timelineBytes, maxTimelineBytes)
		}
		spilled = spilled || len(r.pt.ent.timelines) <= n
	}
	if !spilled {
		t.Fatalf("the versions of %d customers kept, none dropped", len(custs))
	}
	r.commit()
	written := map[string]int{}
	for _, c := range r.l.Changelog() {
		if r.pt.pr.ledger.IsTimeline(c.Key) && len(c.Value) > 200_000 {
			written[string(c.Key)]++
		}
	}
	if len(written) != len(custs) {
		t.Fatalf("the versions of %d customers written, want %d", len(written), len(custs))
	}
	for k, n := range written {
		if n != 1 {
			t.Errorf("%q written %d times, want once", k, n)
		}
	}
	// Read back: each customer's next record keeps its big version.
	before := len(r.l.Changelog())
	for _, c := range custs {
		r.put(&schemas.Entitlements{CustomerID: c, Plan: "small", Overdraft: allow})
	}
	r.commit()
	again := 0
	for _, c := range r.l.Changelog()[before:] {
		if r.pt.pr.ledger.IsTimeline(c.Key) && len(c.Value) > 200_000 {
			again++
		}
	}
	if again != len(custs) {
		t.Errorf("%d customers' versions still hold their big version, want %d", again, len(custs))
	}
}

// TestKeptVersionsBoundedInCount: the timelines a partition keeps are
// bounded in number too (maxTimelines), most of them a customer's that has
// no record (no version): their bytes alone would let a partition keep
// about a million.
func TestKeptVersionsBoundedInCount(t *testing.T) {
	e := &entPart{timelines: map[string]*heldTimeline{}}
	s := ledgerStore{e: e}
	for i := range maxTimelines * 3 / 2 {
		s.KeepTimeline(fmt.Appendf(nil, "eT%d", i), &entitlements.Timeline{})
		if len(e.timelines) > maxTimelines {
			t.Fatalf("%d timelines kept, the bound is %d", len(e.timelines), maxTimelines)
		}
	}
	if len(e.timelines) == 0 || len(e.timelines) == maxTimelines {
		t.Errorf("%d timelines kept, want some, fewer than the bound after it was passed", len(e.timelines))
	}
}
