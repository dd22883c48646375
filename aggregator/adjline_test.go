package aggregator

import (
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/meterline/meterline/schemas"
)

// TestAdjustmentOnlyLineFinalWithItsPartition: an invoice line of period P
// that has no usage of its own, only adjustments booked into it, turns
// final when the partition that books into it decides P final, not when
// another partition does (docs/design.md, Time). Partition 0 is ahead and
// emits P's FINALs; partition 1 lags: its line of P, booked into by a late
// event of P − 1, has no FINAL revision while partition 1 can still book
// into it, and one FINAL revision, value 0 and count 0, once it decided P
// final.
func TestAdjustmentOnlyLineFinalWithItsPartition(t *testing.T) {
	h := newAggHarnessSources(t, nil, 2, 1)
	cfg := h.config("a", vfs.NewMem())
	cfg.Period, cfg.Grace = Day, time.Hour
	h.start(cfg)

	const dayMs, hourMs = 24 * 3600 * 1000, 3600 * 1000
	d1 := ms(t, "2026-05-04")
	d2 := d1 + dayMs
	h.produce(
		// Partition 0: usage in P = d2, and P final.
		h.dedupedEvent(0, &schemas.DedupedEvent{EventID: "a1", CustomerID: "ahead", Meter: "m", Quantity: 3,
			EventTime: d2 + 1000, IngestTime: d2 + 2000}),
		h.watermark(0, 0, 1, d2+dayMs+hourMs+1),
		// Partition 1: usage in d1, d1 final, then an event of d1 that
		// arrived in P: an adjustment booked into P, a line with no usage
		// of its own there.
		h.dedupedEvent(1, &schemas.DedupedEvent{EventID: "l1", CustomerID: "lag", Meter: "m", Quantity: 5,
			EventTime: d1 + 1000, IngestTime: d1 + 2000}),
		h.watermark(1, 0, 1, d1+dayMs+hourMs+1),
		h.dedupedEvent(1, &schemas.DedupedEvent{EventID: "l2", CustomerID: "lag", Meter: "m", Quantity: 7,
			EventTime: d1 + 3000, IngestTime: d2 + 5*hourMs}),
	)
	finals := func(customer string, start int64) []*schemas.Aggregate {
		var out []*schemas.Aggregate
		for _, a := range readAggregates(t, h) {
			if a.CustomerID == customer && a.PeriodStart == start && a.Status == schemas.StatusFinal {
				out = append(out, a)
			}
		}
		return out
	}
	wait := func(what string, ok func() bool) {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); !ok(); time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("after 20s: %s", what)
			}
		}
	}
	wait("FINAL of ahead in P, of lag in P − 1, and the adjustment", func() bool {
		return len(finals("ahead", d2)) == 1 && len(finals("lag", d1)) == 1 && len(readAdjustments(t, h)) == 1
	})
	h.caughtUp()
	if adj := readAdjustments(t, h)[0]; adj.BookedPeriodStart != d2 || adj.Delta != 7 {
		t.Fatalf("adjustment booked into %d with delta %d, want %d and 7", adj.BookedPeriodStart, adj.Delta, d2)
	}
	time.Sleep(200 * time.Millisecond) // chunks run without input: give them time
	if f := finals("lag", d2); len(f) != 0 {
		t.Fatalf("lag's line of P has a FINAL revision (value %d) while its partition has not decided P final", f[0].Value)
	}

	h.produce(h.watermark(1, 0, 1, d2+dayMs+hourMs+1))
	wait("a FINAL revision of lag's line of P once partition 1 decided P final", func() bool { return len(finals("lag", d2)) > 0 })
	h.caughtUp()
	time.Sleep(200 * time.Millisecond)
	f := finals("lag", d2)
	if len(f) != 1 || f[0].Value != 0 || f[0].EventCount != 0 || f[0].Revision != 1 {
		t.Fatalf("lag's line of P: %d FINAL revisions (first %+v), want one, revision 1, value 0, count 0", len(f), f[0])
	}
	for _, a := range readAggregates(t, h) {
		if a.CustomerID == "lag" && a.PeriodStart == d2 && a.Status != schemas.StatusFinal {
			t.Fatalf("lag's line of P has an OPEN revision %+v", a)
		}
	}
}
