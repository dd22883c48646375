package aggregator

import (
	"fmt"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/schemas"
)

// capPlan is customer's record ("": the default plan's) capping api_calls
// at limit (plan cap-<limit>), effective from from.
func capPlan(customer string, limit, from int64) *schemas.Entitlements {
	return &schemas.Entitlements{CustomerID: customer, Plan: fmt.Sprint("cap-", limit), EffectiveFrom: from,
		Overdraft: schemas.Overdraft{Policy: schemas.OverdraftAllow},
		Caps:      []schemas.Cap{{Meter: "api_calls", Limit: limit, OnLimit: schemas.OnLimitReject}}}
}

// startCapRun produces recs, then one api_call of each of customers, 100ms
// apart from t0 + 1s on, and starts instance a with entitlements, stopped
// when the test ends.
func startCapRun(t *testing.T, h *aggHarness, t0 int64, recs []*kgo.Record, customers ...string) {
	for i, c := range customers {
		at := t0 + 1000 + int64(i)*100
		recs = append(recs, h.dedupedEvent(0, &schemas.DedupedEvent{EventID: fmt.Sprint(c, i), CustomerID: c, Meter: "api_calls",
			Quantity: 1, EventTime: at, IngestTime: at}))
	}
	h.produce(recs...)
	run := h.start(h.entConfig("a", vfs.NewMem()))
	t.Cleanup(func() {
		if err := run.stop(); err != nil {
			t.Error(err)
		}
	})
}

// atCap reports whether each customer's last balance has a usage of 2 of
// the limit.
func atCap(limit int64, customers ...string) func(map[string]*schemas.Balance) bool {
	return func(bs map[string]*schemas.Balance) bool {
		for _, c := range customers {
			b := bs[c]
			if b == nil || len(b.Meters) != 1 || b.Meters[0].Usage != 2 || b.Meters[0].Limit != limit {
				return false
			}
		}
		return true
	}
}

// TestCapRaiseBalances (kfake; docs/entitlements.md, Topics, and
// ingest.md, The quota gate): a customer's own record that raises its cap
// at once writes the customer a balance with the new cap; a record
// scheduled for later (effective_from) writes one as of its broker time,
// with the cap then and caps_until its effective_from, and none when it
// takes effect; the default plan's record writes a balance to every
// customer with usage in the period (entsweep.go), with its cap. The
// quota gate therefore opens at once for the first and the third, and at
// the raise's effective time for the second (caps_until): own, sched and
// def each reach a cap of 2, then theirs is raised to 10, and own's and
// def's last balances say 10, sched's 2 until its raise.
func TestCapRaiseBalances(t *testing.T) {
	const n = 1
	h := newEntHarness(t, nil, n)
	t0 := time.Now().Add(-90 * time.Second).Truncate(time.Second).UnixMilli()
	recs := h.shared(n, schemas.DefaultPlanKey, capPlan("", 2, 0), t0)
	recs = append(recs, h.entitlement(n, capPlan("own", 2, 0), t0), h.entitlement(n, capPlan("sched", 2, 0), t0))
	startCapRun(t, h, t0, recs, "own", "sched", "def", "own", "sched", "def")
	awaitBalances(t, h, "at the cap of 2", atCap(2, "own", "sched", "def"))

	// Raised, read after the ticks the aggregator stamped with the wall
	// clock: own's at once, sched's from t1 + 1s on, the default plan's.
	t1 := time.Now().UnixMilli()
	recs = append(h.shared(n, schemas.DefaultPlanKey, capPlan("", 10, 0), t1),
		h.entitlement(n, capPlan("own", 10, 0), t1), h.entitlement(n, capPlan("sched", 10, t1+1000), t1))
	// A customer's event after all that: its balance goes out after the
	// records' changes have been flushed.
	recs = append(recs, h.dedupedEvent(0, &schemas.DedupedEvent{EventID: "later", CustomerID: "later", Meter: "api_calls",
		Quantity: 1, EventTime: t1 + 2000, IngestTime: t1 + 2000}))
	h.produce(recs...)
	bs := awaitBalances(t, h, "own's and def's raised, sched's of its record, later's out", func(bs map[string]*schemas.Balance) bool {
		return atCap(10, "own", "def")(bs) && bs["sched"].UpdatedAt >= t1 && bs["later"] != nil
	})
	if b := bs["sched"]; b.Meters[0].Limit != 2 || b.CapsUntil != t1+1000 {
		t.Errorf("sched's last balance has the limit %d and caps_until %d, want 2 (no balance when its raised cap takes effect) and %d",
			b.Meters[0].Limit, b.CapsUntil, t1+1000)
	}
	if b := bs["def"]; b.UpdatedAt < t1 || b.CapsUntil != 0 {
		t.Errorf("def's last balance as of %d with caps_until %d, want one as of the default plan's record (%d or later) with 0",
			b.UpdatedAt, b.CapsUntil, t1)
	}
	if b := bs["later"]; b.Meters[0].Limit != 10 {
		t.Errorf("later's balance has the limit %d, want the default plan's 10", b.Meters[0].Limit)
	}
}

// TestSteppedBackRecordBalance (kfake; docs/entitlements.md, The ordering
// rule: broker time): a customer's record whose broker time is behind the
// latest one read from its partition (a broker clock that stepped back)
// counts as read at that latest time, and so does the balance it writes:
// a cap raised so shows in the customer's next balance, as the aggregator
// now decides it. A balance as of the record's own broker time would say
// the cap before it.
func TestSteppedBackRecordBalance(t *testing.T) {
	const n = 1
	h := newEntHarness(t, nil, n)
	t0 := time.Now().Add(-90 * time.Second).Truncate(time.Second).UnixMilli()
	// The partition is read up to now before the raise below, stamped 5s
	// after t0: behind.
	recs := append([]*kgo.Record{h.entitlement(n, capPlan("acme", 2, 0), t0)},
		h.shared(n, schemas.TickKey, &schemas.Tick{InstanceID: "test"}, time.Now().UnixMilli())...)
	startCapRun(t, h, t0, recs, "acme", "acme")
	awaitBalances(t, h, "usage 2 of 2", atCap(2, "acme"))
	n0 := len(balancesOf(t, h, "acme"))
	h.produce(h.entitlement(n, capPlan("acme", 10, 0), t0+5000))
	deadline := time.Now().Add(30 * time.Second)
	for len(balancesOf(t, h, "acme")) == n0 {
		if time.Now().After(deadline) {
			t.Fatal("no balance of acme after its record after 30s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	bs := balancesOf(t, h, "acme")
	if b := bs[len(bs)-1]; b.Plan != "cap-10" || b.Meters[0].Limit != 10 {
		t.Errorf("acme's balance after its raise: plan %q, limit %d as of %d; want cap-10's 10", b.Plan, b.Meters[0].Limit, b.UpdatedAt)
	}
}

// TestBalanceCapsUntil (kfake; docs/entitlements.md, Topics): a balance
// carries, as caps_until, when a change the aggregator has read takes
// effect for the customer's caps: dflt, on the default plan, whose
// balance is written after the default plan's raise scheduled for t1 +
// 45s was read, carries that time; own, whose own record shields it from
// the default plan, carries 0 until its own raise, scheduled for t1 +
// 30s, is read, then that time; a balance written with nothing scheduled
// carries 0.
func TestBalanceCapsUntil(t *testing.T) {
	const n = 1
	h := newEntHarness(t, nil, n)
	t0 := time.Now().Add(-90 * time.Second).Truncate(time.Second).UnixMilli()
	recs := h.shared(n, schemas.DefaultPlanKey, capPlan("", 2, 0), t0)
	recs = append(recs, h.entitlement(n, capPlan("own", 2, 0), t0))
	startCapRun(t, h, t0, recs, "own", "dflt")
	bs := awaitBalances(t, h, "usage 1 each", func(bs map[string]*schemas.Balance) bool {
		return usageIs("own", 1)(bs) && usageIs("dflt", 1)(bs)
	})
	for _, c := range []string{"own", "dflt"} {
		if bs[c].CapsUntil != 0 {
			t.Errorf("%s's balance with nothing scheduled: caps_until %d, want 0", c, bs[c].CapsUntil)
		}
	}

	// The default plan's raise, scheduled; then an event of each: their
	// balances go out after the record is read.
	t1 := time.Now().UnixMilli()
	recs = h.shared(n, schemas.DefaultPlanKey, capPlan("", 10, t1+45_000), t1)
	for _, c := range []string{"own", "dflt"} {
		recs = append(recs, h.dedupedEvent(0, &schemas.DedupedEvent{EventID: c + "-late", CustomerID: c, Meter: "api_calls",
			Quantity: 1, EventTime: t1 + 1000, IngestTime: t1 + 1000}))
	}
	h.produce(recs...)
	bs = awaitBalances(t, h, "usage 2 each", func(bs map[string]*schemas.Balance) bool {
		return usageIs("own", 2)(bs) && usageIs("dflt", 2)(bs)
	})
	if b := bs["dflt"]; b.Meters[0].Limit != 2 || b.CapsUntil != t1+45_000 {
		t.Errorf("dflt's balance after the default plan's scheduled raise: limit %d, caps_until %d; want 2 until %d",
			b.Meters[0].Limit, b.CapsUntil, t1+45_000)
	}
	if b := bs["own"]; b.CapsUntil != 0 {
		t.Errorf("own's balance after the default plan's scheduled raise: caps_until %d, want 0 (its own record decides)", b.CapsUntil)
	}

	// own's own raise, scheduled: its balance, written when it is read.
	t2 := time.Now().UnixMilli()
	h.produce(h.entitlement(n, capPlan("own", 10, t2+30_000), t2))
	bs = awaitBalances(t, h, "own's of its record", func(bs map[string]*schemas.Balance) bool { return bs["own"].UpdatedAt >= t2 })
	if b := bs["own"]; b.Meters[0].Limit != 2 || b.CapsUntil != t2+30_000 {
		t.Errorf("own's balance after its scheduled raise: limit %d, caps_until %d; want 2 until %d", b.Meters[0].Limit, b.CapsUntil, t2+30_000)
	}
}
