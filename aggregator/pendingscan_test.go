package aggregator

import (
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/internal/benchinput"
	"github.com/meterline/meterline/internal/stream"
	"github.com/meterline/meterline/internal/topics"
	"github.com/meterline/meterline/schemas"
)

// pendingRun is one partition of the aggregator with entitlements on an
// in-memory store (stream.Local), whose transactions the test ends: its
// input is procBenchEnt's, and the events of pendingCustomers.
type pendingRun struct {
	tb     testing.TB
	names  topics.Names
	l      *stream.Local
	pt     *partition
	entOff int64 // the next offset of usage.entitlements
	evOff  int64 // the next offset of usage.deduped
	closed bool
}

// openCapture keeps the partition its processor opens.
type openCapture struct {
	*processor
	pt *partition
}

func (o *openCapture) Open(p int32, st *stream.PartitionState) (stream.Partition, error) {
	part, err := o.processor.Open(p, st)
	if err == nil {
		o.pt = part.(*partition)
	}
	return part, err
}

// newPendingRun opens partition 0 with a chunk of chunk and reads the
// plan, the rate card and a tick at procBenchNow + 1ms.
func newPendingRun(tb testing.TB, chunk int) *pendingRun {
	tb.Helper()
	r := &pendingRun{tb: tb, names: topics.DefaultNames()}
	r.names.Prefix = "bench."
	pr := procBenchProcessor(tb, r.names, true)
	setFinalChunk(&pr.cfg, chunk)
	o := &openCapture{processor: pr}
	var err error
	if r.l, err = stream.NewLocal(o, 0, r.names.DedupedTopic()); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(r.close)
	r.pt = o.pt
	ent, err := procBenchEnt(r.names, procBenchNow)
	if err != nil {
		tb.Fatal(err)
	}
	r.process(ent)
	r.entOff = int64(len(ent))
	return r
}

// close closes the partition and its store, once.
func (r *pendingRun) close() {
	if !r.closed {
		r.closed = true
		if err := r.l.Close(); err != nil {
			r.tb.Error(err)
		}
	}
}

func (r *pendingRun) process(recs []*kgo.Record) {
	r.tb.Helper()
	if err := r.l.Process(recs); err != nil {
		r.tb.Fatal(err)
	}
}

// tick reads a tick of broker time at into the open transaction.
func (r *pendingRun) tick(at time.Time) {
	r.tb.Helper()
	v, err := schemas.Encode(&schemas.Tick{InstanceID: "test"})
	if err != nil {
		r.tb.Fatal(err)
	}
	r.process([]*kgo.Record{{Topic: r.names.EntitlementsTopic(), Offset: r.entOff, Key: []byte(schemas.TickKey), Value: v, Timestamp: at}})
	r.entOff++
}

// events reads into the open transaction one event of each customer,
// arrived at procBenchNow.
func (r *pendingRun) events(custs []int) {
	r.tb.Helper()
	r.eventsAt(custs, procBenchNow)
}

// eventsAt reads into the open transaction one event of each customer,
// arrived at arrival.
func (r *pendingRun) eventsAt(custs []int, arrival time.Time) {
	r.tb.Helper()
	var recs []*kgo.Record
	for _, c := range custs {
		e := benchinput.Event(int(r.evOff), c, 1<<30, arrival)
		v, err := schemas.Encode(e)
		if err != nil {
			r.tb.Fatal(err)
		}
		recs = append(recs, &kgo.Record{Topic: r.names.DedupedTopic(), Offset: r.evOff, Key: schemas.CustomerKey(e.CustomerID),
			Value: v, Timestamp: arrival})
		r.evOff++
	}
	r.process(recs)
}

func (r *pendingRun) commit() {
	r.tb.Helper()
	if err := r.l.Commit(); err != nil {
		r.tb.Fatal(err)
	}
}

// pendingCustomers returns the first n customers (benchinput's numbers)
// of partition 0 of usage.deduped.
func pendingCustomers(n int) []int {
	var cs []int
	for c := 0; len(cs) < n; c++ {
		if schemas.Partition(schemas.CustomerKey(fmt.Sprintf("cust-%05d", c)), procBenchPartitions) == 0 {
			cs = append(cs, c)
		}
	}
	return cs
}

// TestPendingEmissionBoundedByChunk: a transaction of the emission of the
// pending customers looks at no more of them than its chunk and the one
// after it, however many are pending (docs/design.md, Exactly-once, 7: the
// records a transaction emits are bounded, and so is its work), and the
// emission goes through them in key order after its cursor, each chunk the
// next FinalChunk customers; a customer that becomes pending ahead of the
// cursor goes out in that emission, one that becomes pending behind it (its
// balance just went out) waits for the next emission, a balance interval
// after the start of this one.
func TestPendingEmissionBoundedByChunk(t *testing.T) {
	const chunk = 50
	for _, n := range []int{500, 5000} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			r := newPendingRun(t, chunk)
			all := pendingCustomers(n + 1)
			custs, late := all[:n], all[n] // late sorts after every one of custs
			name := func(c int) string { return fmt.Sprintf("cust-%05d", c) }
			// The model: the pending customers and the emission's cursor.
			model := map[string]bool{}
			cursor, active := "", true
			txn := func(changed []int) {
				t.Helper()
				for _, c := range changed {
					model[name(c)] = true
				}
				var next []string
				for _, c := range slices.Sorted(maps.Keys(model)) {
					if active && (cursor == "" || c > cursor) {
						next = append(next, c)
					}
				}
				if len(next) > chunk {
					next, cursor = next[:chunk], next[chunk-1]
				} else {
					active, cursor = false, ""
				}
				for _, c := range next {
					delete(model, c)
				}
				v0, out0 := r.pt.ent.visited, r.l.Emitted(r.names.BalancesTopic())
				r.commit()
				if got := slices.Sorted(maps.Keys(r.pt.ent.pendingAt)); !slices.Equal(got, slices.Sorted(maps.Keys(model))) {
					t.Fatalf("pending after the transaction: %d customers, want %d (chunk %v)", len(got), len(model), next)
				}
				if out := r.l.Emitted(r.names.BalancesTopic()) - out0; out != len(next) {
					t.Fatalf("%d balances emitted, want %d", out, len(next))
				}
				if v := r.pt.ent.visited - v0; v > chunk+1 {
					t.Fatalf("a transaction of the emission looked at %d pending customers (of %d), want at most the chunk and one: %d",
						v, len(model)+len(next), chunk+1)
				}
			}
			// The first transaction makes them pending, and starts the
			// emission (no emission before).
			r.events(custs)
			txn(custs)
			for i := 1; active; i++ {
				r.tick(procBenchNow.Add(time.Duration(1+i) * time.Millisecond))
				var changed []int
				if i == 2 {
					// custs[0]'s balance went out: it waits for the next
					// emission; late is ahead of the cursor.
					changed = []int{custs[0], late}
					r.events(changed)
				}
				txn(changed)
			}
			if len(model) != 1 || !model[name(custs[0])] {
				t.Fatalf("pending after the emission: %v, want %s alone", slices.Sorted(maps.Keys(model)), name(custs[0]))
			}
			// Within the interval, it waits; then the next emission.
			r.tick(procBenchNow.Add(999 * time.Millisecond))
			active = false
			txn(nil)
			r.tick(procBenchNow.Add(1001 * time.Millisecond))
			active = true
			txn(nil)
			if len(r.pt.ent.pendingAt) != 0 {
				t.Fatalf("%d customers pending after the second emission, want none", len(r.pt.ent.pendingAt))
			}
		})
	}
}

// BenchmarkPendingEmission is the emission of N pending customers in
// chunks of 1,000 (Flush, the balances and the store's writes, one
// transaction a chunk): ns/txn is its time a transaction, visited/txn the
// pending customers a transaction looked at. Neither should grow with N.
// The customers become pending 10,000 a transaction, within the balance
// interval of an emission of one customer; the next emission is theirs.
func BenchmarkPendingEmission(b *testing.B) {
	const chunk, batch = 1000, 10_000
	for _, n := range []int{10_000, 100_000} {
		custs := pendingCustomers(n)
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			var txns, visited int
			for b.Loop() {
				b.StopTimer()
				r := newPendingRun(b, chunk)
				r.events(custs[:1])
				r.commit()
				for i := 1; i < n; i += batch {
					r.events(custs[i:min(i+batch, n)])
					r.commit()
				}
				if len(r.pt.ent.pendingAt) != n-1 {
					b.Fatalf("%d customers pending, want %d", len(r.pt.ent.pendingAt), n-1)
				}
				v0 := r.pt.ent.visited
				b.StartTimer()
				for i := 0; len(r.pt.ent.pendingAt) > 0; i++ {
					r.tick(procBenchNow.Add(time.Second + time.Duration(1+i)*time.Millisecond))
					r.commit()
					txns++
				}
				b.StopTimer()
				visited += r.pt.ent.visited - v0
				r.close()
				b.StartTimer()
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(txns), "ns/txn")
			b.ReportMetric(float64(visited)/float64(txns), "visited/txn")
		})
	}
}
