package deploy

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/internal/topics"
)

// realKeysAuthMaxAge is the --auth-max-age of TestRealIngestKeysStaleAlert's
// ingest: the default (2m) scaled as realScale scales
// MeterlineIngestKeysStale (minutes to 4 s), so that the alert fires as the
// ingest starts refusing, as it does with the defaults.
const realKeysAuthMaxAge = 8 * time.Second

// TestRealIngestKeysStaleAlert runs the shipped alert rules (scaled as
// TestRealAlertsFire's, realScale) in a real Prometheus scraping a real
// `meterline ingest --auth-max-age 8s` on the real broker:
//
//  1. Prometheus scrapes the ingest from its start: it loads its keys and
//     confirms them every 2 s; MeterlineIngestKeysStale is never active
//     while requests are accepted.
//  2. Its keys topic deleted (out of its reach: its ends cannot be
//     listed): the age grows, the ingest answers 503 with Retry-After and
//     /readyz fails, and the alert fires while the process is up.
//  3. The keys topic created again: the ingest reads it to its end and is
//     ready again, and the alert resolves.
func TestRealIngestKeysStaleAlert(t *testing.T) {
	promBin := realPrometheus(t, "alert rules")
	parallelAlertTest(t)
	brokers := testenv.RealKafka(t)
	work := testenv.LogDir(t, "meterline-alerts-keys-test-*")
	bin := testenv.Meterline(t)

	prefix := testenv.Name(t, "alertskeys") + "."
	names := topics.DefaultNames()
	names.Prefix = prefix
	deleteTopicsAfter(t, brokers, prefix)
	createTopics := func(n int) {
		runCmd(t, bin, filepath.Join(work, fmt.Sprintf("topics-%d.log", n)), "topics", "create", "--brokers", strings.Join(brokers, ","),
			"--topic-prefix", prefix, "--partitions", "2", "--replication-factor", "1")
	}
	createTopics(1)
	token := createKey(t, bin, filepath.Join(work, "keys.log"), "keys", "create", "--brokers", strings.Join(brokers, ","),
		"--topic-prefix", prefix, "--tenant", "acme", "--allow-customers", "*")

	rulesFile := filepath.Join(work, "alerts.yml")
	if err := os.WriteFile(rulesFile, scaledRules(t, realScale), 0o644); err != nil {
		t.Fatal(err)
	}
	ingestAddr, metricsAddr := testenv.FreeAddr(t), testenv.FreeAddr(t)
	prom := startPrometheus(t, promBin, work, rulesFile, metricsAddr)
	w := &alertWatch{t: t, prom: prom, fired: map[string]bool{}}
	started := time.Now()
	ingest := testenv.StartProcess(t, "ingest", filepath.Join(work, "ingest.log"), bin, "ingest",
		"--brokers", strings.Join(brokers, ","), "--topic-prefix", prefix, "--log-level", "info",
		"--addr", ingestAddr, "--metrics-addr", metricsAddr, "--auth-max-age", realKeysAuthMaxAge.String())
	sent := 0
	post := func() int {
		t.Helper()
		sent++
		resp, answer, err := postEvent(context.Background(), "http://"+ingestAddr+"/v1/events", token, fmt.Sprintf("e-%d", sent), "cust-1", 1)
		if err != nil {
			t.Fatalf("post: %v", err)
		}
		if resp.StatusCode == http.StatusServiceUnavailable && resp.Header.Get("Retry-After") == "" {
			t.Errorf("503 without Retry-After: %s", answer)
		}
		return resp.StatusCode
	}
	stale := map[string]string{"instance": metricsAddr}

	t.Log("---- 1. the ingest starts and serves")
	waitHTTP(t, "http://"+metricsAddr+"/readyz", 90*time.Second)
	// From its start, longer than the scaled rule needs to fire (4 s
	// above 4 s), with Prometheus reading its age.
	for time.Since(started) < 20*time.Second {
		if a := w.find("MeterlineIngestKeysStale", stale); a != nil {
			t.Fatalf("MeterlineIngestKeysStale active %s after the ingest started: %v", time.Since(started).Round(time.Second), a)
		}
		if s := post(); s != http.StatusAccepted {
			t.Fatalf("a healthy ingest answered %d", s)
		}
		time.Sleep(500 * time.Millisecond)
	}
	w.waitValue(`count(meterline_ingest_keys_age_seconds < 4)`, 1, 10*time.Second)

	t.Log("---- 2. the keys topic deleted")
	adm := testenv.Admin(t, brokers)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	res, err := adm.DeleteTopics(ctx, names.KeysTopic())
	cancel()
	if err == nil {
		err = res.Error()
	}
	if err != nil {
		t.Fatalf("delete %s: %v", names.KeysTopic(), err)
	}
	w.waitFiring("MeterlineIngestKeysStale", stale)
	if s := post(); s != http.StatusServiceUnavailable {
		t.Errorf("the ingest whose keys are stale answered %d; want 503", s)
	}
	if resp, err := http.Get("http://" + metricsAddr + "/readyz"); err != nil || resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("/readyz of the ingest whose keys are stale: %v %v; want 503", resp, err)
	} else {
		resp.Body.Close()
	}
	w.expectOnly("the keys topic deleted", "MeterlineIngestKeysStale")

	t.Log("---- 3. the keys topic created again")
	createTopics(2)
	waitHTTP(t, "http://"+metricsAddr+"/readyz", 30*time.Second)
	w.waitResolved("MeterlineIngestKeysStale", stale)
	w.expectRulesHealthy()
	w.expectFired(realKeysAlertsFired)
	ingest.Stop(t)
}
