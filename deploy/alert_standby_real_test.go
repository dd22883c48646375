package deploy

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/internal/topics"
	"github.com/meterline/meterline/producer"
)

// realStandbyAlertsFired lists the alerts TestRealStandbyFallingBehindAlert
// fires.
var realStandbyAlertsFired = []string{"MeterlineStandbyFallingBehind"}

// TestRealStandbyFallingBehindAlert runs the shipped alert rules (scaled
// as TestRealAlertsFire's, realScale) in a real Prometheus scraping two
// real `meterline dedup --standby-replicas 1` on the real broker, each
// the standby of the other's partition (docs/operations.md, Standby
// replicas), with events arriving on both partitions all test long:
//
//  1. Healthy: both standby copies keep up; no alert is pending or firing
//     for longer than the scaled window.
//  2. A transaction left open on changelog partition 0 (a producer that
//     began one and went away): its standby reads up to the last stable
//     offset and waits there while the owner keeps writing, so its lag
//     grows, and MeterlineStandbyFallingBehind fires for partition 0 only.
//  3. The transaction aborted: the copy catches up and the alert
//     resolves.
func TestRealStandbyFallingBehindAlert(t *testing.T) {
	promBin := realPrometheus(t, "alert rules")
	parallelAlertTest(t)
	brokers := testenv.RealKafka(t)
	work := testenv.LogDir(t, "meterline-alerts-standby-test-*")
	bin := testenv.Meterline(t)

	prefix := testenv.Name(t, "alertsstandby") + "."
	names := topics.DefaultNames()
	names.Prefix = prefix
	deleteTopicsAfter(t, brokers, prefix)
	runCmd(t, bin, filepath.Join(work, "topics.log"), "topics", "create", "--brokers", strings.Join(brokers, ","),
		"--topic-prefix", prefix, "--partitions", "2", "--replication-factor", "1")

	addrs, procs := startStandbyDedups(t, bin, work, brokers, "--topic-prefix", prefix, "--group", strings.TrimSuffix(prefix, ".")+"-dedup")
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	p := newProducer(t, brokers, prefix)
	t.Cleanup(p.Close)
	// About 20 events a second on each partition: each writes its key to
	// the changelog.
	sendLive(ctx, t, &wg, p, 25*time.Millisecond)
	w := watchScaledRules(t, promBin, work, addrs...)
	w.expectStandbysHealthy(15 * time.Second) // longer than the scaled window and for

	t.Log("---- 2. a transaction left open on changelog partition 0")
	open := openTransaction(ctx, t, brokers, prefix+"gone-producer", 2*time.Minute, names.DedupChangelogTopic(), 0)
	behind := map[string]string{"stage": "dedup", "partition": "0"}
	w.waitFiring("MeterlineStandbyFallingBehind", behind)
	if a := w.find("MeterlineStandbyFallingBehind", map[string]string{"partition": "1"}); a != nil {
		t.Errorf("the copy of partition 1, which keeps up, is falling behind: %v", a)
	}
	w.expectOnly("a standby held by an open transaction", "MeterlineStandbyFallingBehind")

	t.Log("---- 3. the transaction aborted: the copy catches up")
	actx, acancel := context.WithTimeout(ctx, 30*time.Second)
	if err := open.EndTransaction(actx, kgo.TryAbort); err != nil {
		t.Fatal(err)
	}
	acancel()
	w.waitResolved("MeterlineStandbyFallingBehind", behind)
	w.expectRulesHealthy()
	w.expectFired(realStandbyAlertsFired)
	cancel()
	wg.Wait()
	for _, pr := range procs {
		pr.Stop(t)
	}
}

// startStandbyDedups starts two real `meterline dedup --standby-replicas
// 1` on brokers, with args added to their flags, each of them the standby
// of the other's partition once the group settles, and returns their
// metrics addresses and processes once both are ready.
func startStandbyDedups(t *testing.T, bin, work string, brokers []string, args ...string) ([]string, []*testenv.Process) {
	t.Helper()
	keys := testenv.DedupKeysFile(t)
	addrs := []string{testenv.FreeAddr(t), testenv.FreeAddr(t)}
	var procs []*testenv.Process
	for i, addr := range addrs {
		id := fmt.Sprintf("d%d", i+1)
		procs = append(procs, testenv.StartProcess(t, id, filepath.Join(work, id+".log"), bin, append([]string{"dedup",
			"--brokers", strings.Join(brokers, ","), "--log-level", "info",
			"--state-dir", filepath.Join(work, "state-"+id), "--session-timeout", "6s", "--transaction-timeout", "10s",
			"--instance-id", id, "--metrics-addr", addr,
			"--standby-replicas", "1", "--tick-interval", "1s", "--dedup-keys-file", keys, "--sources", "api-gateway"}, args...)...))
	}
	for _, addr := range addrs {
		waitHTTP(t, "http://"+addr+"/readyz", 90*time.Second)
	}
	return addrs, procs
}

// sendLive sends an event of a clean source through p every d until ctx
// ends, in a goroutine wg waits for: live-0, live-1, ... of 8 customers,
// so on every partition of 2.
func sendLive(ctx context.Context, t *testing.T, wg *sync.WaitGroup, p *producer.Producer, d time.Duration) {
	wg.Add(1)
	go func() {
		defer wg.Done()
		sendEvery(ctx, t, p, d, func(i int) producer.Event {
			return producer.Event{EventID: fmt.Sprintf("live-%d", i), CustomerID: fmt.Sprintf("cust-%d", i%8), Meter: "api_calls",
				Quantity: 1, EventTime: time.Now().UTC(), Source: "api-gateway"}
		})
	}()
}

// expectStandbysHealthy waits until both dedups of startStandbyDedups
// export a standby copy's lag (the second takes its partition once its
// copy caught up), then fails the test if any alert is active during
// quiet.
func (w *alertWatch) expectStandbysHealthy(quiet time.Duration) {
	w.t.Helper()
	w.t.Log("---- 1. healthy: each instance the standby of the other's partition")
	w.waitValue(`count(meterline_stream_standby_lag_records{stage="dedup"})`, 2, 90*time.Second)
	for healthy := time.Now(); time.Since(healthy) < quiet; time.Sleep(time.Second) {
		if as := w.active(); len(as) > 0 {
			w.t.Fatalf("alerts on a healthy pipeline with standbys: %v", as)
		}
	}
}
