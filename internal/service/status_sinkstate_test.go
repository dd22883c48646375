package service

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meterline/meterline/internal/prom"
	"github.com/meterline/meterline/internal/testenv"
)

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
