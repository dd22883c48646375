package aggregator

import (
	"testing"
	"time"

	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/schemas"
)

// GateView follows the balances topic on brokers as an ingest replica's
// quota gate does (ingest.Balances), and returns a function that reports
// the revision of a customer's latest balance the view holds (0: none)
// and whether the gate may decide the customer's events by it (Trusted,
// with the default --gate-max-age). It is set by gateview_test.go, of the
// external test package: this one cannot import ingest, which imports it.
var GateView func(t testing.TB, brokers []string, topic string) func(customer string) (rev int64, trusted bool)

// TestReopenBalances (on kfake and, when METERLINE_TEST_KAFKA is set, on
// the real broker; ingest.md, The quota gate): the changes an
// operator makes to unblock a customer held at its cap each reopen the
// gate without --gate-max-age: its own record made unmetered (its
// balance, written at once, says unmetered), its record deleted (a
// tombstone: the balance is the default plan's, whose cap of 10 it is
// under), and a raise scheduled for later (effective_from): the balance
// written when its record is read still says the cap of 2, with
// caps_until its effective_from, and the gate stops trusting it then, with
// no balance written when the raise takes effect.
func TestReopenBalances(t *testing.T) {
	t.Run("kfake", func(t *testing.T) { testReopenBalances(t, nil) })
	t.Run("real", func(t *testing.T) { testReopenBalances(t, testenv.RealKafka(t)) })
}

func testReopenBalances(t *testing.T, brokers []string) {
	const n = 1
	h := newEntHarness(t, brokers, n)
	t0 := time.Now().Add(-90 * time.Second).Truncate(time.Second).UnixMilli()
	recs := h.shared(n, schemas.DefaultPlanKey, capPlan("", 10, 0), t0)
	recs = append(recs, h.entitlement(n, capPlan("unm", 2, 0), t0), h.entitlement(n, capPlan("del", 2, 0), t0),
		h.entitlement(n, capPlan("sched", 2, 0), t0))
	startCapRun(t, h, t0, recs, "unm", "del", "sched", "unm", "del", "sched")
	bs := awaitBalances(t, h, "at the cap of 2", atCap(2, "unm", "del", "sched"))
	if b := bs["sched"]; b.CapsUntil != 0 {
		t.Errorf("sched's balance with nothing scheduled: caps_until %d, want 0", b.CapsUntil)
	}
	view := GateView(t, h.brokers, h.names.BalancesTopic())

	t1 := time.Now().UnixMilli()
	const raiseIn = 4000 // ms after t1
	unm := capPlan("unm", 2, 0)
	unm.Plan, unm.Unmetered, unm.Caps = "unlimited", true, nil
	del := h.entitlement(n, capPlan("del", 2, 0), t1)
	del.Value = nil
	sched := capPlan("sched", 10, t1+raiseIn)
	h.produce(h.entitlement(n, unm, t1), del, h.entitlement(n, sched, t1))
	bs = awaitBalances(t, h, "unm's unmetered, del's of the default plan, sched's of its record", func(bs map[string]*schemas.Balance) bool {
		return bs["unm"].UpdatedAt >= t1 && bs["del"].UpdatedAt >= t1 && bs["sched"].UpdatedAt >= t1
	})
	if b := bs["unm"]; !b.Unmetered || b.Plan != "unlimited" {
		t.Errorf("unm's balance after its unmetered record: plan %q, unmetered %v", b.Plan, b.Unmetered)
	}
	if b := bs["del"]; b.Plan != "cap-10" || len(b.Meters) != 1 || b.Meters[0].Limit != 10 || b.Meters[0].Usage != 2 {
		t.Errorf("del's balance after its tombstone: plan %q, meters %+v; want cap-10, 2 of 10", b.Plan, b.Meters)
	}
	b := bs["sched"]
	if b.Meters[0].Limit != 2 || b.CapsUntil != t1+raiseIn {
		t.Fatalf("sched's balance after its scheduled record: limit %d, caps_until %d; want 2 until %d", b.Meters[0].Limit, b.CapsUntil, t1+raiseIn)
	}
	// The gate trusts sched's balance (the cap of 2) until the raise
	// takes effect, then no longer, within a second or two (the broker
	// time now is estimated from the balances that arrive).
	deadline := time.Now().Add(30 * time.Second)
	for rev, _ := view("sched"); rev < b.Revision; rev, _ = view("sched") {
		if time.Now().After(deadline) {
			t.Fatalf("the gate's view has sched's balance revision %d after 30s, want %d", rev, b.Revision)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, ok := view("sched"); !ok && time.Now().UnixMilli() < t1+raiseIn-500 {
		t.Errorf("the gate does not trust sched's balance %dms before its caps_until", t1+raiseIn-time.Now().UnixMilli())
	}
	revs := len(balancesOf(t, h, "sched"))
	for _, ok := view("sched"); ok; _, ok = view("sched") {
		if time.Now().After(deadline) {
			t.Fatalf("the gate still trusts sched's balance 30s after its raise took effect")
		}
		time.Sleep(10 * time.Millisecond)
	}
	late := time.Now().UnixMilli() - (t1 + raiseIn)
	t.Logf("the gate stopped trusting sched's balance %dms after its raise took effect", late)
	if late > 2000 {
		t.Errorf("the gate stopped trusting sched's balance %dms after its raise took effect, want within 2s", late)
	} else if late < -100 {
		t.Errorf("the gate stopped trusting sched's balance %dms before its raise took effect", -late)
	}
	if got := len(balancesOf(t, h, "sched")); got != revs {
		t.Errorf("%d balances of sched after its raise took effect, want %d: the gate opens on caps_until, not on a balance", got, revs)
	}
}
