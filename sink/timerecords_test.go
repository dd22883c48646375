package sink

import (
	"testing"
	"time"
)

// TestTimeRecordsIn: of the records the sink polls, the watermark records
// of usage.deduped are counted apart, as time records (no row): the
// records in less these are the rows' records, the input
// MeterlineRejectionSpike divides the sink's rejections by
// (docs/operations.md).
func TestTimeRecordsIn(t *testing.T) {
	e := newEnv(t, 2)
	recs, rows := e.events(30, base) // a watermark after every 10th event
	e.produce(recs...)
	r := e.start(nil)
	e.waitCaughtUp(2*time.Minute, e.names.DedupedTopic())
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	e.exact(TableEvents, uint64(rows))
	topic := e.names.DedupedTopic()
	in := metric(t, r.reg, "meterline_sink_records_in_total", "topic", topic)
	tm := metric(t, r.reg, "meterline_sink_time_records_in_total", "topic", topic)
	if watermarks := float64(len(recs) - rows); tm != watermarks || in != float64(len(recs)) {
		t.Errorf("records in %v, time records in %v; want %d and %v (the watermark records)", in, tm, len(recs), watermarks)
	}
	if got := metric(t, r.reg, "meterline_sink_time_records_in_total", "topic", e.names.AggregatesTopic()); got != 0 {
		t.Errorf("time records in of %s: %v, want 0", e.names.AggregatesTopic(), got)
	}
}
