package aggregator

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/meterline/meterline/schemas"
)

var errInjected = errors.New("injected encoding failure")

// failEncoding makes encode fail for messages of the kinds of ms until the
// test ends or restore is called.
func failEncoding(t *testing.T, ms ...schemas.Message) (restore func()) {
	kinds := map[schemas.Kind]bool{}
	for _, m := range ms {
		kinds[m.Kind()] = true
	}
	encode = func(m schemas.Message) ([]byte, error) {
		if kinds[m.Kind()] {
			return nil, errInjected
		}
		return schemas.Encode(m)
	}
	restore = func() { encode = schemas.Encode }
	t.Cleanup(restore)
	return restore
}

func readAdjustments(t testing.TB, h *aggHarness) []*schemas.Adjustment {
	return readTopic[schemas.Adjustment](t, h.brokers, h.names.AdjustmentsTopic())
}

func readRejected(t testing.TB, h *aggHarness) []*schemas.Rejected {
	return readTopic[schemas.Rejected](t, h.brokers, h.names.RejectedTopic())
}

// checkRejected: exactly the events ids are rejected, invalid, saying
// why; the stage goes on.
func checkRejected(t *testing.T, h *aggHarness, reg *prometheus.Registry, run *aggRunning, ids ...string) {
	t.Helper()
	rej := readRejected(t, h)
	var got []string
	for _, r := range rej {
		if r.Reason != schemas.ReasonInvalid || !strings.Contains(r.Detail, errInjected.Error()) {
			t.Errorf("rejected %s: %s %q, want %s saying %q", r.EventID, r.Reason, r.Detail, schemas.ReasonInvalid, errInjected)
		}
		got = append(got, r.EventID)
	}
	if strings.Join(got, " ") != strings.Join(ids, " ") {
		t.Fatalf("rejected %v, want %v", got, ids)
	}
	if got := counterWith(reg, "meterline_rejected_total", "reason", schemas.ReasonInvalid); got != float64(len(ids)) {
		t.Errorf("meterline_rejected_total{reason=invalid} = %v, want %d", got, len(ids))
	}
	select {
	case <-run.done:
		t.Fatalf("the stage stopped: %v", run.err)
	default:
	}
}

// TestAdjustmentEncodeFailureRejects: were a late event's adjustment not
// encodable, the event is rejected (invalid, counted, in usage.rejected)
// and the stage goes on; nothing of it reaches the state, so the next late
// events of the period measure their deltas as if it never came: a MAX
// that it would have raised, a UNIQUE_COUNT value it would have made seen.
func TestAdjustmentEncodeFailureRejects(t *testing.T) {
	h := newAggHarness(t, nil, 1)
	cat, err := ParseMeters([]byte("meters:\n  - {name: mx, aggregation: MAX}\n  - {name: u, aggregation: UNIQUE_COUNT, property: user}\n"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := h.config("a", vfs.NewMem())
	cfg.Period, cfg.Grace, cfg.Meters = Day, time.Hour, cat
	reg := prometheus.NewRegistry()
	cfg.Stream.Registerer = reg
	run := h.start(cfg)

	day := ms(t, "2026-05-04")
	cutoff := day + 25*3600*1000 // end + grace
	ev := func(id, meter string, qty, arrival int64, user string) {
		h.produce(h.dedupedEvent(0, &schemas.DedupedEvent{EventID: id, CustomerID: "acme", Meter: meter, Quantity: qty,
			EventTime: day + 3600*1000, IngestTime: arrival, Properties: []schemas.Property{{Name: "user", Value: user}}}))
	}
	ev("mx-1", "mx", 5, day+7200*1000, "x")
	ev("u-1", "u", 1, day+7200*1000, "x")
	h.produce(h.watermark(0, 0, 1, cutoff+1))
	h.caughtUp()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
		finals := 0
		for _, a := range readAggregates(t, h) {
			if a.Status == schemas.StatusFinal {
				finals++
			}
		}
		if finals == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d FINAL revisions, want 2", finals)
		}
	}

	restore := failEncoding(t, &schemas.Adjustment{})
	ev("mx-2", "mx", 9, cutoff+10, "x")
	ev("u-2", "u", 1, cutoff+20, "y")
	h.caughtUp()
	checkRejected(t, h, reg, run, "mx-2", "u-2")
	restore()
	ev("mx-3", "mx", 7, cutoff+30, "x")
	ev("u-3", "u", 1, cutoff+40, "y")
	h.caughtUp()

	adjs := readAdjustments(t, h)
	got := map[string]int64{}
	for _, a := range adjs {
		got[a.EventID] = a.Delta
	}
	if len(adjs) != 2 || got["mx-3"] != 2 || got["u-3"] != 1 {
		t.Fatalf("adjustments %v, want mx-3 +2 (7 over the FINAL 5) and u-3 +1 (y is new): the rejected events counted", got)
	}
}

// startDaily starts an aggregator of daily periods with an hour's grace on
// one partition that two sources feed (so that one source's watermark can
// lag), its metrics in reg.
func startDaily(t *testing.T) (h *aggHarness, reg *prometheus.Registry, run *aggRunning) {
	h = newAggHarnessSources(t, nil, 1, 2)
	cfg := h.config("a", vfs.NewMem())
	cfg.Period, cfg.Grace = Day, time.Hour
	reg = prometheus.NewRegistry()
	cfg.Stream.Registerer = reg
	return h, reg, h.start(cfg)
}

// TestQueueEncodeFailureRejects: an event late by its arrival while its
// period is not final yet (one source's watermark lags) is queued in the
// state behind the period's FINALs. Were the event not encodable, it is
// rejected instead, and the stage goes on: the period's FINAL and the other
// queued event's adjustment come out as without it.
func TestQueueEncodeFailureRejects(t *testing.T) {
	h, reg, run := startDaily(t)
	day := ms(t, "2026-05-04")
	cutoff := day + 25*3600*1000 // the day's end + grace
	ev := func(id string, qty, arrival int64) {
		h.produce(h.dedupedEvent(0, &schemas.DedupedEvent{EventID: id, CustomerID: "acme", Meter: "m", Quantity: qty,
			EventTime: day + 3600*1000, IngestTime: arrival}))
	}
	ev("on-time", 5, day+7200*1000)
	h.produce(h.watermark(0, 0, 2, cutoff+100), h.watermark(0, 1, 2, day+3*3600*1000))
	restore := failEncoding(t, &schemas.DedupedEvent{})
	ev("late-1", 7, cutoff+10)
	h.caughtUp()
	checkRejected(t, h, reg, run, "late-1")
	restore()
	ev("late-2", 11, cutoff+20)
	h.produce(h.watermark(0, 1, 2, cutoff+100))
	h.caughtUp()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
		if len(readAdjustments(t, h)) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no adjustment for late-2")
		}
	}
	var final int64 = -1
	for _, a := range readAggregates(t, h) {
		if a.Status == schemas.StatusFinal {
			final = a.Value
		}
	}
	adjs := readAdjustments(t, h)
	if final != 5 || len(adjs) != 1 || adjs[0].EventID != "late-2" || adjs[0].Delta != 11 {
		t.Fatalf("FINAL %d, adjustments %+v; want FINAL 5 and late-2 alone, +11", final, adjs)
	}
}

// TestBookedEncodeFailureRejects: a queued event booked behind its
// period's FINAL whose adjustment was not encodable is rejected all the
// same, the detail saying why, and the stage goes on. Its raw value is
// the event as it was queued: nothing is re-encoded for usage.rejected
// (which fails here too).
func TestBookedEncodeFailureRejects(t *testing.T) {
	h, reg, run := startDaily(t)
	day := ms(t, "2026-05-04")
	cutoff := day + 25*3600*1000 // the day's end + grace
	for _, e := range []*schemas.DedupedEvent{
		{EventID: "on-time", CustomerID: "acme", Meter: "m", Quantity: 5, EventTime: day + 3600*1000, IngestTime: day + 7200*1000},
		{EventID: "queued", CustomerID: "acme", Meter: "m", Quantity: 7, EventTime: day + 3600*1000, IngestTime: cutoff + 10},
	} {
		h.produce(h.dedupedEvent(0, e))
	}
	h.produce(h.watermark(0, 0, 2, cutoff+100), h.watermark(0, 1, 2, day+3*3600*1000))
	h.caughtUp()
	failEncoding(t, &schemas.Adjustment{}, &schemas.DedupedEvent{})
	h.produce(h.watermark(0, 1, 2, cutoff+100))
	h.caughtUp()
	for deadline := time.Now().Add(time.Minute); len(readRejected(t, h)) == 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the queued event was neither booked nor rejected")
		}
	}
	checkRejected(t, h, reg, run, "queued")
	if rej := readRejected(t, h)[0]; len(rej.RawValue) == 0 || strings.Contains(rej.Detail, "cannot be re-encoded") {
		t.Errorf("rejected: raw value %d bytes, detail %q; want the event as queued, nothing re-encoded", len(rej.RawValue), rej.Detail)
	}
	if adjs := readAdjustments(t, h); len(adjs) != 0 {
		t.Errorf("%d adjustments, want none", len(adjs))
	}
}
