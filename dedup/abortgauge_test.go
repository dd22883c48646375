package dedup

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/internal/stream"
)

// TestAbortedWatermarkNotPublished: meterline_dedup_watermark_seconds is
// the committed partition watermark, which never goes back. A transaction
// that read later records and aborted must not leave its watermark in the
// gauge: the records are read again, and until then the gauge would show
// a time the partition never committed, then go back.
func TestAbortedWatermarkNotPublished(t *testing.T) {
	pr := localProcessor(t, Config{AllowCreateTime: true}, prometheus.NewRegistry())
	l, err := stream.NewLocal(pr, 0, pr.eventsTopic)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	tick := func(off, ts int64) *kgo.Record {
		return &kgo.Record{Topic: pr.eventsTopic, Offset: off, Timestamp: time.UnixMilli(ts), Value: pr.tickValue,
			Headers: pr.keys.tickHeaders(pr.eventsTopic, 0, pr.tickValue)}
	}
	gauge := func() float64 { return testutil.ToFloat64(pr.m.watermark.WithLabelValues("0")) }
	committed := t0 + 10*day
	if err := l.Process([]*kgo.Record{tick(0, committed)}); err != nil {
		t.Fatal(err)
	}
	if err := l.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := l.Process([]*kgo.Record{tick(1, committed+hour)}); err != nil {
		t.Fatal(err)
	}
	l.Abort()
	if got, want := gauge(), float64(committed)/1000; got != want {
		t.Fatalf("after the abort the watermark gauge is %v, want the committed %v", got, want)
	}
}
