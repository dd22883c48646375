package aggregator

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/meterline/meterline/entitlements"
)

// TestEntitlementsStatusTable: the status page's table of the entitlements
// decisions (docs/operations.md, Status page: refused over_limit or
// no_credit, and the micro-credits consumed) counts, by plan and never by
// customer, what the metrics count: a capped customer's 10 accepted events
// and 2 over_limit, a prepaid customer's 10 accepted and 2 no_credit, and
// the micro-credits each plan consumed; and so do the metrics, whose plan
// label never holds a customer. An aggregator without --entitlements says
// it decides nothing.
func TestEntitlementsStatusTable(t *testing.T) {
	const n = 2
	h := newEntHarness(t, nil, n)
	t0 := time.Date(2026, 11, 10, 0, 0, 0, 0, time.UTC).UnixMilli()
	h.produce(h.capAndCredits(n, t0, "cust-free", "cust-paid")...)
	cfg := h.entConfig("a", vfs.NewMem())
	reg := prometheus.NewRegistry()
	cfg.Stream.Registerer = reg
	ctx, cancel := context.WithCancel(context.Background())
	st, err := New(ctx, cfg)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- st.Run(ctx) }()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("aggregator: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("aggregator did not stop within 30s")
		}
	}
	t.Cleanup(stop)
	h.caughtUp()
	awaitDecided(t, h, 24)
	want := [][]string{
		{"free", "10", "2", "0", "0", "0", "1000"},    // overdrawn: 10 × 100
		{"prepaid", "10", "0", "2", "0", "0", "1000"}, // drawn from g1
	}
	// The table counts committed transactions: wait for the last one.
	var tbl string
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		tab := st.EntitlementsTable()
		tbl = fmt.Sprint(tab.Rows)
		if tbl == fmt.Sprint(want) || time.Now().After(deadline) {
			if got, wantCols := fmt.Sprint(tab.Columns), fmt.Sprint([]string{"plan", "accepted", "over_limit", "no_credit", "invalid", "refunded", "credits consumed"}); got != wantCols {
				t.Errorf("columns %s, want %s", got, wantCols)
			}
			break
		}
	}
	if tbl != fmt.Sprint(want) {
		t.Errorf("the status page's entitlements table: rows %s, want %s", tbl, fmt.Sprint(want))
	}
	if strings.Contains(tbl, "cust-") {
		t.Errorf("the status page's entitlements table names a customer: %s", tbl)
	}
	// The metrics: by outcome and plan, never by customer.
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	series := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "meterline_aggregate_entitlement_decisions_total" && mf.GetName() != "meterline_aggregate_credits_consumed_micro_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			var ls []string
			for _, lp := range m.GetLabel() {
				ls = append(ls, lp.GetName()+"="+lp.GetValue())
			}
			series[mf.GetName()+"{"+strings.Join(ls, ",")+"}"] = m.GetCounter().GetValue()
		}
	}
	wantSeries := map[string]float64{
		"meterline_aggregate_entitlement_decisions_total{outcome=accepted,plan=free}":     10,
		"meterline_aggregate_entitlement_decisions_total{outcome=over_limit,plan=free}":   2,
		"meterline_aggregate_entitlement_decisions_total{outcome=accepted,plan=prepaid}":  10,
		"meterline_aggregate_entitlement_decisions_total{outcome=no_credit,plan=prepaid}": 2,
		"meterline_aggregate_credits_consumed_micro_total{plan=free}":                     1000,
		"meterline_aggregate_credits_consumed_micro_total{plan=prepaid}":                  1000,
	}
	if fmt.Sprint(series) != fmt.Sprint(wantSeries) {
		t.Errorf("entitlements metrics:\n got  %v\n want %v", series, wantSeries)
	}
	stop()

	// Without --entitlements: a note, no rows.
	off := h.config("b", vfs.NewMem())
	off.Stream.Registerer = prometheus.NewRegistry()
	ctx2, cancel2 := context.WithCancel(context.Background())
	defer cancel2()
	st2, err := New(ctx2, off)
	if err != nil {
		t.Fatal(err)
	}
	if tab := st2.EntitlementsTable(); len(tab.Rows) != 0 || !strings.Contains(tab.Note, "without --entitlements") {
		t.Errorf("without --entitlements: rows %v, note %q; want none, and a note that says it is off", tab.Rows, tab.Note)
	}
}

// TestPlanLabelsBounded: the plan label of the entitlements metrics is the
// plan's name for the first 64 names, "other" after (a runaway script
// writing plans must not make the metrics unbounded), and a name keeps its
// label; no plan is "none", a plan without a name "unnamed".
func TestPlanLabelsBounded(t *testing.T) {
	var p planLabels
	labels := map[string]bool{}
	for i := range 200 {
		labels[p.label(&entitlements.Plan{Name: fmt.Sprintf("plan-%03d", i)})] = true
	}
	if len(labels) != maxPlanLabels+1 || !labels["other"] {
		t.Errorf("200 plan names made %d labels, want the first %d and other", len(labels), maxPlanLabels)
	}
	for i := range 200 {
		name := fmt.Sprintf("plan-%03d", i)
		want := name
		if i >= maxPlanLabels {
			want = "other"
		}
		if got := p.label(&entitlements.Plan{Name: name}); got != want {
			t.Fatalf("%s labelled %q the second time, want %q", name, got, want)
		}
	}
	if got := p.label(nil); got != "none" {
		t.Errorf("no plan labelled %q, want none", got)
	}
	if got := p.label(&entitlements.Plan{}); got != "unnamed" {
		t.Errorf("a plan without a name labelled %q, want unnamed", got)
	}
}
