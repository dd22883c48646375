package dedup

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// A partition revoked and assigned back to the same process is opened
// anew while restoring, and its old instance is closed after that: the
// old instance's Close must leave the gauges the new one set, and the new
// one's Close removes them.
func TestGaugesSurviveTheOldInstanceClosing(t *testing.T) {
	reg := prometheus.NewRegistry()
	pr := &processor{m: newMetrics(reg)}
	open := func() *partition {
		pt := &partition{pr: pr, p: 3, pl: "3"}
		pr.owners.Own(pt.p, pt)
		pr.m.watermark.WithLabelValues(pt.pl).Set(7)
		return pt
	}
	old := open()
	newer := open()
	old.Close()
	if n := testutil.CollectAndCount(pr.m.watermark); n != 1 {
		t.Fatalf("after the old instance closed: %d watermark series, want the new instance's", n)
	}
	newer.Close()
	if n := testutil.CollectAndCount(pr.m.watermark); n != 0 {
		t.Fatalf("the owner closed and %d watermark series remain", n)
	}
}
