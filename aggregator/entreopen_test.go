package aggregator

import (
	"testing"
	"time"

	"github.com/meterline/meterline/schemas"
)

// TestReopenBalances (kfake; ingest.md, The quota gate): the changes an
// operator makes to unblock a customer held at its cap each write the
// customer a balance the gate lets through by: its own record made
// unmetered (the balance says unmetered), and its record deleted (a
// tombstone: the balance is the default plan's, whose cap of 10 it is
// under). Without those balances the gate would hold both until
// --gate-max-age. A raise scheduled for later writes none when it takes
// effect (TestCapRaiseBalances); the remedy ingest.md gives, the same
// record written again once it is in effect, writes one with the raise.
func TestReopenBalances(t *testing.T) {
	const n = 1
	h := newEntHarness(t, nil, n)
	t0 := time.Now().Add(-90 * time.Second).Truncate(time.Second).UnixMilli()
	recs := h.shared(n, schemas.DefaultPlanKey, capPlan("", 10, 0), t0)
	recs = append(recs, h.entitlement(n, capPlan("unm", 2, 0), t0), h.entitlement(n, capPlan("del", 2, 0), t0),
		h.entitlement(n, capPlan("sched", 2, 0), t0))
	startCapRun(t, h, t0, recs, "unm", "del", "sched", "unm", "del", "sched")
	awaitBalances(t, h, "at the cap of 2", atCap(2, "unm", "del", "sched"))

	t1 := time.Now().UnixMilli()
	unm := capPlan("unm", 2, 0)
	unm.Plan, unm.Unmetered, unm.Caps = "unlimited", true, nil
	del := h.entitlement(n, capPlan("del", 2, 0), t1)
	del.Value = nil
	sched := capPlan("sched", 10, t1+500)
	h.produce(h.entitlement(n, unm, t1), del, h.entitlement(n, sched, t1))
	bs := awaitBalances(t, h, "unm's unmetered and del's of the default plan", func(bs map[string]*schemas.Balance) bool {
		return bs["unm"].UpdatedAt >= t1 && bs["del"].UpdatedAt >= t1 && bs["sched"].UpdatedAt >= t1
	})
	if b := bs["unm"]; !b.Unmetered || b.Plan != "unlimited" {
		t.Errorf("unm's balance after its unmetered record: plan %q, unmetered %v", b.Plan, b.Unmetered)
	}
	if b := bs["del"]; b.Plan != "cap-10" || len(b.Meters) != 1 || b.Meters[0].Limit != 10 || b.Meters[0].Usage != 2 {
		t.Errorf("del's balance after its tombstone: plan %q, meters %+v; want cap-10, 2 of 10", b.Plan, b.Meters)
	}

	// sched's raise is in effect from t1 + 500ms; its balance then still
	// says 2 until its record is written again.
	for time.Now().UnixMilli() < t1+1000 {
		time.Sleep(20 * time.Millisecond)
	}
	if b := latestBalances(t, h)["sched"]; b.Meters[0].Limit != 2 {
		t.Errorf("sched's balance before its record is written again: limit %d, want 2", b.Meters[0].Limit)
	}
	h.produce(h.entitlement(n, sched, time.Now().UnixMilli()))
	awaitBalances(t, h, "sched's raised by its record written again", atCap(10, "sched"))
}
