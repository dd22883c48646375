package sink

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/meterline/meterline/schemas"
)

// TestMetricsAtZeroFromStart: the sink's rejections and quarantined
// records are exported at 0 for every reason it gives before the first
// one, so that rate() and increase() (the dashboard's rejections panel,
// MeterlineRejectionSpike) see the first burst: a series born at its
// first increment hides it.
func TestMetricsAtZeroFromStart(t *testing.T) {
	m := newMetrics(prometheus.NewRegistry())
	if n := testutil.CollectAndCount(m.rejected, "meterline_rejected_total"); n != 3 {
		t.Errorf("meterline_rejected_total: %d series, want 3", n)
	}
	if n := testutil.CollectAndCount(m.quarantined, "meterline_sink_quarantined_total"); n != 3 {
		t.Errorf("meterline_sink_quarantined_total: %d series, want 3", n)
	}
	for _, r := range []string{schemas.ReasonUndecodable, schemas.ReasonUnknownSchema, schemas.ReasonUninsertable} {
		if v := testutil.ToFloat64(m.rejected.WithLabelValues(stage, r)); v != 0 {
			t.Errorf("meterline_rejected_total{stage=sink,reason=%s} = %v, want 0", r, v)
		}
		if v := testutil.ToFloat64(m.quarantined.WithLabelValues(r)); v != 0 {
			t.Errorf("meterline_sink_quarantined_total{reason=%s} = %v, want 0", r, v)
		}
	}
}
