package deploy

import (
	"strings"
	"testing"
)

// TestDashboardShowsEndOfPeriodWork: the aggregator's end-of-period work
// (a period's FINAL revisions going out in chunks, one a transaction) is
// no consumer lag: its input's lag reads 0 meanwhile. The dashboard shows
// it beside the lag an SRE watches: the periods finalizing, the chunks by
// work, and how long ago the oldest FINAL was due, what
// MeterlineFinalOverdue fires on.
func TestDashboardShowsEndOfPeriodWork(t *testing.T) {
	d := loadDashboard(t)
	for _, metric := range []string{"meterline_aggregate_finalizing_periods", "meterline_aggregate_chunks_total", "meterline_aggregate_final_due_seconds"} {
		found := false
		for _, tg := range d.targets() {
			found = found || strings.Contains(tg.expr, metric)
		}
		if !found {
			t.Errorf("no panel shows %s", metric)
		}
	}
}
