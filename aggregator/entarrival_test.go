package aggregator

import (
	"fmt"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/schemas"
)

// TestEntitlementsDecidedAtArrival (kfake; docs/entitlements.md, The
// ordering rule: broker time): an event is decided by the entitlements in
// effect at its arrival (its ingest_time), not at its event_time; a late
// event, whose event_time is in a period already final, is decided by the
// version in effect at its arrival, checked against its own period's cap,
// and priced by the rate in effect at its event_time. Every event below has
// a plan change between its event_time and its arrival that decides its
// outcome, so an aggregator that decided by the version in effect at
// event_time, or checked a late event against the current period, or priced
// it at its arrival, decides differently:
//
//   - lowered: a cap of 100 lowered to 5 at 12:00; 3 units at 09:00 and
//     then 4 units of event_time 11:00 arriving at 13:00: over_limit.
//   - raised: a cap of 5 raised to 100 at 12:00; the same events: both
//     accepted (7 units).
//   - late (monthly cap 20, lowered to 12 on 2 November at 12:00):
//     8 units on 30 October, 2 on 1 November, the watermark finalizes
//     October, then two events of 31 October arrive on 2 November after
//     the change: 5 units (October would reach 13 > 12: over_limit; the
//     November period would reach 7, and the cap at event_time is 20) and
//     4 units (October reaches 12, exactly the cap: accepted, an
//     adjustment of October).
//   - prepaid (no grant and overdraft denied, then a grant of 1,000
//     micro-credits from 2 November at 12:00; the rate is 10 micro-credits
//     a unit before November and 30 from 1 November): 1 unit on
//     30 October is no_credit; 7 units of 31 October arriving on
//     2 November after the grant are paid from it at October's rate (70);
//     2 units on 3 November at November's (60).
func TestEntitlementsDecidedAtArrival(t *testing.T) {
	const n = 1
	h := newEntHarness(t, nil, n)
	at := func(month time.Month, d, hour int) int64 {
		return time.Date(2026, month, d, hour, 0, 0, 0, time.UTC).UnixMilli()
	}
	written := at(time.October, 1, 0)
	change := at(time.November, 10, 12) // lowered and raised
	lateChange := at(time.November, 2, 12)
	allow := schemas.Overdraft{Policy: schemas.OverdraftAllow}
	capped := func(c string, limit int64) *schemas.Entitlements {
		return &schemas.Entitlements{CustomerID: c, Plan: "free", Overdraft: allow,
			Caps: []schemas.Cap{{Meter: "api_calls", Limit: limit, OnLimit: schemas.OnLimitReject}}}
	}
	prepaid := &schemas.Entitlements{CustomerID: "prepaid", Plan: "prepaid", Overdraft: schemas.Overdraft{Policy: schemas.OverdraftDeny}}
	topped := *prepaid
	topped.Grants = []schemas.Grant{{ID: "g", Amount: 1_000}}

	var recs []*kgo.Record
	recs = append(recs, h.shared(n, schemas.RateCardKey, &schemas.RateCard{Versions: []schemas.RateVersion{
		{EffectiveFrom: 0, Rates: []schemas.Rate{{Meter: "api_calls", MicroCredits: 10, PerUnits: 1}}},
		{EffectiveFrom: at(time.November, 1, 0), Rates: []schemas.Rate{{Meter: "api_calls", MicroCredits: 30, PerUnits: 1}}}}}, written)...)
	recs = append(recs,
		h.entitlement(n, capped("lowered", 100), written),
		h.entitlement(n, capped("raised", 5), written),
		h.entitlement(n, capped("late", 20), written),
		h.entitlement(n, prepaid, written),
		// Broker times non-decreasing, as the broker stamps them.
		h.entitlement(n, capped("late", 12), lateChange),
		h.entitlement(n, &topped, lateChange),
		h.entitlement(n, capped("lowered", 5), change),
		h.entitlement(n, capped("raised", 100), change))
	ev := func(id, c string, qty, eventTime, arrival int64) *kgo.Record {
		return h.dedupedEvent(0, &schemas.DedupedEvent{EventID: id, CustomerID: c, Meter: "api_calls", Quantity: qty,
			EventTime: eventTime, IngestTime: arrival})
	}
	// usage.deduped in arrival order.
	recs = append(recs,
		ev("late-1", "late", 8, at(time.October, 30, 10), at(time.October, 30, 10)),
		ev("prepaid-0", "prepaid", 1, at(time.October, 30, 11), at(time.October, 30, 11)),
		ev("late-2", "late", 2, at(time.November, 1, 10), at(time.November, 1, 10)),
		// October is final (its end + the test's grace of 1h).
		h.watermark(0, 0, 1, at(time.November, 1, 11)),
		ev("late-3", "late", 5, at(time.October, 31, 20), at(time.November, 2, 13)),
		ev("late-4", "late", 4, at(time.October, 31, 21), at(time.November, 2, 14)),
		ev("prepaid-1", "prepaid", 7, at(time.October, 31, 20), at(time.November, 2, 13)),
		ev("prepaid-2", "prepaid", 2, at(time.November, 3, 9), at(time.November, 3, 9)),
		ev("lowered-1", "lowered", 3, at(time.November, 10, 9), at(time.November, 10, 9)),
		ev("raised-1", "raised", 3, at(time.November, 10, 9), at(time.November, 10, 9)),
		ev("lowered-2", "lowered", 4, at(time.November, 10, 11), at(time.November, 10, 13)),
		ev("raised-2", "raised", 4, at(time.November, 10, 11), at(time.November, 10, 13)),
	)
	h.produce(recs...)
	cfg := h.entConfig("a", vfs.NewMem())
	cfg.Grace = time.Hour
	run := h.start(cfg)
	h.caughtUp()
	// 11 events: 6 counted in an aggregate, 2 in an adjustment, 3 rejected.
	deadline := time.Now().Add(time.Minute)
	for {
		counts := map[string]*schemas.Aggregate{}
		for _, a := range readAggregates(t, h) {
			k := a.CustomerID + "/" + fmt.Sprint(a.PeriodStart)
			if cur := counts[k]; cur == nil || a.Revision > cur.Revision {
				counts[k] = a
			}
		}
		got := len(readRejected(t, h)) + len(readAdjustments(t, h))
		for _, a := range counts {
			got += int(a.EventCount)
		}
		if got >= 11 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of 11 events decided after a minute", got)
		}
		time.Sleep(50 * time.Millisecond)
	}
	awaitBalances(t, h, "prepaid's last charge", func(bs map[string]*schemas.Balance) bool {
		b := bs["prepaid"]
		return b != nil && b.UpdatedAt >= at(time.November, 3, 9)
	})
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}

	rejected := map[string]string{}
	for _, r := range readRejected(t, h) {
		if r.Stage != "aggregator" {
			t.Errorf("rejected %s by stage %q, want aggregator", r.EventID, r.Stage)
		}
		rejected[r.EventID] = r.Reason
	}
	want := map[string]string{"lowered-2": schemas.ReasonOverLimit, "late-3": schemas.ReasonOverLimit, "prepaid-0": schemas.ReasonNoCredit}
	if fmt.Sprint(rejected) != fmt.Sprint(want) {
		t.Errorf("rejected %v, want %v (each event decided by the version in effect at its arrival; "+
			"a late one against its own period's cap)", rejected, want)
	}
	// The counted values: OPEN for November, and October's FINAL plus
	// late-4's adjustment.
	open, rev := map[string]int64{}, map[string]int64{}
	for _, a := range readAggregates(t, h) {
		if a.PeriodStart == at(time.November, 1, 0) && a.Revision >= rev[a.CustomerID] {
			open[a.CustomerID], rev[a.CustomerID] = a.Value, a.Revision
		}
	}
	if w := map[string]int64{"lowered": 3, "raised": 7, "late": 2, "prepaid": 2}; fmt.Sprint(open) != fmt.Sprint(w) {
		t.Errorf("November's values %v, want %v", open, w)
	}
	var adj []string
	for _, a := range readAdjustments(t, h) {
		adj = append(adj, fmt.Sprintf("%s %s %d", a.EventID, time.UnixMilli(a.OriginalPeriodStart).UTC().Format("2006-01"), a.Delta))
	}
	if w := []string{"late-4 2026-10 4", "prepaid-1 2026-10 7"}; fmt.Sprint(adj) != fmt.Sprint(w) {
		t.Errorf("adjustments %v, want %v (the late events accepted, each booked to October)", adj, w)
	}
	// prepaid: 7 units of 31 October at October's rate (70), 2 units of
	// 3 November at November's (60).
	b := latestBalances(t, h)["prepaid"]
	if b == nil || len(b.Grants) != 1 || b.Grants[0].ID != "g" || b.Grants[0].Consumed != 130 || b.Overdrawn != 0 {
		t.Errorf("prepaid's balance %+v, want grant g consumed 130 (7×10 at event_time, 2×30), nothing overdrawn", b)
	}
}
