package deploy

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/internal/topics"
	"github.com/meterline/meterline/schemas"
)

// TestRealEntitlementsStalledAlert runs the shipped alert rules (scaled as
// TestRealAlertsFire's, realScale) in a real Prometheus scraping a real
// `meterline aggregate --entitlements` on the real broker, with records
// written to usage.deduped all along (20 a second, as dedup would write
// them):
//
//  1. Ticks every 200ms: the gate holds what arrived since the last tick;
//     MeterlineEntitlementsStalled is never active.
//  2. Restarted with --entitlements-tick=-1s (no ticks: its entitlements
//     partitions are not read forward): the gate grows while its lag
//     stays low, and the alert fires.
//  3. Restarted with ticks: the gate drains and the alert resolves.
func TestRealEntitlementsStalledAlert(t *testing.T) {
	e := newEntAlertEnv(t, "alertsent")
	brokers, work, bin, prefix, names := e.brokers, e.work, e.bin, e.prefix, e.names
	group := e.base + "-aggregate"

	aggAddr := testenv.FreeAddr(t)
	startAgg := func(n int, tick string) *testenv.Process {
		args := []string{"aggregate", "--brokers", strings.Join(brokers, ","), "--topic-prefix", prefix, "--log-level", "info",
			"--state-dir", filepath.Join(work, "state"), "--session-timeout", "6s", "--transaction-timeout", "10s",
			"--group", group, "--instance-id", "a1", "--metrics-addr", aggAddr, "--entitlements", "--entitlements-tick=" + tick}
		p := testenv.StartProcess(t, fmt.Sprintf("aggregate-%d", n), filepath.Join(work, fmt.Sprintf("aggregate-%d.log", n)), bin, args...)
		waitHTTP(t, "http://"+aggAddr+"/readyz", 90*time.Second)
		return p
	}
	agg := startAgg(1, "200ms")

	rulesFile := filepath.Join(work, "alerts.yml")
	if err := os.WriteFile(rulesFile, scaledRules(t, realScale), 0o644); err != nil {
		t.Fatal(err)
	}
	prom := startPrometheus(t, e.promBin, work, rulesFile, aggAddr)
	w := &alertWatch{t: t, prom: prom, fired: map[string]bool{}}

	stopWriting := writeDeduped(t, brokers, names, 2)

	stalled := map[string]string{"instance": aggAddr}
	t.Log("---- 1. ticks every 200ms")
	// Every scaled window (the longest: 20 s) sees the healthy stage.
	for deadline := time.Now().Add(25 * time.Second); time.Now().Before(deadline); time.Sleep(time.Second) {
		if a := w.find("MeterlineEntitlementsStalled", stalled); a != nil {
			t.Fatalf("MeterlineEntitlementsStalled active while the aggregator ticks: %v", a)
		}
	}
	w.waitValue(`count(meterline_aggregate_gated_records < 100)`, 2, 30*time.Second)

	t.Log("---- 2. no ticks")
	agg.Stop(t)
	agg = startAgg(2, "-1s")
	w.waitFiring("MeterlineEntitlementsStalled", stalled)

	t.Log("---- 3. ticks again")
	agg.Stop(t)
	agg = startAgg(3, "200ms")
	w.waitResolved("MeterlineEntitlementsStalled", stalled)
	w.expectRulesHealthy()
	stopWriting()
	agg.Stop(t)
}

// TestRealEntitlementsStalledAlertRun is TestRealEntitlementsStalledAlert
// under `meterline run`, every stage in one process: the aggregator
// without ticks (--aggregate-entitlements-tick=-1s) and the sink, which
// reads usage.deduped too, far behind on it (its ClickHouse is out of
// reach, so it has consumed nothing). The alert fires on the aggregator's
// own lag, which stays low, not on the sink's.
func TestRealEntitlementsStalledAlertRun(t *testing.T) {
	e := newEntAlertEnv(t, "alertsentrun")
	brokers, work, bin, prefix, base := e.brokers, e.work, e.bin, e.prefix, e.base

	addr := testenv.FreeAddr(t)
	p := testenv.StartProcess(t, "run", filepath.Join(work, "run.log"), bin, "run", "--brokers", strings.Join(brokers, ","),
		"--topic-prefix", prefix, "--log-level", "info", "--state-dir", filepath.Join(work, "state"),
		"--session-timeout", "6s", "--transaction-timeout", "10s", "--instance-id", "r1", "--metrics-addr", addr,
		"--dedup-keys-file", testenv.DedupKeysFile(t), "--clickhouse", "127.0.0.1:1",
		"--dedup-group", base+"-dedup", "--aggregate-group", base+"-aggregate", "--sink-group", base+"-sink",
		"--aggregate-entitlements", "--aggregate-entitlements-tick=-1s")
	// Not ready: the sink has not reached ClickHouse. Scrapes answer.
	waitHTTP(t, "http://"+addr+"/healthz", 90*time.Second)

	rulesFile := filepath.Join(work, "alerts.yml")
	if err := os.WriteFile(rulesFile, scaledRules(t, realScale), 0o644); err != nil {
		t.Fatal(err)
	}
	prom := startPrometheus(t, e.promBin, work, rulesFile, addr)
	w := &alertWatch{t: t, prom: prom, fired: map[string]bool{}}
	stopWriting := writeDeduped(t, brokers, e.names, 2)

	// The sink's lag on usage.deduped passes the scaled threshold (5 s)
	// and keeps growing; the aggregator's stays below it.
	w.waitValue(`count(meterline_consumer_lag_seconds{stage="sink", topic=~".*usage[.]deduped.*"} > 10)`, 2, 60*time.Second)
	w.waitFiring("MeterlineEntitlementsStalled", map[string]string{"instance": addr})
	w.waitValue(`count(meterline_consumer_lag_seconds{stage="sink", topic=~".*usage[.]deduped.*"} > 10)`, 2, 10*time.Second)
	w.expectRulesHealthy()
	stopWriting()
	p.Stop(t)
}

// entAlertEnv is what the entitlements alert tests (and
// TestRealRejectionSpikeLowTraffic) share: a real Prometheus, the real
// broker, a log directory, the meterline binary, and topics of their own
// (two partitions each, newEntAlertEnv) named with prefix; base is prefix
// without its dot, for group names.
type entAlertEnv struct {
	promBin, work, bin, prefix, base string
	brokers                          []string
	names                            topics.Names
}

func newEntAlertEnv(t *testing.T, name string) entAlertEnv {
	t.Helper()
	return newAlertEnv(t, name, 2)
}

// newAlertEnv is newEntAlertEnv with topics of partitions partitions.
func newAlertEnv(t *testing.T, name string, partitions int) entAlertEnv {
	t.Helper()
	e := entAlertEnv{promBin: realPrometheus(t, "alert rules")}
	parallelAlertTest(t)
	e.brokers = testenv.RealKafka(t)
	e.work = testenv.LogDir(t, "meterline-"+name+"-test-*")
	e.bin = testenv.Meterline(t)
	e.base = testenv.Name(t, name)
	e.prefix = e.base + "."
	e.names = topics.DefaultNames()
	e.names.Prefix = e.prefix
	deleteTopicsAfter(t, e.brokers, e.prefix)
	runCmd(t, e.bin, filepath.Join(e.work, "topics.log"), "topics", "create", "--brokers", strings.Join(e.brokers, ","),
		"--topic-prefix", e.prefix, "--partitions", strconv.Itoa(partitions), "--replication-factor", "1")
	return e
}

// writeDeduped writes records to the two-partition usage.deduped of names,
// 20 a second, as dedup writes them (keyed and partitioned by customer,
// arriving now), until the returned function is called.
func writeDeduped(t *testing.T, brokers []string, names topics.Names, parts int32) func() {
	t.Helper()
	raw, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(raw.Close)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	stop := func() { cancel(); wg.Wait() }
	t.Cleanup(stop)
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			now := time.Now()
			e := &schemas.DedupedEvent{EventID: fmt.Sprintf("ev-%d", i), CustomerID: fmt.Sprintf("cust-%d", i%8), Meter: "api_calls",
				Quantity: 1, EventTime: now.UnixMilli(), IngestTime: now.UnixMilli(), Source: "api-gateway"}
			v, err := schemas.Encode(e)
			if err != nil {
				t.Error(err)
				return
			}
			key := schemas.CustomerKey(e.CustomerID)
			r := &kgo.Record{Topic: names.DedupedTopic(), Partition: schemas.Partition(key, parts), Key: key, Value: v}
			if err := raw.ProduceSync(ctx, r).FirstErr(); err != nil {
				if ctx.Err() == nil {
					t.Errorf("produce: %v", err)
				}
				return
			}
		}
	}()
	return stop
}
