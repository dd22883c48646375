package aggregator

import (
	"fmt"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/internal/benchinput"
	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/schemas"
)

// TestDefaultPlanSweepBalances (kfake; docs/ingest.md, The quota gate): a
// default-plan record writes a balance to every customer with usage in
// the period, in chunks of FinalChunk: five customers on the default plan
// at its cap of 2 each get one with the cap of 10 once the plan raises it
// at once, and one whose caps_until is the effective_from of a change the
// plan then schedules, which the quota gate stops trusting then. Without
// a balance, the gate would keep the cap of 2 until --gate-max-age. On
// kfake and, when METERLINE_TEST_KAFKA is set, on the real broker.
func TestDefaultPlanSweepBalances(t *testing.T) {
	t.Run("kfake", func(t *testing.T) { testDefaultPlanSweepBalances(t, nil) })
	t.Run("real", func(t *testing.T) { testDefaultPlanSweepBalances(t, testenv.RealKafka(t)) })
}

func testDefaultPlanSweepBalances(t *testing.T, brokers []string) {
	const n = 1
	h := newEntHarness(t, brokers, n)
	t0 := time.Now().Add(-90 * time.Second).Truncate(time.Second).UnixMilli()
	customers := []string{"d1", "d2", "d3", "d4", "d5"}
	recs := h.shared(n, schemas.DefaultPlanKey, capPlan("", 2, 0), t0)
	for i := range 2 * len(customers) {
		c, at := customers[i%len(customers)], t0+1000+int64(i)*100
		recs = append(recs, h.dedupedEvent(0, &schemas.DedupedEvent{EventID: fmt.Sprint(c, i), CustomerID: c, Meter: "api_calls",
			Quantity: 1, EventTime: at, IngestTime: at}))
	}
	h.produce(recs...)
	cfg := h.entConfig("a", vfs.NewMem())
	setFinalChunk(&cfg, 2)
	run := h.start(cfg)
	t.Cleanup(func() {
		if err := run.stop(); err != nil {
			t.Error(err)
		}
	})
	awaitBalances(t, h, "at the cap of 2", atCap(2, customers...))

	t1 := time.Now().UnixMilli()
	h.produce(h.shared(n, schemas.DefaultPlanKey, capPlan("", 10, 0), t1)...)
	awaitBalances(t, h, "at 2 of the raised cap of 10", func(bs map[string]*schemas.Balance) bool {
		for _, c := range customers {
			if bs[c].UpdatedAt < t1 || bs[c].CapsUntil != 0 {
				return false
			}
		}
		return atCap(10, customers...)(bs)
	})

	view := GateView(t, h.brokers, h.names.BalancesTopic())
	t2 := time.Now().UnixMilli()
	from := t2 + 4000
	h.produce(h.shared(n, schemas.DefaultPlanKey, capPlan("", 20, from), t2)...)
	bs := awaitBalances(t, h, "at the cap of 10 until the scheduled 20", func(bs map[string]*schemas.Balance) bool {
		for _, c := range customers {
			if bs[c].CapsUntil != from {
				return false
			}
		}
		return atCap(10, customers...)(bs)
	})
	// The gate trusts d1's balance until the change takes effect, then
	// no longer.
	deadline := time.Now().Add(30 * time.Second)
	for rev, _ := view("d1"); rev < bs["d1"].Revision; rev, _ = view("d1") {
		if time.Now().After(deadline) {
			t.Fatalf("the gate's view has d1's balance revision %d after 30s, want %d", rev, bs["d1"].Revision)
		}
		time.Sleep(10 * time.Millisecond)
	}
	for _, ok := view("d1"); ok; _, ok = view("d1") {
		if time.Now().After(deadline) {
			t.Fatal("the gate still trusts d1's balance 30s after the default plan's change took effect")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if late := time.Now().UnixMilli() - from; late > 2000 || late < -100 {
		t.Errorf("the gate stopped trusting d1's balance %dms after the default plan's change took effect, want within 2s", late)
	}
}

// defaultPlan reads into the open transaction a default-plan record with
// api_calls capped at limit, of broker time at.
func (r *pendingRun) defaultPlan(limit int64, at time.Time) {
	r.tb.Helper()
	p := benchinput.Plan()
	p.Caps[0].Limit = limit
	r.process([]*kgo.Record{{Topic: r.names.EntitlementsTopic(), Offset: r.entOff, Key: []byte(schemas.DefaultPlanKey),
		Value: schemas.MustEncode(p), Timestamp: at}})
	r.entOff++
}

// sweptLimits returns, per customer, the api_calls limit of each balance
// the transactions committed since the last call emitted.
func (r *pendingRun) sweptLimits(into map[string][]int64) {
	r.tb.Helper()
	for _, rec := range r.l.TakeOutput() {
		if rec.Topic != r.names.BalancesTopic() {
			continue
		}
		var b schemas.Balance
		if err := schemas.DecodeInto(rec.Value, &b); err != nil {
			r.tb.Fatal(err)
		}
		limit := int64(-1)
		for _, m := range b.Meters {
			if m.Meter == "api_calls" {
				limit = m.Limit
			}
		}
		into[b.CustomerID] = append(into[b.CustomerID], limit)
	}
}

// sweepRun is n customers with usage in the period, their balances out,
// then a default-plan record capping api_calls at 5,000 read, and one of
// them (the last) pending again after it: the sweep's start.
func sweepRun(t *testing.T, n, chunk int) (*pendingRun, []string) {
	r := newPendingRun(t, chunk)
	custs := pendingCustomers(n)
	r.events(custs)
	r.commit()
	for works := 0; r.l.HasWork(); works++ {
		if works > n {
			t.Fatal("no end to the emission of the pending customers")
		}
		if _, err := r.l.Work(); err != nil {
			t.Fatal(err)
		}
		r.commit()
	}
	if len(r.pt.ent.pendingAt) != 0 {
		t.Fatalf("%d customers pending before the default-plan record, want none", len(r.pt.ent.pendingAt))
	}
	r.l.Keep()
	r.defaultPlan(5000, procBenchNow.Add(10*time.Millisecond))
	r.tick(procBenchNow.Add(11 * time.Millisecond))
	r.commit()
	r.eventsAt(custs[n-1:], procBenchNow.Add(11*time.Millisecond))
	r.tick(procBenchNow.Add(12 * time.Millisecond))
	r.commit()
	last := fmt.Sprintf("cust-%05d", custs[n-1])
	if _, ok := r.pt.ent.pendingAt[last]; !ok {
		t.Fatalf("%s not pending after its event", last)
	}
	names := make([]string, n)
	for i, c := range custs {
		names[i] = fmt.Sprintf("cust-%05d", c)
	}
	return r, names
}

// TestDefaultPlanSweepInChunksAfterAbort: a default-plan record's balances
// go out in chunks of FinalChunk, one Work transaction each, with the
// cursor in the state (docs/design.md, Exactly-once, 7); a chunk's
// transaction aborted (its emitted balances dropped, the partition
// reloaded from the committed state, as after a crash) goes again from the
// committed cursor: every customer with usage gets one balance with the
// new cap, none is skipped or gets two, a pending customer's balance goes
// out once and it is no longer pending, and the sweep takes the chunks it
// needs.
func TestDefaultPlanSweepInChunksAfterAbort(t *testing.T) {
	const n, chunk = 40, 7
	r, names := sweepRun(t, n, chunk)
	sweeps := func() float64 { return testutil.ToFloat64(r.pt.pr.m.chunks.WithLabelValues("default_plan")) }
	s0 := sweeps()
	got := map[string][]int64{}
	r.sweptLimits(got) // the pending customer's event: no balance yet
	aborted := 0
	for works := 0; r.l.HasWork(); works++ {
		if works > 10*n {
			t.Fatal("no end to the work")
		}
		mid := r.pt.ent.sweep.cursor != ""
		if _, err := r.l.Work(); err != nil {
			t.Fatal(err)
		}
		if mid && aborted < 3 && works%2 == 0 {
			r.l.Abort()
			aborted++
			continue
		}
		r.commit()
		r.sweptLimits(got)
	}
	if aborted == 0 {
		t.Fatal("no chunk of the sweep aborted")
	}
	for _, c := range names {
		if l := got[c]; len(l) != 1 || l[0] != 5000 {
			t.Errorf("%s's balances after the default-plan record have the limits %v, want one of 5000", c, l)
		}
	}
	if len(got) != n {
		t.Errorf("%d customers got a balance, want %d", len(got), n)
	}
	if len(r.pt.ent.pendingAt) != 0 || r.pt.ent.sweep.active {
		t.Errorf("after the sweep: %d customers pending, sweep active %v; want none, idle", len(r.pt.ent.pendingAt), r.pt.ent.sweep.active)
	}
	if c, want := sweeps()-s0, float64((n+chunk-1)/chunk); c != want && c != want+1 {
		t.Errorf("%v sweep chunks committed for %d customers in chunks of %d, want %v (or one more, empty)", c, n, chunk, want)
	}
}

// TestDefaultPlanSweepRestarts: a second default-plan record read while
// the first one's balances go out starts them again from the first
// customer: every customer's last balance has the second's cap, those
// the first reached get one of each, the others one.
func TestDefaultPlanSweepRestarts(t *testing.T) {
	const n, chunk = 30, 4
	r, names := sweepRun(t, n, chunk)
	got := map[string][]int64{}
	for range 2 {
		if _, err := r.l.Work(); err != nil {
			t.Fatal(err)
		}
		r.commit()
	}
	if r.pt.ent.sweep.cursor != names[2*chunk-1] {
		t.Fatalf("the sweep's cursor after two chunks: %q, want %q", r.pt.ent.sweep.cursor, names[2*chunk-1])
	}
	r.defaultPlan(6000, procBenchNow.Add(20*time.Millisecond))
	r.tick(procBenchNow.Add(21 * time.Millisecond))
	r.commit()
	for works := 0; r.l.HasWork(); works++ {
		if works > 10*n {
			t.Fatal("no end to the work")
		}
		if _, err := r.l.Work(); err != nil {
			t.Fatal(err)
		}
		r.commit()
	}
	r.sweptLimits(got)
	for i, c := range names {
		want := []int64{6000}
		if i < 2*chunk {
			want = []int64{5000, 6000}
		}
		if fmt.Sprint(got[c]) != fmt.Sprint(want) {
			t.Errorf("%s's balances after the default-plan records have the limits %v, want %v", c, got[c], want)
		}
	}
}
