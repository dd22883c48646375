package aggregator

import (
	"fmt"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/meterline/meterline/schemas"
)

// TestGraceShortenedOnRestart: an aggregator restarted with a shorter
// --grace on state whose watermark is already past a period's end + the new
// grace (but not the old one) holds OPEN aggregates of a period that is
// final (docs/design.md, Time: final once the watermark passes
// end + grace). Its first transaction decides it: the period gets its FINAL
// revisions, and an event of it processed after the restart is an
// adjustment measured against them. Before, such an event marked the period
// final with nothing to emit: its aggregates never got a FINAL (November
// had no invoice quantity), their state was never pruned, and a MAX
// adjustment was measured against nothing (delta 7 under a maximum of 10).
// Idle after the restart (no input), the partition decides it all the same.
func TestGraceShortenedOnRestart(t *testing.T) {
	t.Run("event", func(t *testing.T) { testGraceShortened(t, true) })
	t.Run("idle", func(t *testing.T) { testGraceShortened(t, false) })
}

func testGraceShortened(t *testing.T, input bool) {
	h := newAggHarness(t, nil, 1)
	cfg := h.config("a", vfs.NewMem())
	cfg.Meters = mustMeters(t, "meters:\n  - {name: mx, aggregation: MAX}\n")
	cfg.Grace = 48 * time.Hour
	nov, dec := ms(t, "2026-11-01"), ms(t, "2026-12-01")
	ev := func(id string, qty, et, arrival int64) *schemas.DedupedEvent {
		return &schemas.DedupedEvent{EventID: id, CustomerID: "acme", Meter: "mx", Quantity: qty, EventTime: et, IngestTime: arrival}
	}
	run := h.start(cfg)
	h.produce(h.dedupedEvent(0, ev("e1", 10, ms(t, "2026-11-15"), ms(t, "2026-11-15")+1000)),
		// December 2, 12:00: past November's end + 24h, not + 48h.
		h.watermark(0, 0, 1, dec+36*3600_000))
	h.caughtUp()
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}
	for _, a := range readAggregates(t, h) {
		if a.Status == schemas.StatusFinal {
			t.Fatalf("November final with a grace of 48h at a watermark of end + 36h: %+v", a)
		}
	}

	// Restarted with a grace of 24h. The first record after it is an event
	// of November (on time by its arrival, December 1 12:00, for either
	// grace), then a watermark.
	cfg.Grace = 24 * time.Hour
	if input {
		h.produce(h.dedupedEvent(0, ev("e2", 7, ms(t, "2026-11-20"), dec+12*3600_000)),
			h.watermark(0, 0, 1, dec+37*3600_000))
	}
	run = h.start(cfg)
	h.caughtUp()

	var finals []string
	for _, a := range awaitFinals(t, h, 1, 5*time.Second) {
		if a.Status == schemas.StatusFinal {
			finals = append(finals, fmt.Sprintf("%s revision %d value %d", msTime(a.PeriodStart), a.Revision, a.Value))
		}
	}
	if want := fmt.Sprintf("%s revision 2 value 10", msTime(nov)); len(finals) != 1 || finals[0] != want {
		t.Errorf("FINAL revisions %q, want one: %s", finals, want)
	}
	var adjs []string
	for _, a := range readAdjustments(t, h) {
		adjs = append(adjs, fmt.Sprintf("%s delta %d booked %s", a.EventID, a.Delta, msTime(a.BookedPeriodStart)))
	}
	want := []string{fmt.Sprintf("e2 delta 0 booked %s", msTime(dec))} // 7 under the FINAL's 10
	if !input {
		want = nil
	}
	if fmt.Sprint(adjs) != fmt.Sprint(want) {
		t.Errorf("adjustments %q, want %q", adjs, want)
	}
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}
	// Nothing of November is left as an OPEN aggregate: its state moved to
	// the final working state.
	for _, k := range liveStateKeys(t, h, nov) {
		if k[0] == pfxOpen {
			t.Errorf("OPEN aggregate of November still in the state after it is final: %q", k)
		}
	}
}

// TestGraceLengthenedOnRestart: day periods, grace 1h. 05-01 and 05-03
// have usage and are decided final at a watermark of 05-04 02:00; 05-02
// has none, so no marker, but it is final by the rule (its end + grace
// passed). Restarted with a grace of 48h, an event of 05-02 arrives (on
// time by the new grace, 05-02's end + 48h being 05-05). 05-02 stays
// final (docs/design.md, Time): the event is an adjustment, booked into
// 05-04. It was an OPEN aggregate that never got its FINAL, the partition
// looking for periods to decide only after its latest final one. Once the
// watermark is past every period's end + 48h, every line that had a
// revision has its FINAL, and the three events are each counted once
// (FINAL values plus adjustments).
func TestGraceLengthenedOnRestart(t *testing.T) {
	h := newAggHarness(t, nil, 1)
	cfg := h.config("a", vfs.NewMem())
	cfg.Period, cfg.Grace = Day, time.Hour
	const dayMs, hourMs = 24 * 3600 * 1000, 3600 * 1000
	d1 := ms(t, "2026-05-01")
	ev := func(id string, et, arrival int64) *schemas.DedupedEvent {
		return &schemas.DedupedEvent{EventID: id, CustomerID: "acme", Meter: "m", Quantity: 1, EventTime: et, IngestTime: arrival}
	}
	run := h.start(cfg)
	h.produce(h.dedupedEvent(0, ev("e1", d1+10*hourMs, d1+10*hourMs)),
		h.dedupedEvent(0, ev("e3", d1+2*dayMs+10*hourMs, d1+2*dayMs+10*hourMs)),
		h.watermark(0, 0, 1, d1+3*dayMs+2*hourMs))
	awaitFinals(t, h, 2, 20*time.Second)
	h.caughtUp()
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}

	cfg.Grace = 48 * time.Hour
	run = h.start(cfg)
	h.produce(h.dedupedEvent(0, ev("e2", d1+dayMs+12*hourMs, d1+3*dayMs+2*hourMs)),
		h.watermark(0, 0, 1, d1+7*dayMs))
	h.caughtUp()
	time.Sleep(300 * time.Millisecond) // chunks run without input
	h.caughtUp()

	last := map[int64]*schemas.Aggregate{}
	var total int64
	for _, a := range readAggregates(t, h) {
		last[a.PeriodStart] = a
		if a.Status == schemas.StatusFinal {
			total += a.Value
		}
	}
	for start, a := range last {
		if a.Status != schemas.StatusFinal {
			t.Errorf("%s: last revision %d is %s (value %d) with the watermark past its end + grace", msTime(start), a.Revision, a.Status, a.Value)
		}
	}
	var adjs []string
	for _, a := range readAdjustments(t, h) {
		total += a.Delta
		adjs = append(adjs, fmt.Sprintf("%s original %s booked %s delta %d", a.EventID, msTime(a.OriginalPeriodStart), msTime(a.BookedPeriodStart), a.Delta))
	}
	if want := []string{fmt.Sprintf("e2 original %s booked %s delta 1", msTime(d1+dayMs), msTime(d1+3*dayMs))}; fmt.Sprint(adjs) != fmt.Sprint(want) {
		t.Errorf("adjustments %q, want %q", adjs, want)
	}
	if total != 3 {
		t.Errorf("FINAL values and adjustments add up to %d, want 3", total)
	}
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}
}
