package service

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meterline/meterline/internal/prom"
	"github.com/meterline/meterline/internal/testenv"
)

// TestStatusPageAggregatorFinalizing: an aggregator with its input lag 0
// that is still sending a period's FINAL revisions in chunks, the period
// due long ago, is not "running" with nothing to say: its state says it
// is finalizing, and the page and status.json say when the oldest FINAL
// was due and by how much it is overdue (the FINAL-overdue alert's
// threshold makes it bad). Another stage, and an aggregator with nothing
// going out and its oldest FINAL due later, say nothing of it but when
// that is due.
func TestStatusPageAggregatorFinalizing(t *testing.T) {
	reg := prometheus.NewRegistry()
	stages := newFakeStages(reg, true)
	f := prom.NewFactory(reg)
	finalizing := f.NewGaugeVec(prometheus.GaugeOpts{Name: "meterline_aggregate_finalizing_periods"}, []string{"partition"})
	due := f.NewGaugeVec(prometheus.GaugeOpts{Name: "meterline_aggregate_final_due_seconds"}, []string{"partition"})
	s, clk := newTestServer(t, reg)
	agg := &fakeStage{stage: "aggregate", group: "a", input: "usage.deduped.v2", joined: true,
		parts: []fakePartition{{p: 0}, {p: 1}}}
	dd := &fakeStage{stage: "dedup", group: "d", input: "usage.events", joined: true, parts: []fakePartition{{p: 0}}}
	s.AddStatus(func() StageStatus { return StageStatusOf(dd) })
	s.AddStatus(func() StageStatus { return StageStatusOf(agg) })
	for _, p := range []string{"0", "1"} {
		stages.lagRecs.WithLabelValues("a", "usage.deduped.v2", p).Set(0)
		stages.lagSecs.WithLabelValues("a", "usage.deduped.v2", p).Set(0)
		finalizing.WithLabelValues(p).Set(0)
	}

	// Nothing going out; the oldest open period is due in 10 minutes.
	due.WithLabelValues("0").Set(float64(clk.t.Add(10 * time.Minute).Unix()))
	v := page(t, s)
	testenv.ExpectPageValue(t, v, "stage/aggregate/state", "running")
	testenv.ExpectPageValue(t, v, "final_due/aggregate", "oldest FINAL due 2026-11-29T12:10:00Z")
	if _, ok := v["final_due/dedup"]; ok {
		t.Error("the page gives dedup a FINAL due time")
	}

	// Two periods of partition 1 going out, the oldest due 45 minutes ago.
	finalizing.WithLabelValues("1").Set(2)
	due.WithLabelValues("1").Set(float64(clk.t.Add(-45 * time.Minute).Unix()))
	v = page(t, s)
	testenv.ExpectPageValue(t, v, "stage/aggregate/state", "finalizing 2 periods")
	testenv.ExpectPageValue(t, v, "stage/aggregate/lag_records", "0")
	testenv.ExpectPageValue(t, v, "final_due/aggregate", "oldest FINAL due 2026-11-29T11:15:00Z, overdue by 2700 s")
	testenv.ExpectPageValue(t, v, "finalizing/aggregate", "2")
	_, body := get(t, s, "/")
	if !strings.Contains(body, `class="pill bad" data-k="final_due/aggregate"`) {
		t.Error("a FINAL overdue by more than the alert's 30 minutes is not shown bad")
	}
	_, js := get(t, s, "/status.json")
	var st Status
	if err := json.Unmarshal([]byte(js), &st); err != nil {
		t.Fatal(err)
	}
	a := st.Stages[1]
	if a.FinalizingPeriods == nil || *a.FinalizingPeriods != 2 || a.FinalDue == nil || !a.FinalDue.Equal(clk.t.Add(-45*time.Minute)) ||
		a.FinalOverdueSeconds == nil || *a.FinalOverdueSeconds != 2700 {
		t.Errorf("status.json aggregate: finalizing %v, due %v, overdue %v; want 2, 11:15, 2700", a.FinalizingPeriods, a.FinalDue, a.FinalOverdueSeconds)
	}
	if d := st.Stages[0]; d.FinalizingPeriods != nil || d.FinalDue != nil {
		t.Errorf("status.json dedup has finalizing %v, due %v", d.FinalizingPeriods, d.FinalDue)
	}
}

// TestStatusPageSinkState: the sink's row, whose status function gives
// its identity only, says from the sink's metrics what keeps it from
// inserting, as dedup's and the aggregator's rows do: ClickHouse
// unreachable, backing off because ClickHouse cannot take a block, or out
// of its group; never "running" in green meanwhile.
func TestStatusPageSinkState(t *testing.T) {
	reg := prometheus.NewRegistry()
	stages := newFakeStages(reg, false)
	f := prom.NewFactory(reg)
	up := f.NewGauge(prometheus.GaugeOpts{Name: "meterline_sink_clickhouse_up"})
	blocked := f.NewGauge(prometheus.GaugeOpts{Name: "meterline_sink_blocked"})
	member := f.NewGauge(prometheus.GaugeOpts{Name: "meterline_sink_group_member"})
	stages.sinkOwned.Set(3)
	s, _ := newTestServer(t, reg)
	s.AddStatus(func() StageStatus { return StageStatus{Stage: "sink", Group: "meterline-sink", Instance: "i1"} })
	for _, c := range []struct {
		up, blocked, member float64
		state, class        string
	}{
		{0, 0, 0, "ClickHouse unreachable", "bad"},
		{1, 1, 1, "backing off: ClickHouse cannot take a block", "bad"},
		{1, 0, 0, "not in the group", "bad"},
		{1, 0, 1, "running", "ok"},
	} {
		up.Set(c.up)
		blocked.Set(c.blocked)
		member.Set(c.member)
		v := page(t, s)
		testenv.ExpectPageValue(t, v, "stage/sink/state", c.state)
		_, body := get(t, s, "/")
		if !strings.Contains(body, `<span class="pill `+c.class+`" data-k="stage/sink/state">`) {
			t.Errorf("%s: the pill is not %s", c.state, c.class)
		}
		_, js := get(t, s, "/status.json")
		var st Status
		if err := json.Unmarshal([]byte(js), &st); err != nil {
			t.Fatal(err)
		}
		if j := st.Stages[0].Joined; j == nil || *j != (c.member == 1) {
			t.Errorf("%s: status.json joined %v", c.state, j)
		}
	}
}
