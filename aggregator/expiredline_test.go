package aggregator

import (
	"fmt"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/meterline/meterline/schemas"
)

// TestAdjustmentIntoPeriodPastWorkingState: an event happened up to S
// after its arrival, so the period of its arrival (where its adjustment is
// booked) ends before its own. Dedup accepts a re-routed copy of it, with
// its original arrival, while its own watermark is below about
// event_time + W + B (whole buckets: TestRealReroutedAfterEndPlusWindow),
// which can be after the period of its arrival's end + W + B. That
// period's state must still know which of its lines have their FINAL:
// the adjustment booked there must not come with a second FINAL
// revision (revision 1, value 0) of a line whose FINAL carried its
// usage, which would replace it in the compacted usage.aggregates.
//
// Hour periods, grace 1h, W 24h, B 24h, S 2h. Hour b = [00:00, 01:00) has
// a1 (5); hour p = [02:00, 03:00) has a2 (2). The watermark reaches
// b's end + W + B + 30min. Then r: arrival 00:30 (in b), event_time
// 02:15 (in p, 1h45 after its arrival). Dedup accepts it there: its
// horizon, the watermark − W − S = 23:30 the day before, rounds down to
// that day's 00:00, and r's event_time − S is after it.
func TestAdjustmentIntoPeriodPastWorkingState(t *testing.T) {
	h := newAggHarness(t, nil, 1)
	cfg := h.config("a", vfs.NewMem())
	cfg.Period, cfg.Grace, cfg.Window, cfg.Bucket, cfg.Skew = Hour, time.Hour, 24*time.Hour, 24*time.Hour, 2*time.Hour
	h.start(cfg)

	const hourMs = 3600 * 1000
	d := ms(t, "2026-05-01")
	b, p := d, d+2*hourMs
	ev := func(id string, qty, et, arrival int64) *schemas.DedupedEvent {
		return &schemas.DedupedEvent{EventID: id, CustomerID: "acme", Meter: "m", Quantity: qty, EventTime: et, IngestTime: arrival}
	}
	h.produce(
		h.dedupedEvent(0, ev("a1", 5, b+10*60_000, b+10*60_000+1000)),
		h.dedupedEvent(0, ev("a2", 2, p+10*60_000, p+10*60_000+1000)),
		h.watermark(0, 0, 1, b+hourMs+48*hourMs+30*60_000),
	)
	h.caughtUp()
	// Whatever expiry the watermark starts has run (chunks need no input).
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline) && len(liveStateKeys(t, h, b)) > 0; {
		time.Sleep(20 * time.Millisecond)
	}
	h.produce(h.dedupedEvent(0, ev("r", 3, p+15*60_000, b+30*60_000)))
	h.caughtUp()
	time.Sleep(200 * time.Millisecond)

	var finals []string
	for _, a := range readAggregates(t, h) {
		if a.Status == schemas.StatusFinal {
			finals = append(finals, fmt.Sprintf("%s value %d", msTime(a.PeriodStart), a.Value))
		}
	}
	want := []string{
		fmt.Sprintf("%s value 5", msTime(b)),
		fmt.Sprintf("%s value 2", msTime(p)),
	}
	if fmt.Sprint(finals) != fmt.Sprint(want) {
		t.Errorf("FINAL revisions %q, want %q", finals, want)
	}
	var adjs []string
	for _, a := range readAdjustments(t, h) {
		adjs = append(adjs, fmt.Sprintf("%s original %s booked %s delta %d", a.EventID, msTime(a.OriginalPeriodStart), msTime(a.BookedPeriodStart), a.Delta))
	}
	if want := []string{fmt.Sprintf("r original %s booked %s delta 3", msTime(p), msTime(b))}; fmt.Sprint(adjs) != fmt.Sprint(want) {
		t.Errorf("adjustments %q, want %q", adjs, want)
	}
}
