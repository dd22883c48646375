package cli

import (
	"context"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

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
	ctx, cancel := context.WithCancel(context.Background())
	var logs testenv.SyncBuffer
	done := make(chan int, 1)
	go func() {
		done <- Main(ctx, []string{"sink", "--brokers", strings.Join(brokers, ","), "--clickhouse", "127.0.0.1:1",
			"--instance-id", "node-1", "--metrics-addr", metrics, flag},
			IO{Stdin: strings.NewReader(""), Stdout: &logs, Stderr: &logs})
	}()
	defer func() {
		cancel()
		select {
		case <-done:
		case <-time.After(60 * time.Second):
			t.Errorf("meterline sink did not stop")
		}
	}()
	waitHTTP(t, "http://"+metrics+"/healthz", 200, 30*time.Second, done, &logs)
	for host, want := range map[string]int{"metrics.example": 200, "dedup:9466": 200, metrics: 200, "localhost": 200, "rebound.example": 403} {
		req, err := http.NewRequest(http.MethodGet, "http://"+metrics+"/metrics", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Host = host
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("Host %s: %d, want %d", host, resp.StatusCode, want)
		}
	}
}
