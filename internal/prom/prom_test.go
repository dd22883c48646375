package prom

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestRejectedCounterStartsAtZero: each stage's reasons are exported at 0
// before the first rejection, on a registry the stages share.
func TestRejectedCounterStartsAtZero(t *testing.T) {
	reg := prometheus.NewRegistry()
	a := RejectedCounter(reg, "dedup", "invalid", "too_old")
	b := RejectedCounter(reg, "sink", "uninsertable")
	if a != b {
		t.Fatal("a second stage got another counter: the stages of a process share one")
	}
	if n := testutil.CollectAndCount(a, "meterline_rejected_total"); n != 3 {
		t.Errorf("%d series, want 3 (one per stage and reason)", n)
	}
	for _, l := range [][2]string{{"dedup", "invalid"}, {"dedup", "too_old"}, {"sink", "uninsertable"}} {
		if v := testutil.ToFloat64(a.WithLabelValues(l[0], l[1])); v != 0 {
			t.Errorf("%v = %v, want 0", l, v)
		}
	}
}
