package aggregator

import (
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/schemas"
)

// TestAbortedTransactionCountsOnce: the rejections by reason of
// docs/operations.md, Health, metrics and logs, and the late-event count
// match usage.rejected and usage.adjustments, the records in and the time
// records in the input. A transaction that aborts
// (its offset commit refused) is processed again; the counters count only
// the committed attempt (added when a transaction commits, dropped when it
// aborts).
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
		h.watermark(0, 0, 1, day0+27*hourMs),
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
	// The records in, and the time records among them (the 2 watermark
	// records: docs/operations.md, MeterlineRejectionSpike), once each.
	if in, tm := counterOf(reg, "meterline_stream_records_in_total"), counterOf(reg, "meterline_stream_time_records_in_total"); in != 5 || tm != 2 {
		t.Errorf("meterline_stream_records_in_total = %v, meterline_stream_time_records_in_total = %v; want 5 and 2", in, tm)
	}
}

// TestAbortedDecisionsCountedOnce: entitlements decisions made in
// transactions that abort (every other offset commit refused) are made
// again; meterline_rejected_total by reason and the decision counters
// count each committed decision once, and agree with usage.rejected.
func TestAbortedDecisionsCountedOnce(t *testing.T) {
	c, brokers := testenv.KFake(t)
	const n = 1
	h := newEntHarness(t, brokers, n)
	t0 := time.Date(2026, 11, 10, 0, 0, 0, 0, time.UTC).UnixMilli()
	h.produce(h.capAndCredits(n, t0, "free", "paid")...)
	// Every other offset commit refused, the first 8 times.
	testenv.FailTxnOffsetCommits(c, func(n int) bool { return n%2 == 1 && n <= 15 })
	run, reg := h.startMetered()
	deadline := time.Now().Add(30 * time.Second)
	for len(readRejected(t, h)) < 4 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	h.caughtUp()
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}
	if got := transactionCounts(reg)["aborted"]; got < 1 {
		t.Fatalf("no aborted transaction (%v): the test did not test anything", transactionCounts(reg))
	}
	reasons := map[string]float64{}
	for _, r := range readRejected(t, h) {
		reasons[r.Reason]++
	}
	const decisions = "meterline_aggregate_entitlement_decisions_total"
	for _, r := range []string{schemas.ReasonOverLimit, schemas.ReasonNoCredit} {
		rejected, decided := counterWith(reg, "meterline_rejected_total", "reason", r), counterWith(reg, decisions, "outcome", r)
		if reasons[r] != 2 || rejected != 2 || decided != 2 {
			t.Errorf("%s: %v in usage.rejected, %v in meterline_rejected_total, %v decisions; want 2 each", r, reasons[r], rejected, decided)
		}
	}
	if got := counterOf(reg, decisions); got != 24 {
		t.Errorf("%v decisions, want 24 (each of the 24 events decided once)", got)
	}
}
