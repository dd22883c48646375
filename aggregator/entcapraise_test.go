package aggregator

import (
	"fmt"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/meterline/meterline/schemas"
)

// TestCapRaiseBalances (kfake; docs/entitlements.md, Topics, and
// ingest.md, The quota gate): a customer's own record that raises its cap
// at once writes the customer a balance with the new cap; a record
// scheduled for later (effective_from) writes one as of its broker time,
// with the cap then, and none when it takes effect; the default plan's
// record writes no customer a balance (a later customer's balance shows
// it is in effect). The quota gate therefore opens at
// once only for the first: own, sched and def each reach a cap of 2, then
// theirs is raised to 10, and only own's last balance says 10.
func TestCapRaiseBalances(t *testing.T) {
	const n = 1
	h := newEntHarness(t, nil, n)
	t0 := time.Now().Add(-90 * time.Second).Truncate(time.Second).UnixMilli()
	capOf := func(c string, limit, from int64) *schemas.Entitlements {
		return &schemas.Entitlements{CustomerID: c, Plan: fmt.Sprint("cap-", limit), EffectiveFrom: from,
			Overdraft: schemas.Overdraft{Policy: schemas.OverdraftAllow},
			Caps:      []schemas.Cap{{Meter: "api_calls", Limit: limit, OnLimit: schemas.OnLimitReject}}}
	}
	recs := h.shared(n, schemas.DefaultPlanKey, capOf("", 2, 0), t0)
	recs = append(recs, h.entitlement(n, capOf("own", 2, 0), t0), h.entitlement(n, capOf("sched", 2, 0), t0))
	for i, c := range []string{"own", "sched", "def", "own", "sched", "def"} {
		at := t0 + 1000 + int64(i)*100
		recs = append(recs, h.dedupedEvent(0, &schemas.DedupedEvent{EventID: fmt.Sprint(c, i), CustomerID: c, Meter: "api_calls",
			Quantity: 1, EventTime: at, IngestTime: at}))
	}
	h.produce(recs...)
	run := h.start(h.entConfig("a", vfs.NewMem()))
	defer func() {
		if err := run.stop(); err != nil {
			t.Error(err)
		}
	}()
	capReached := func(limit int64, cs ...string) func(map[string]*schemas.Balance) bool {
		return func(bs map[string]*schemas.Balance) bool {
			for _, c := range cs {
				b := bs[c]
				if b == nil || len(b.Meters) != 1 || b.Meters[0].Usage != 2 || b.Meters[0].Limit != limit {
					return false
				}
			}
			return true
		}
	}
	awaitBalances(t, h, "at the cap of 2", capReached(2, "own", "sched", "def"))

	// Raised, read after the ticks the aggregator stamped with the wall
	// clock: own's at once, sched's from t1 + 1s on, the default plan's.
	t1 := time.Now().UnixMilli()
	recs = append(h.shared(n, schemas.DefaultPlanKey, capOf("", 10, 0), t1),
		h.entitlement(n, capOf("own", 10, 0), t1), h.entitlement(n, capOf("sched", 10, t1+1000), t1))
	// A customer's event after all that: its balance goes out after the
	// records' changes have been flushed.
	recs = append(recs, h.dedupedEvent(0, &schemas.DedupedEvent{EventID: "later", CustomerID: "later", Meter: "api_calls",
		Quantity: 1, EventTime: t1 + 2000, IngestTime: t1 + 2000}))
	h.produce(recs...)
	bs := awaitBalances(t, h, "own's raised, sched's of its record, later's out", func(bs map[string]*schemas.Balance) bool {
		return capReached(10, "own")(bs) && bs["sched"].UpdatedAt >= t1 && bs["later"] != nil
	})
	for _, c := range []string{"sched", "def"} {
		if b := bs[c]; b.Meters[0].Limit != 2 {
			t.Errorf("%s's last balance has the limit %d, want 2 (no balance when its raised cap takes effect)", c, b.Meters[0].Limit)
		}
	}
	if b := bs["later"]; b.Meters[0].Limit != 10 {
		t.Errorf("later's balance has the limit %d, want the default plan's 10", b.Meters[0].Limit)
	}
}
