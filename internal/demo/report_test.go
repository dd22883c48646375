package demo

import (
	"bytes"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meterline/meterline/internal/prom"
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

// TestProgressLineSeparatesRefusals: the progress line the demo prints
// when not on a terminal counts bad input apart from the events the
// aggregator refused for a cap or for want of credit, as the final report
// does ("bad events = rejected events", "refused by a cap", "refused for
// want of credit"), so that its numbers are the report's.
func TestProgressLineSeparatesRefusals(t *testing.T) {
	reg := prometheus.NewRegistry()
	rej := prom.RejectedCounter(reg, "dedup")
	rej.WithLabelValues("dedup", schemas.ReasonInvalid).Add(5)
	rej.WithLabelValues("dedup", schemas.ReasonTooOld).Add(2)
	rej.WithLabelValues("aggregator", schemas.ReasonOverLimit).Add(30)
	rej.WithLabelValues("aggregator", schemas.ReasonNoCredit).Add(9)
	var out bytes.Buffer
	render(Config{Out: &out}, time.Now(), newTruth(nil), reg, nil, &recovery{}, nil)
	if want := "rejected 7 · refused by caps and credits 39 ·"; !strings.Contains(out.String(), want) {
		t.Errorf("progress line %q does not say %q", out.String(), want)
	}
}

// TestReportSaysWhatItCompares: the reconciliation says what its two
// columns are, that the events refused by caps and credits (which passed
// dedup, so "unique events produced = events counted" counts them) are in
// no total, and what a RECONCILED run has shown.
func TestReportSaysWhatItCompares(t *testing.T) {
	tr := newTruth(nil)
	tr.unique = 10
	tr.entRejected[schemas.ReasonOverLimit], tr.entRejected[schemas.ReasonNoCredit] = 2, 1
	ta := tally{counted: 10, byReason: map[string]int64{}, got: map[string]map[string]int64{}, aggRejected: map[string]int64{}, balances: map[string]*schemas.Balance{}}
	var out bytes.Buffer
	r := &reconciler{w: &out, ok: true}
	r.checkTopics(tr, ta)
	r.verdict(true)
	for _, want := range []string{
		"generated: what the generator sent",
		"counted: what the committed output topics hold",
		"the 3 events refused by caps and credits passed dedup and are in none",
		"== RECONCILED: every event counted exactly once, through the crash",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
}

// TestReportExplainsAggregatesAndBalances: the reconciliation's count of
// aggregates, FINAL ones and adjustments, and its count of balances, are
// each followed by a line that says what those records are.
func TestReportExplainsAggregatesAndBalances(t *testing.T) {
	tr := newTruth(nil)
	ta := tally{byReason: map[string]int64{}, got: map[string]map[string]int64{}, aggRejected: map[string]int64{},
		balances: map[string]*schemas.Balance{}, latest: map[string]*schemas.Aggregate{"k": {}}, finals: 0, adjs: 4, nBalances: 7}
	var out bytes.Buffer
	r := &reconciler{w: &out, ok: true}
	r.checkTopics(tr, ta)
	r.checkEntitlements(tr, ta, &entSetup{})
	lines := strings.Split(out.String(), "\n")
	for _, c := range []struct{ count, explains string }{
		{"   1 aggregates (0 FINAL), 4 adjustments", "one per customer, meter and hour"},
		{"   7 balances in usage.balances", "usage against its caps and the credits left"},
	} {
		i := slices.Index(lines, c.count)
		if i < 0 || i+1 >= len(lines) || !strings.Contains(lines[i+1], c.explains) {
			t.Errorf("the line %q is not followed by one that says %q:\n%s", c.count, c.explains, out.String())
		}
	}
}
