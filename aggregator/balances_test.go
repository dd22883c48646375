package aggregator

import (
	"fmt"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/internal/fault"
	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/schemas"
)

// balancesOf returns the balances of customer in usage.balances, in
// offset order (one partition).
func balancesOf(t testing.TB, h *aggHarness, customer string) []*schemas.Balance {
	t.Helper()
	var out []*schemas.Balance
	for _, b := range readTopic[schemas.Balance](t, h.brokers, h.names.BalancesTopic()) {
		if b.CustomerID == customer {
			out = append(out, b)
		}
	}
	return out
}

// awaitBalances waits until the customers' last balances satisfy ok, and
// returns them.
func awaitBalances(t testing.TB, h *aggHarness, what string, ok func(map[string]*schemas.Balance) bool) map[string]*schemas.Balance {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		bs := latestBalances(t, h)
		if ok(bs) {
			return bs
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 30s the balances are not %s: %v", what, bs)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// usageIs reports whether customer's last balance says usage of its one
// capped meter.
func usageIs(customer string, usage int64) func(map[string]*schemas.Balance) bool {
	return func(bs map[string]*schemas.Balance) bool {
		b := bs[customer]
		return b != nil && len(b.Meters) == 1 && b.Meters[0].Usage == usage
	}
}

// balanceRun is the world of the balance tests: one partition, customer
// acme capped at 1,000 api_calls a month, and one-unit events for it
// that arrived in November (before every tick the aggregator appends,
// stamped with the wall clock).
type balanceRun struct {
	t  *testing.T
	h  *aggHarness
	fs vfs.FS
	t0 int64
	n  int // events sent
}

func newBalanceRun(t *testing.T) *balanceRun {
	h := newEntHarness(t, nil, 1)
	t0 := time.Date(2026, 11, 10, 0, 0, 0, 0, time.UTC).UnixMilli()
	h.produce(h.entitlement(1, &schemas.Entitlements{CustomerID: "acme", Plan: "free", Overdraft: schemas.Overdraft{Policy: schemas.OverdraftAllow},
		Caps: []schemas.Cap{{Meter: "api_calls", Limit: 1000, OnLimit: schemas.OnLimitReject}}}, t0))
	return &balanceRun{t: t, h: h, fs: vfs.NewMem(), t0: t0}
}

// config is the aggregator's, with BalanceInterval interval.
func (r *balanceRun) config(interval time.Duration) Config {
	cfg := r.h.entConfig("a", r.fs)
	cfg.BalanceInterval = interval
	cfg.Stream.Registerer = prometheus.NewRegistry()
	return cfg
}

// event sends the next event and waits until it is decided: each event is
// decided, and changes acme, in a transaction of its own.
func (r *balanceRun) event() {
	r.t.Helper()
	r.n++
	at := r.t0 + int64(r.n)*1000
	r.h.produce(r.h.dedupedEvent(0, &schemas.DedupedEvent{EventID: fmt.Sprintf("e%d", r.n), CustomerID: "acme", Meter: "api_calls",
		Quantity: 1, EventTime: at, IngestTime: at}))
	awaitDecided(r.t, r.h, r.n)
}

// first sends the first event and waits for its balance, which goes out
// at once (the partition's first emission, or an hour of broker time
// after the one of the plan's record: the wall clock's ticks are weeks
// after it); it returns the number of balances then.
func (r *balanceRun) first() int {
	r.t.Helper()
	r.event()
	awaitBalances(r.t, r.h, "usage 1", usageIs("acme", 1))
	return len(balancesOf(r.t, r.h, "acme"))
}

// advance writes a tick two hours of broker time ahead of the wall clock
// to the entitlements partition: the partition's broker time jumps there.
func (r *balanceRun) advance() {
	r.h.produce(r.h.shared(1, schemas.TickKey, &schemas.Tick{InstanceID: "test"}, time.Now().Add(2*time.Hour).UnixMilli())...)
}

// checkOneMore waits for the balance of all r.n events, then checks that
// it is the one balance after the n0 before (why says what that shows),
// with increasing revisions, as of the latest event's time.
func (r *balanceRun) checkOneMore(n0 int, why string) {
	r.t.Helper()
	awaitBalances(r.t, r.h, fmt.Sprintf("usage %d", r.n), usageIs("acme", int64(r.n)))
	bs := balancesOf(r.t, r.h, "acme")
	if len(bs) != n0+1 {
		r.t.Errorf("%d balances, want %d: %s", len(bs), n0+1, why)
	}
	checkRevisions(r.t, bs)
	if last, at := bs[len(bs)-1], r.t0+int64(r.n)*1000; last.UpdatedAt != at {
		r.t.Errorf("the balance with usage %d is as of %d, want its latest change's time %d", last.Meters[0].Usage, last.UpdatedAt, at)
	}
}

// checkRevisions checks that acme's balances have increasing revisions.
func checkRevisions(t *testing.T, bs []*schemas.Balance) {
	t.Helper()
	for i := 1; i < len(bs); i++ {
		if bs[i].Revision <= bs[i-1].Revision {
			t.Errorf("balance %d has revision %d after %d", i, bs[i].Revision, bs[i-1].Revision)
		}
	}
}

// TestBalancesCoalesced: five transactions change a customer within one
// --balance-interval (an hour) of broker time; its first change goes out
// at once, the next four stay pending (its pending key written once, the
// later changes' times kept with its account), and once the partition's broker
// time is an hour on, one balance carries all of them: two balances in
// all, not five, the last one right.
func TestBalancesCoalesced(t *testing.T) {
	r := newBalanceRun(t)
	r.h.start(r.config(time.Hour))
	n0 := r.first()
	for range 4 {
		r.event()
	}
	if bs := balancesOf(t, r.h, "acme"); len(bs) != n0 {
		t.Fatalf("%d balances after four more transactions within the interval, want %d (those four pending)", len(bs), n0)
	}
	// The four changes changed acme's account: the first wrote its
	// pending key, the later three noted their times in the account.
	pending := 0
	for _, rec := range testenv.ReadAll(t, r.h.brokers, r.h.names.AggregateChangelogTopic()) {
		if string(rec.Key) == string(pendingKey("acme")) && rec.Value != nil {
			pending++
		}
	}
	if pending != 1 {
		t.Errorf("acme's pending key was written %d times in four transactions within the interval, want once", pending)
	}
	r.advance()
	r.checkOneMore(n0, "the four pending changes in one")
}

// TestBalancePendingWhileIdle: a customer changed within the interval of
// its last balance is pending; with no input at all afterwards, the
// aggregator's ticks move the partition's broker time (the wall clock
// here) and its balance goes out once the interval has passed.
func TestBalancePendingWhileIdle(t *testing.T) {
	const interval = 2 * time.Second
	r := newBalanceRun(t)
	r.h.start(r.config(interval))
	n0 := r.first()
	first := time.Now()
	r.event()
	if time.Since(first) < interval*3/4 {
		if bs := balancesOf(t, r.h, "acme"); len(bs) != n0 {
			t.Fatalf("%d balances right after the second change, want %d (the second pending for the interval)", len(bs), n0)
		}
	} else {
		t.Logf("the second event took %s to be decided: its balance may be out already", time.Since(first))
	}
	awaitBalances(t, r.h, "usage 2", usageIs("acme", 2))
	if bs := balancesOf(t, r.h, "acme"); len(bs) != n0+1 {
		t.Errorf("%d balances, want %d", len(bs), n0+1)
	}
}

// TestBalancePendingSurvivesCrash: a customer whose change is committed
// and whose balance is pending when the aggregator crashes (in-process,
// before a later transaction commits) gets its balance after the
// restart, once the broker time has moved an interval on: once, with
// every change.
func TestBalancePendingSurvivesCrash(t *testing.T) {
	r := newBalanceRun(t)
	fault.SetHandler(fault.CrashHandler)
	t.Cleanup(func() { fault.SetHandler(nil); _ = fault.Arm("") })
	run := r.h.start(r.config(time.Hour))
	n0 := r.first()
	r.event()
	r.event()
	if bs := balancesOf(t, r.h, "acme"); len(bs) != n0 {
		t.Fatalf("%d balances, want %d (the second and third changes pending)", len(bs), n0)
	}
	// The ticks the pending customer keeps coming make transactions: the
	// next one crashes before it commits.
	if err := fault.Arm(fault.BeforeCommit); err != nil {
		t.Fatal(err)
	}
	run.awaitCrash(t, "no transaction after the pending change: the aggregator did not crash")
	_ = fault.Arm("")
	r.h.start(r.config(time.Hour))
	r.advance()
	// As of its latest change, as without the crash: not as of the change
	// that made acme pending.
	r.checkOneMore(n0, "the pending changes once, across the crash")
}

// TestBalanceEveryTransaction: with BalanceEveryTransaction each
// transaction that changes a customer emits its balance, as before
// balances were coalesced; and a customer left pending by an earlier run
// with an interval goes out too.
func TestBalanceEveryTransaction(t *testing.T) {
	r := newBalanceRun(t)
	run := r.h.start(r.config(time.Hour))
	n0 := r.first()
	r.event()
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}
	if bs := balancesOf(t, r.h, "acme"); len(bs) != n0 {
		t.Fatalf("%d balances, want %d (the second change pending)", len(bs), n0)
	}
	r.h.start(r.config(BalanceEveryTransaction))
	awaitBalances(t, r.h, "usage 2", usageIs("acme", 2))
	for i := range 3 {
		r.event()
		awaitBalances(t, r.h, fmt.Sprint("usage ", 3+i), usageIs("acme", int64(3+i)))
	}
	bs := balancesOf(t, r.h, "acme")
	if len(bs) != n0+4 {
		t.Errorf("%d balances, want %d: the pending one, and one per transaction after", len(bs), n0+4)
	}
	checkRevisions(t, bs)
}

// TestIdleTicksStop: an aggregator with entitlements appends ticks to its
// entitlements partitions while records arrive, and none once a partition
// is idle (nothing gated, no balance pending, no input); an event that
// arrives then waits in the gate for the next tick, which it makes the
// aggregator append, and is decided.
func TestIdleTicksStop(t *testing.T) {
	const n = 2
	h := newEntHarness(t, nil, n)
	ticks := func() int { return countTicks(t, h) }
	ev := func(id string) *kgo.Record {
		now := time.Now().UnixMilli()
		return h.dedupedEvent(schemas.Partition(schemas.CustomerKey(id), n), &schemas.DedupedEvent{EventID: id, CustomerID: id,
			Meter: "api_calls", Quantity: 1, EventTime: now, IngestTime: now})
	}
	cfg := h.entConfig("a", vfs.NewMem()) // a tick every 20ms when needed
	h.start(cfg)
	h.produce(ev("first"))
	awaitDecided(t, h, 1)
	// Idle: wait until the count of ticks holds still, then for 50 tick
	// intervals.
	deadline := time.Now().Add(10 * time.Second)
	before := ticks()
	for {
		time.Sleep(200 * time.Millisecond)
		now := ticks()
		if now == before {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("ticks keep coming on idle partitions: %d, then %d", before, now)
		}
		before = now
	}
	time.Sleep(50 * cfg.EntitlementsTick)
	if after := ticks(); after != before {
		t.Fatalf("%d ticks appended in %s with every partition idle, want none", after-before, 50*cfg.EntitlementsTick)
	}
	start := time.Now()
	h.produce(ev("second"))
	awaitDecided(t, h, 2)
	t.Logf("%d ticks before idling; an event after it decided in %s", before, time.Since(start))
}

// TestBalancePendingKeyWrittenOnlyWhilePending: a customer whose balance
// goes out in the transaction that made it pending (the partition's first
// emission, one whose interval has passed) leaves no record of its pending
// key in the changelog, neither the key nor its delete; one left pending
// across transactions has its key written, then deleted with its balance.
// So every delete of the key follows a write of it, and the key is gone
// once nothing is pending.
func TestBalancePendingKeyWrittenOnlyWhilePending(t *testing.T) {
	r := newBalanceRun(t)
	r.h.start(r.config(time.Hour))
	n0 := r.first()
	r.event()
	r.advance()
	r.checkOneMore(n0, "the pending change")
	var seq []string
	for _, rec := range testenv.ReadAll(t, r.h.brokers, r.h.names.AggregateChangelogTopic()) {
		if string(rec.Key) != string(pendingKey("acme")) {
			continue
		}
		if rec.Value == nil {
			seq = append(seq, "delete")
		} else {
			seq = append(seq, "put")
		}
	}
	if len(seq) == 0 || seq[len(seq)-1] != "delete" {
		t.Fatalf("acme's pending key in the changelog: %v, want it deleted last (its balance out)", seq)
	}
	for i, op := range seq {
		if want := []string{"put", "delete"}[i%2]; op != want {
			t.Fatalf("acme's pending key in the changelog: %v: record %d is a %s, want a %s (a delete only of a key written)", seq, i, op, want)
		}
	}
}
