package aggregator

import (
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/schemas"
)

// TestAbortedTransactionCountsOnce: DESIGN §9's rejections by reason and
// the late-event count match usage.rejected and usage.adjustments. A
// transaction that aborts (its offset commit refused) is processed again;
// the counters count only the committed attempt (added when a transaction
// commits, dropped when it aborts).
func TestAbortedTransactionCountsOnce(t *testing.T) {
	c, brokers := testenv.KFake(t)
	h := newAggHarnessSources(t, brokers, 1, 1)
	reg := prometheus.NewRegistry()
	cfg := h.config("a", vfs.NewMem())
	cfg.Period, cfg.Grace = Day, time.Hour
	cfg.Stream.Registerer = reg
	day0 := ms(t, "2026-05-04")
	const hourMs = int64(3600 * 1000)
	// Day 0 is final (watermark past its end + grace).
	h.produce(h.dedupedEvent(0, &schemas.DedupedEvent{EventID: "e0", CustomerID: "c", Meter: "m", Quantity: 1,
		EventTime: day0 + hourMs, IngestTime: day0 + hourMs}),
		h.watermark(0, 0, 1, day0+26*hourMs))
	h.start(cfg)
	h.caughtUp()
	testenv.FailNextTxnOffsetCommit(c)
	h.produce(
		// invalid: a negative quantity
		h.dedupedEvent(0, &schemas.DedupedEvent{EventID: "neg", CustomerID: "c", Meter: "m", Quantity: -1,
			EventTime: day0 + 27*hourMs, IngestTime: day0 + 27*hourMs}),
		// late: arrived after day 0's end + grace
		h.dedupedEvent(0, &schemas.DedupedEvent{EventID: "late", CustomerID: "c", Meter: "m", Quantity: 2,
			EventTime: day0 + 2*hourMs, IngestTime: day0 + 27*hourMs}),
	)
	h.caughtUp()
	if got := transactionCounts(reg)["aborted"]; got < 1 {
		t.Fatalf("no aborted transaction (%v): the test did not test anything", transactionCounts(reg))
	}
	if a, r := len(testenv.ReadAll(t, h.brokers, h.names.AdjustmentsTopic())), len(testenv.ReadAll(t, h.brokers, h.names.RejectedTopic())); a != 1 || r != 1 {
		t.Fatalf("%d adjustments and %d rejected records (read_committed), want 1 and 1", a, r)
	}
	if got := counterOf(reg, "meterline_rejected_total"); got != 1 {
		t.Errorf("meterline_rejected_total = %v, want 1 (one record in usage.rejected)", got)
	}
	if got := counterOf(reg, "meterline_aggregate_late_events_total"); got != 1 {
		t.Errorf("meterline_aggregate_late_events_total = %v, want 1 (one adjustment)", got)
	}
}
