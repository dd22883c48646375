package aggregator

import (
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/schemas"
)

// TestEntitlementsPeriodStartReachesUsageAheadOfArrival: a customer whose
// only usage is an event that arrived before a period start with its
// event_time after it (dedup's future skew allows it) has usage in the
// new period and none in the one that ended. Its balance of the old
// period (as of the event's arrival) does not show that usage; when the
// watermark enters the new period, the customer must get a balance of it
// showing the usage, as a customer that also had usage in the old period
// does. Else balances_current has no row of the new period for it until
// its next change, and a query of the customers near their cap in the
// current period does not list it.
func TestEntitlementsPeriodStartReachesUsageAheadOfArrival(t *testing.T) {
	d := time.Date(2026, 11, 10, 0, 0, 0, 0, time.UTC).UnixMilli()
	day := int64(24 * time.Hour / time.Millisecond)
	h := newEntHarness(t, nil, 1)
	var recs []*kgo.Record
	recs = append(recs, h.shared(1, schemas.DefaultPlanKey, &schemas.Entitlements{Plan: "free",
		Overdraft: schemas.Overdraft{Policy: schemas.OverdraftAllow},
		Caps:      []schemas.Cap{{Meter: "api_calls", Limit: 100, OnLimit: schemas.OnLimitReject}}}, d-day)...)
	recs = append(recs, h.watermark(0, 0, 1, d+1))
	arrival := d + day - 30*60*1000 // 23:30 of day d
	// "old" has usage on day d as well as on day d+1; "ahead" only on d+1.
	recs = append(recs,
		h.dedupedEvent(0, &schemas.DedupedEvent{EventID: "o1", CustomerID: "old", Meter: "api_calls",
			Quantity: 5, EventTime: arrival, IngestTime: arrival}),
		h.dedupedEvent(0, &schemas.DedupedEvent{EventID: "o2", CustomerID: "old", Meter: "api_calls",
			Quantity: 90, EventTime: d + day + 1000, IngestTime: arrival}),
		h.dedupedEvent(0, &schemas.DedupedEvent{EventID: "a1", CustomerID: "ahead", Meter: "api_calls",
			Quantity: 90, EventTime: d + day + 1000, IngestTime: arrival}))
	h.produce(recs...)
	cfg := h.entConfig("a", vfs.NewMem())
	cfg.Period = Day
	run := h.start(cfg)
	awaitBalances(t, h, "both customers' balances of day d", func(bs map[string]*schemas.Balance) bool {
		return bs["old"] != nil && bs["old"].PeriodStart == d && bs["ahead"] != nil && bs["ahead"].PeriodStart == d
	})
	h.produce(h.watermark(0, 0, 1, d+day+5000))
	deadline := time.Now().Add(10 * time.Second)
	var bs map[string]*schemas.Balance
	for {
		bs = latestBalances(t, h)
		if b := bs["old"]; b != nil && b.PeriodStart == d+day || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The period start's balances have gone out ("old"'s); give any other
	// of the same chunks a moment.
	time.Sleep(300 * time.Millisecond)
	bs = latestBalances(t, h)
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}
	for _, c := range []string{"old", "ahead"} {
		b := bs[c]
		if b == nil || b.PeriodStart != d+day || len(b.Meters) != 1 || b.Meters[0].Usage != 90 {
			t.Errorf("%s's last balance %+v, want usage 90 in the period of %s", c, b, msTime(d+day))
		}
	}
	if n := len(balancesOf(t, h, "ahead")); n != 2 {
		t.Errorf("ahead got %d balances, want 2 (one per period)", n)
	}
}
