package aggregator

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// A partition one of whose dedup sources has forwarded a watermark while
// another never has (its dedup partition stuck from the start) has no
// watermark: the minimum over the sources is 0 and no period can be
// finalized. Its watermark gauge must say so, at 0, rather than be absent:
// MeterlineWatermarkStopped (changes() == 0) sees no absent series, so the
// stuck source would go unnoticed until MeterlineFinalOverdue, grace and
// half an hour after the first period's end.
func TestWatermarkGaugeWithASourceThatNeverForwarded(t *testing.T) {
	reg := prometheus.NewRegistry()
	pr := &processor{m: newMetrics(reg)}
	pt := &partition{pr: pr, p: 1, pl: "1", sources: []int64{0, 0}}
	pr.owners.Own(pt.p, pt)
	pt.keysGauge = pr.m.keys.WithLabelValues(pt.pl)
	pt.pendingGauge = pr.m.finalizing.WithLabelValues(pt.pl)
	pt.publish()
	if v, ok := gaugeOf(reg, "meterline_aggregate_watermark_seconds", "partition", "1"); ok {
		t.Fatalf("no source forwarded a watermark yet: gauge %v, want none", v)
	}
	pt.sources[0] = 5000 // source 0 forwards; source 1 never does
	pt.wm = minWatermark(pt.sources)
	pt.publish()
	if v, ok := gaugeOf(reg, "meterline_aggregate_watermark_seconds", "partition", "1"); !ok || v != 0 {
		t.Fatalf("source 1 never forwarded: gauge %v (present %v), want 0", v, ok)
	}
	pt.sources[1] = 7000
	pt.wm = minWatermark(pt.sources)
	pt.publish()
	if v, ok := gaugeOf(reg, "meterline_aggregate_watermark_seconds", "partition", "1"); !ok || v != 5 {
		t.Fatalf("both sources forwarded: gauge %v (present %v), want 5", v, ok)
	}
}
