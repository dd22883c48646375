package aggregator

import (
	"math"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/schemas"
)

// TestQueuedRefusedAtBookingNamesItsRecord: an event late by its arrival
// while its period is not final yet is queued behind the period's FINALs;
// refused when it is booked (its sum would wrap), its record of
// usage.rejected names the record of usage.deduped it came from (topic,
// partition, offset, timestamp), as a rejection of an event processed at
// once does. An analyst's query takes an unbilled event back from
// usage_events by those coordinates (docs/analysts.md): without them the
// event stayed billed there.
func TestQueuedRefusedAtBookingNamesItsRecord(t *testing.T) {
	_, brokers := testenv.KFake(t)
	names := testenv.Topics(t, brokers, "", testenv.TopicsOpts{Partitions: 1, Sources: 2, EventsTimestamp: "CreateTime"})
	h := &aggHarness{t: t, brokers: brokers, names: names, group: names.Prefix + "aggregate", createTime: true}
	day := ms(t, "2026-05-04")
	cutoff := day + 25*3600*1000 // the day's end + grace
	ev := func(id string, q, arrival int64) *kgo.Record {
		return h.dedupedEvent(0, &schemas.DedupedEvent{EventID: id, CustomerID: "acme", Meter: "api_calls", Quantity: q,
			EventTime: day + 3600*1000, IngestTime: arrival})
	}
	cfg := h.config("a", vfs.NewMem())
	cfg.Period, cfg.Grace = Day, time.Hour
	run := h.start(cfg)
	// An aggregate 5 short of wrapping; source 0 past the cutoff, source 1
	// lagging: the next events are late by their arrival while the period
	// is not final yet, and are queued.
	h.produce(ev("big", math.MaxInt64-5, day+7200*1000))
	wraps := ev("wraps", 10, cutoff+10)
	h.produce(h.watermark(0, 0, 2, cutoff+100), h.watermark(0, 1, 2, day+3*3600*1000), wraps, ev("fits", 3, cutoff+20))
	h.caughtUp()
	h.produce(h.watermark(0, 1, 2, cutoff+100)) // the period is final: the queued events are booked
	h.caughtUp()
	for deadline := time.Now().Add(30 * time.Second); len(readAdjustments(t, h)) == 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the queued events were not booked")
		}
	}
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}
	rej := readRejected(t, h)
	if len(rej) != 1 || rej[0].EventID != "wraps" || rej[0].Reason != schemas.ReasonInvalid {
		t.Fatalf("rejected %+v, want wraps, invalid", rej)
	}
	r := rej[0]
	if r.SourceTopic != wraps.Topic || r.SourcePartition != wraps.Partition || r.SourceOffset != wraps.Offset ||
		r.SourceTimestamp != wraps.Timestamp.UnixMilli() {
		t.Fatalf("rejected wraps names %s/%d@%d (timestamp %d), want its record of usage.deduped %s/%d@%d (timestamp %d)",
			r.SourceTopic, r.SourcePartition, r.SourceOffset, r.SourceTimestamp,
			wraps.Topic, wraps.Partition, wraps.Offset, wraps.Timestamp.UnixMilli())
	}
}
