package demo

import (
	"bytes"
	"strings"
	"testing"

	"github.com/meterline/meterline/schemas"
)

// TestReportColumnsAlign: every check line of the reconciliation, with
// every customer and meter of the generator and the ClickHouse part, has
// its generated and counted numbers in the same columns, so that the
// report reads as a table.
func TestReportColumnsAlign(t *testing.T) {
	tr := newTruth(nil)
	got := map[string]map[string]int64{}
	for _, c := range customers {
		tr.totals[c], got[c] = map[string]int64{}, map[string]int64{}
		for _, m := range meters {
			tr.totals[c][m], got[c][m] = 1234567, 1234567
		}
	}
	tr.bad[schemas.ReasonInvalid] = 3
	ta := tally{byReason: map[string]int64{schemas.ReasonInvalid: 3}, got: got, aggRejected: map[string]int64{}, balances: map[string]*schemas.Balance{}}
	ch := &chResult{addr: "127.0.0.1:9000", db: "meterline_demo", counts: map[string]int64{}, meterTotal: map[string]int64{}, aggRejected: map[string]int64{}}
	var out bytes.Buffer
	r := &reconciler{w: &out, ok: true}
	r.checkTopics(tr, ta)
	r.checkEntitlements(tr, ta, &entSetup{})
	r.checkClickHouse(tr, ta, ch)
	col := -1
	n := 0
	for _, l := range strings.Split(out.String(), "\n") {
		i := strings.Index(l, " generated ")
		if i < 0 {
			continue
		}
		n++
		if col < 0 {
			col = i
		}
		if i != col {
			t.Errorf("\"generated\" at column %d, not %d as on the first line: %q", i, col, l)
		}
	}
	if n < len(customers)*len(meters) {
		t.Fatalf("%d check lines, want at least one per customer and meter:\n%s", n, out.String())
	}
}
