package aggregator

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// A partition revoked and assigned back to the same process is opened
// anew while restoring, and its old instance is closed after that: the
// old instance's Close must leave the gauges the new one set (the
// watermark, final-due and entitlements-stalled alerts read them), and
// the new one's Close removes them: a gauge left behind by a partition
// that moved to another instance would stay at its last value for the
// life of the process (a gate's records counted on two instances,
// MeterlineEntitlementsStalled firing on one that owns nothing).
func TestGaugesSurviveTheOldInstanceClosing(t *testing.T) {
	reg := prometheus.NewRegistry()
	pr := &processor{m: newMetrics(reg)}
	open := func() *partition {
		pt := &partition{pr: pr, p: 3, pl: "3", wm: 7000}
		pr.owners.Own(pt.p, pt)
		pt.keysGauge = pr.m.keys.WithLabelValues(pt.pl)
		pt.pendingGauge = pr.m.finalizing.WithLabelValues(pt.pl)
		pt.publish()
		pr.m.gated.WithLabelValues(pt.pl).Set(2)
		return pt
	}
	old := open()
	newer := open()
	old.Close()
	if v, ok := gaugeOf(reg, "meterline_aggregate_watermark_seconds", "partition", "3"); !ok || v != 7 {
		t.Fatalf("after the old instance closed: watermark gauge %v (present %v), want 7", v, ok)
	}
	if v, ok := gaugeOf(reg, "meterline_aggregate_gated_records", "partition", "3"); !ok || v != 2 {
		t.Fatalf("after the old instance closed: gated records gauge %v (present %v), want 2", v, ok)
	}
	newer.Close()
	if _, ok := gaugeOf(reg, "meterline_aggregate_watermark_seconds", "partition", "3"); ok {
		t.Fatal("the owner closed and the watermark gauge is still there")
	}
	if v, ok := gaugeOf(reg, "meterline_aggregate_gated_records", "partition", "3"); ok {
		t.Fatalf("the owner closed and the gated records gauge is still there (%v)", v)
	}
}
