package service

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meterline/meterline/internal/testenv"
)

// TestStatusPageLagNotComputed: while the process's lag computation fails
// (a broker that coordinates a group down until the cluster moves it), its
// scrapes carry no lag series; the page says the lag was not computed
// and why, not that the process exports none, and status.json gives the
// error. Once a computation succeeds the page says nothing of it.
func TestStatusPageLagNotComputed(t *testing.T) {
	reg := prometheus.NewRegistry()
	newFakeStages(reg, false)
	s, _ := newTestServer(t, reg)
	var lagErr error = errors.New("lag: offsets of group meterline-dedup: unable to dial: connection refused")
	s.SetLagError(func() error { return lagErr })
	v := page(t, s)
	testenv.ExpectPageValue(t, v, "lag", "n/a: consumer lag not computed: "+lagErr.Error())
	_, js := get(t, s, "/status.json")
	var st Status
	if err := json.Unmarshal([]byte(js), &st); err != nil {
		t.Fatal(err)
	}
	if st.LagExported || st.LagError != lagErr.Error() {
		t.Errorf("status.json: lag_exported %v, lag_error %q; want false and the error", st.LagExported, st.LagError)
	}
	lagErr = nil
	v = page(t, s)
	testenv.ExpectPageValue(t, v, "lag", "n/a: this process exports no consumer lag (meterline_consumer_lag_records)")
}
