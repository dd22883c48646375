package aggregator

import (
	"fmt"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/schemas"
)

// TestEntitlementsPeriodStartWithPendingBalances: the watermark enters a
// new period while customers with usage in the period that ended are
// pending (their last change's balance waits for the balance interval), as
// at any month end with live input. Each such customer gets exactly one
// balance of the new period (usage 0), whichever of the period start's
// chunks and the emission of the pending customers reaches it first; and no
// transaction carries more balances than the chunk (docs/design.md,
// Exactly-once, 7), the two together included. The broker time is the
// test's: it appends the ticks itself. A customer pending with usage in the
// new period only (n01) gets its balance too, once the period start's
// chunks are out.
func TestEntitlementsPeriodStartWithPendingBalances(t *testing.T) {
	const chunk = 2
	h := newEntHarness(t, nil, 1)
	d := time.Date(2026, 11, 10, 0, 0, 0, 0, time.UTC).UnixMilli()
	day := int64(24 * time.Hour / time.Millisecond)
	tick := func(at int64) []*kgo.Record {
		return h.shared(1, schemas.TickKey, &schemas.Tick{InstanceID: "test"}, at)
	}
	event := func(c string, at int64) *kgo.Record {
		return h.dedupedEvent(0, &schemas.DedupedEvent{EventID: c, CustomerID: c, Meter: "api_calls", Quantity: 3, EventTime: at, IngestTime: at})
	}
	recs := h.shared(1, schemas.DefaultPlanKey, &schemas.Entitlements{Plan: "free", Overdraft: schemas.Overdraft{Policy: schemas.OverdraftAllow},
		Caps: []schemas.Cap{{Meter: "api_calls", Limit: 100, OnLimit: schemas.OnLimitReject}}}, d-day)
	// c00's balance starts an emission at broker time d+600.
	recs = append(recs, h.watermark(0, 0, 1, d+1), event("c00", d+500))
	h.produce(append(recs, tick(d+600)...)...)
	meter := newTxnMeter(h.names)
	reg := prometheus.NewRegistry()
	cfg := h.entConfig("a", vfs.NewMem())
	cfg.Period, cfg.EntitlementsTick = Day, -1
	cfg.Stream.Registerer = reg
	cfg.Stream.ClientOptions = []kgo.Opt{kgo.WithHooks(meter)}
	setFinalChunk(&cfg, chunk)
	run := h.start(cfg)
	awaitBalances(t, h, "c00's usage 3", usageIs("c00", 3))
	// c01–c07 change at d+700, within the interval of that emission:
	// pending when the watermark enters the next day.
	recs = recs[:0]
	custs := []string{"c00"}
	for i := 1; i <= 7; i++ {
		c := fmt.Sprintf("c%02d", i)
		custs = append(custs, c)
		recs = append(recs, event(c, d+700+int64(i)))
	}
	h.produce(append(recs, tick(d+800)...)...)
	for deadline := time.Now().Add(30 * time.Second); pendingBalances(reg) != 7; {
		if time.Now().After(deadline) {
			t.Fatalf("%v customers pending, want 7", pendingBalances(reg))
		}
		time.Sleep(20 * time.Millisecond)
	}
	meter.reset()
	prunes := counterWith(reg, "meterline_aggregate_chunks_total", "work", "prune")
	wm := d + day + 5000
	h.produce(append([]*kgo.Record{h.watermark(0, 0, 1, wm), event("n01", wm+1)}, tick(wm+2)...)...)
	// The period start's balances are out once its prune phase has run,
	// and the pending customers once none is left.
	awaitPeriodStartDone(t, reg, prunes)
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}
	starts := map[string]int{}
	for _, b := range readTopic[schemas.Balance](t, h.brokers, h.names.BalancesTopic()) {
		if b.PeriodStart != d+day {
			continue
		}
		starts[b.CustomerID]++
		if want := map[bool]int64{true: 3}[b.CustomerID == "n01"]; len(b.Meters) != 1 || b.Meters[0].Usage != want {
			t.Errorf("%s's balance of the new day %+v, want usage %d", b.CustomerID, b, want)
		}
	}
	for _, c := range append(custs, "n01") {
		if starts[c] != 1 {
			t.Errorf("%s: %d balances of the new day, want 1", c, starts[c])
		}
	}
	if rep := meter.report(); rep.max.balances > chunk {
		t.Errorf("a transaction carried %d balances, more than the chunk of %d", rep.max.balances, chunk)
	}
}

// awaitPeriodStartDone waits until the period start's balances are out
// (its prune phase has run since prunes were counted) and no customer's
// balance is pending.
func awaitPeriodStartDone(t *testing.T, reg *prometheus.Registry, prunes float64) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); counterWith(reg, "meterline_aggregate_chunks_total", "work", "prune") == prunes || pendingBalances(reg) != 0; {
		if time.Now().After(deadline) {
			t.Fatalf("the period start's work not done: %v customers pending", pendingBalances(reg))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// pendingBalances returns the number of customers of partition 0 whose
// balance is pending.
func pendingBalances(reg *prometheus.Registry) float64 {
	v, _ := gaugeOf(reg, "meterline_aggregate_balances_pending", "partition", "0")
	return v
}

// TestEntitlementsPeriodStartAfterNewPeriodBalance: a customer whose change
// in the new period (an event that arrived there while the watermark was
// still in the period before) went out before the watermark entered the new
// period already has its balance of the new period, and nothing changed it
// since: the period start's chunks, which reach it for its usage in the
// period that ended, emit no second one (docs/entitlements.md, The
// aggregator, 4: at most one balance per transaction that changed the
// customer). A customer with usage in the period that ended only gets its
// balance of the new period from them, once.
func TestEntitlementsPeriodStartAfterNewPeriodBalance(t *testing.T) {
	h := newEntHarness(t, nil, 1)
	d := time.Date(2026, 11, 10, 0, 0, 0, 0, time.UTC).UnixMilli()
	day := int64(24 * time.Hour / time.Millisecond)
	tick := func(at int64) []*kgo.Record {
		return h.shared(1, schemas.TickKey, &schemas.Tick{InstanceID: "test"}, at)
	}
	event := func(id, c string, at int64) *kgo.Record {
		return h.dedupedEvent(0, &schemas.DedupedEvent{EventID: id, CustomerID: c, Meter: "api_calls", Quantity: 3, EventTime: at, IngestTime: at})
	}
	recs := h.shared(1, schemas.DefaultPlanKey, &schemas.Entitlements{Plan: "free", Overdraft: schemas.Overdraft{Policy: schemas.OverdraftAllow},
		Caps: []schemas.Cap{{Meter: "api_calls", Limit: 100, OnLimit: schemas.OnLimitReject}}}, d-day)
	recs = append(recs, h.watermark(0, 0, 1, d+1), event("a", "c00", d+500), event("b", "c01", d+501))
	h.produce(append(recs, tick(d+600)...)...)
	reg := prometheus.NewRegistry()
	cfg := h.entConfig("a", vfs.NewMem())
	cfg.Period, cfg.EntitlementsTick = Day, -1
	cfg.Stream.Registerer = reg
	run := h.start(cfg)
	awaitBalances(t, h, "c00's and c01's usage 3", func(bs map[string]*schemas.Balance) bool {
		return usageIs("c00", 3)(bs) && usageIs("c01", 3)(bs)
	})
	// c00's event of the next day, with the watermark still in this one:
	// its balance of the next day goes out.
	h.produce(append([]*kgo.Record{event("c", "c00", d+day+100)}, tick(d+day+200)...)...)
	awaitBalances(t, h, "c00's of the next day", func(bs map[string]*schemas.Balance) bool {
		return bs["c00"] != nil && bs["c00"].PeriodStart == d+day
	})
	prunes := counterWith(reg, "meterline_aggregate_chunks_total", "work", "prune")
	wm := d + day + 5000
	h.produce(append([]*kgo.Record{h.watermark(0, 0, 1, wm)}, tick(wm+1)...)...)
	awaitPeriodStartDone(t, reg, prunes)
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}
	starts := map[string][]int64{}
	for _, b := range readTopic[schemas.Balance](t, h.brokers, h.names.BalancesTopic()) {
		if b.PeriodStart == d+day && len(b.Meters) == 1 {
			starts[b.CustomerID] = append(starts[b.CustomerID], b.Meters[0].Usage)
		}
	}
	if got, want := fmt.Sprint(starts), "map[c00:[3] c01:[0]]"; got != want {
		t.Errorf("the usage of each balance of the next day by customer: %s, want %s", got, want)
	}
}
