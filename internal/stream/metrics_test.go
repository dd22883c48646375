package stream

import (
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestRestoreCountersStartAtZero: every kind/reason series of
// meterline_stream_restores_total exists at 0 before any restore. A series
// born at its first increment starts at 1, and increase() (the alert
// rules) never sees that restore.
func TestRestoreCountersStartAtZero(t *testing.T) {
	reg := prometheus.NewRegistry()
	newMetrics(reg, "dedup")
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "meterline_stream_restores_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			ls := map[string]string{}
			for _, l := range m.GetLabel() {
				ls[l.GetName()] = l.GetValue()
			}
			if ls["stage"] != "dedup" {
				t.Errorf("series %v: want stage dedup", ls)
			}
			got[ls["kind"]+"/"+ls["reason"]] = m.GetCounter().GetValue()
		}
	}
	want := []string{"full/no_state", "full/below_log_start", "full/retention_unknown", "full/undated_checkpoint",
		"full/checkpoint_in_future", "full/horizon", "tail/current", "tail/within_horizon"}
	for _, k := range want {
		v, ok := got[k]
		if !ok || v != 0 {
			t.Errorf("restores_total{%s}: %v (present %v), want 0 before any restore", k, v, ok)
		}
	}
	if len(got) != len(want) {
		t.Errorf("restores_total series %v, want exactly %v", got, want)
	}
}

// TestRecordsOutByTopic: meterline_stream_records_out_total counts every
// emitted record under its own topic, when partitions emit at once
// (out keeps each topic's counter once looked up).
func TestRecordsOutByTopic(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := newMetrics(reg, "aggregate")
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 1000 {
				topic := "usage.aggregates"
				if (g+i)%4 == 0 {
					topic = "usage.rejected"
				}
				m.out(topic).Inc()
			}
		}()
	}
	wg.Wait()
	for topic, want := range map[string]float64{"usage.aggregates": 3000, "usage.rejected": 1000} {
		if got := testutil.ToFloat64(m.recordsOut.WithLabelValues(topic)); got != want {
			t.Errorf("records_out_total{topic=%q} = %v, want %v", topic, got, want)
		}
	}
}
