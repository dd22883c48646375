package cli

import (
	"slices"
	"strings"
	"testing"

	"github.com/meterline/meterline/internal/testenv"
)

// TestMetricsAllowedHosts: every command that serves --metrics-addr takes
// --metrics-allowed-hosts, and its server answers the hosts named there
// and refuses others (docs/operations.md, HTTP servers), here a sink on
// kfake whose ClickHouse is out of reach (it serves its HTTP server all
// the same).
func TestMetricsAllowedHosts(t *testing.T) {
	hosts := []string{"metrics.example", "dedup"}
	flag := "--metrics-allowed-hosts=" + strings.Join(hosts, ",")
	c := parseCLI(t, "dedup", flag)
	for cmd, got := range map[string][]string{
		"dedup":     c.Dedup.MetricsAllowedHosts,
		"aggregate": parseCLI(t, "aggregate", flag).Aggregate.MetricsAllowedHosts,
		"run":       parseCLI(t, "run", flag).Run.MetricsAllowedHosts,
		"ingest":    parseCLI(t, "ingest", flag).Ingest.MetricsAllowedHosts,
		"sink":      parseCLI(t, "sink", flag).Sink.Run.MetricsAllowedHosts,
	} {
		if !slices.Equal(got, hosts) {
			t.Errorf("%s %s: %v", cmd, flag, got)
		}
	}

	_, brokers := testenv.KFake(t)
	metrics := testenv.FreeAddr(t)
	startSinkWithoutClickHouse(t, brokers, metrics, flag)
	for host, want := range map[string]int{"metrics.example": 200, "dedup:9466": 200, metrics: 200, "localhost": 200, "rebound.example": 403} {
		if got := testenv.StatusWithHost(t, "http://"+metrics+"/metrics", host); got != want {
			t.Errorf("Host %s: %d, want %d", host, got, want)
		}
	}
}
