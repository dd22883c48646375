package aggregator

import (
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/meterline/meterline/schemas"
)

// TestFinalDueGauge: meterline_aggregate_final_due_seconds is end + grace
// of the oldest period with OPEN aggregates or late events waiting for its
// FINAL, moves on once that period's FINAL revisions went out (in chunks,
// after the decision, with no record arriving after them), disappears when
// nothing is open, and is back right after a restart, before any record
// (the FINAL-overdue alert reads it while the watermark is stuck, when no
// record arrives).
func TestFinalDueGauge(t *testing.T) {
	h := newAggHarness(t, nil, 1)
	fs := vfs.NewMem()
	const (
		hour  = int64(3600 * 1000)
		dayMs = 24 * hour
	)
	day0 := ms(t, "2026-03-10")
	due := func(day int64) float64 { return float64(day0+(day+1)*dayMs+hour) / 1000 }
	start := func() (*aggRunning, *prometheus.Registry) {
		cfg := h.config("a", fs)
		cfg.Period, cfg.Grace = Day, time.Hour
		reg := prometheus.NewRegistry()
		cfg.Stream.Registerer = reg
		return h.start(cfg), reg
	}
	ev := func(id string, day, arrival int64) *schemas.DedupedEvent {
		return &schemas.DedupedEvent{EventID: id, CustomerID: "acme", Meter: "m", Quantity: 1,
			EventTime: day0 + day*dayMs + 1000, IngestTime: arrival}
	}
	// Each step ends with a watermark that moves, which refreshes the
	// gauge at once (otherwise it refreshes at most every second).
	check := func(reg *prometheus.Registry, what string, want float64, present bool) {
		t.Helper()
		h.caughtUp()
		got, ok := gaugeOf(reg, "meterline_aggregate_final_due_seconds", "partition", "0")
		switch {
		case present && !ok:
			t.Fatalf("%s: no final-due series, want %v", what, want)
		case !present && ok:
			t.Fatalf("%s: final-due %v, want no series (nothing open)", what, got)
		case present && got != want:
			t.Fatalf("%s: final-due %v (%s), want %v (%s)", what, got, time.Unix(int64(got), 0).UTC(), want, time.Unix(int64(want), 0).UTC())
		}
	}

	run, reg := start()
	h.produce(h.dedupedEvent(0, ev("d0", 0, day0+2000)), h.watermark(0, 0, 1, day0+3000))
	check(reg, "a day-0 event", due(0), true)

	// A day-1 event, then the watermark passes day 0's end + grace: day 0
	// is final, day 1 is the oldest open period.
	h.produce(h.dedupedEvent(0, ev("d1", 1, day0+dayMs+2000)), h.watermark(0, 0, 1, int64(due(0)*1000)+1))
	check(reg, "day 0 final", due(1), true)

	// Past day 1's end + grace: nothing open.
	h.produce(h.watermark(0, 0, 1, int64(due(1)*1000)+1))
	check(reg, "day 1 final", 0, false)

	// A late event of day 2 (it arrived after day 2's end + grace) waits
	// for day 2's FINAL, which the watermark has not decided: day 2's FINAL
	// is due, and overdue by the event's own arrival.
	late := int64(due(2)*1000) + 5000
	h.produce(h.dedupedEvent(0, ev("late2", 2, late)), h.watermark(0, 0, 1, int64(due(1)*1000)+2))
	check(reg, "a late event waiting for day 2's FINAL", due(2), true)

	// A day-3 event; then a restart: the gauge is back from the restored
	// state before any record arrives.
	h.produce(h.dedupedEvent(0, ev("d3", 3, late+1000)), h.watermark(0, 0, 1, int64(due(2)*1000)+1))
	check(reg, "day 2 final, day 3 open", due(3), true)
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}
	_, reg = start()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if got, ok := gaugeOf(reg, "meterline_aggregate_final_due_seconds", "partition", "0"); ok {
			if got != due(3) {
				t.Fatalf("after a restart: final-due %v, want %v", got, due(3))
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("after a restart: no final-due series within 30s (the restored state has day 3 open)")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestFinalDueGaugeAdjustmentOnlyLine: a period whose only state here is
// a line adjustments were booked into ('l' P K), no usage of its own, has
// its FINAL revision still to go out (docs/design.md, Time: every invoice
// line has a FINAL revision): the final-due gauge shows its end + grace,
// and the FINAL-overdue alert fires if its watermark stops.
func TestFinalDueGaugeAdjustmentOnlyLine(t *testing.T) {
	h := newAggHarness(t, nil, 1)
	const (
		hour  = int64(3600 * 1000)
		dayMs = 24 * hour
	)
	day0 := ms(t, "2026-03-10")
	due := func(day int64) float64 { return float64(day0+(day+1)*dayMs+hour) / 1000 }
	cfg := h.config("a", vfs.NewMem())
	cfg.Period, cfg.Grace = Day, time.Hour
	reg := prometheus.NewRegistry()
	cfg.Stream.Registerer = reg
	h.start(cfg)
	h.produce(h.dedupedEvent(0, &schemas.DedupedEvent{EventID: "d0", CustomerID: "acme", Meter: "m", Quantity: 1,
		EventTime: day0 + 1000, IngestTime: day0 + 2000}), h.watermark(0, 0, 1, int64(due(0)*1000)+1))
	// A late event of day 0, arrived in day 1: booked into acme's line of
	// day 1, which has no usage of its own. Day 1 is not final yet.
	late := int64(due(0)*1000) + 5000
	h.produce(h.dedupedEvent(0, &schemas.DedupedEvent{EventID: "late0", CustomerID: "acme", Meter: "m", Quantity: 2,
		EventTime: day0 + 3000, IngestTime: late}), h.watermark(0, 0, 1, late))
	h.caughtUp()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, ok := gaugeOf(reg, "meterline_aggregate_final_due_seconds", "partition", "0")
		if ok && got == due(1) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("final-due %v (present %v), want %v: day 1's line of adjustments only waits for its FINAL", got, ok, due(1))
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Past day 1's end + grace: the line's FINAL is out, nothing is due.
	h.produce(h.watermark(0, 0, 1, int64(due(1)*1000)+1))
	h.caughtUp()
	for deadline = time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if _, ok := gaugeOf(reg, "meterline_aggregate_final_due_seconds", "partition", "0"); !ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("final-due still present after day 1's FINALs went out")
		}
	}
}
