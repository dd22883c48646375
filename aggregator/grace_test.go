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
