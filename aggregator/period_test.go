package aggregator

import (
	"errors"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/meterline/meterline/schemas"
)

// TestPeriodChangeRefused: state keys hold period starts, and a period's
// end is computed from the configured period length. An aggregator
// restarted with another --period on state built with the first would
// finalize a month's aggregate as the day it starts with (a FINAL of
// [05-01, 05-02) carrying the usage of May so far) and count the rest of
// the month into day periods. It stops with ErrPeriodChanged before it
// counts anything; restarted with the period the state was built with, it
// goes on.
func TestPeriodChangeRefused(t *testing.T) {
	h := newAggHarness(t, nil, 1)
	fs := vfs.NewMem()
	cfg := h.config("a", fs)
	cfg.Period = Month
	may := ms(t, "2026-05-01")
	ev := func(id string, et int64) *schemas.DedupedEvent {
		return &schemas.DedupedEvent{EventID: id, CustomerID: "acme", Meter: "m", Quantity: 5, EventTime: et, IngestTime: et + 1000}
	}
	run := h.start(cfg)
	h.produce(h.dedupedEvent(0, ev("e1", may+3600_000)))
	h.caughtUp()
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}

	// Restarted with day periods: the watermark passes 05-01's end + grace
	// as a day, not as a month.
	h.produce(h.dedupedEvent(0, ev("e2", may+10*24*3600_000)),
		h.watermark(0, 0, 1, may+20*24*3600_000))
	day := cfg
	day.Period = Day
	run = h.start(day)
	stopped := false
	select {
	case <-run.done:
		stopped = true
	case <-time.After(10 * time.Second):
		h.caughtUp()
	}
	for _, a := range readAggregates(t, h) {
		if a.Status == schemas.StatusFinal || a.PeriodEnd != ms(t, "2026-06-01") {
			t.Errorf("with the period changed: %s revision %d of [%s, %s) value %d",
				a.Status, a.Revision, msTime(a.PeriodStart), msTime(a.PeriodEnd), a.Value)
		}
	}
	if !stopped {
		t.Fatal("the aggregator runs with day periods on state built with month periods")
	}
	if !errors.Is(run.err, ErrPeriodChanged) {
		t.Fatalf("Run = %v, want ErrPeriodChanged", run.err)
	}
	t.Log(run.err)

	// With the period the state was built with, it goes on.
	run = h.start(cfg)
	h.caughtUp()
	select {
	case <-run.done:
		t.Fatalf("the aggregator stopped with the period its state was built with: %v", run.err)
	default:
	}
	var last *schemas.Aggregate
	for _, a := range readAggregates(t, h) {
		last = a
	}
	if last == nil || last.Value != 10 || last.Status != schemas.StatusOpen || last.PeriodEnd != ms(t, "2026-06-01") {
		t.Errorf("last revision %+v, want May OPEN 10", last)
	}
}
