package deploy

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/meterline/meterline/internal/service"
	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/internal/topics"
)

// realRestoreOORAlertsFired lists the alerts
// TestRealRestoreStuckOutOfRangeAlert fires.
var realRestoreOORAlertsFired = []string{"MeterlineRestoreStuckOutOfRange"}

// TestRealRestoreStuckOutOfRangeAlert runs the shipped alert rules (scaled
// as TestRealAlertsFire's, realScale) in a real Prometheus scraping a real
// `meterline dedup` on an in-process Kafka (kfake):
//
//  1. Healthy: dedup writes its state of a few seconds of events to its
//     changelog, and stops; its state directory is deleted.
//  2. Started again with the fetches of changelog partition 0 answered
//     OFFSET_OUT_OF_RANGE (as when retention deletes what the copy had
//     not read, or a stale leader answers): its restore of partition 0
//     plans again and again, backing off, and
//     MeterlineRestoreStuckOutOfRange fires for partition 0 only, while
//     the status page marks that partition.
//  3. The fetches answered again: the restore gets through at its next
//     plan, the series goes, and the alert resolves.
func TestRealRestoreStuckOutOfRangeAlert(t *testing.T) {
	promBin := realPrometheus(t, "alert rules")
	parallelAlertTest(t)
	work := testenv.LogDir(t, "meterline-alerts-restoreoor-test-*")
	bin := testenv.Meterline(t)
	cluster, brokers := testenv.KFake(t)

	addr, state := testenv.FreeAddr(t), filepath.Join(work, "state")
	startDedup := kfakeDedup(t, bin, work, brokers, addr, state)
	changelog := topics.DefaultNames().DedupChangelogTopic()
	md, err := testenv.Admin(t, brokers).Metadata(context.Background(), changelog)
	if err != nil || md.Topics[changelog].Err != nil {
		t.Fatalf("metadata of %s: %v %v", changelog, err, md.Topics[changelog].Err)
	}
	var outOfRange atomic.Bool
	answered := failChangelogReads(cluster, changelog, md.Topics[changelog].ID, 0, kerr.OffsetOutOfRange, &outOfRange)

	t.Log("---- 1. healthy: dedup writes its changelog")
	dedup := startDedup("1")
	waitHTTP(t, "http://"+addr+"/readyz", 90*time.Second)
	w := watchScaledRules(t, promBin, work, addr)
	p := newProducer(t, brokers, "")
	t.Cleanup(p.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	var wg sync.WaitGroup
	sendLive(ctx, t, &wg, p, 25*time.Millisecond)
	wg.Wait()
	cancel()
	time.Sleep(2 * time.Second) // a commit interval: the last events' keys are in the changelog
	w.expectQuiet("dedup healthy")
	dedup.Stop(t)
	if err := os.RemoveAll(state); err != nil {
		t.Fatal(err)
	}

	t.Log("---- 2. restarted without its state; changelog partition 0's fetches out of range")
	outOfRange.Store(true)
	dedup = startDedup("2")
	stuck := map[string]string{"instance": addr, "stage": "dedup", "partition": "0"}
	w.waitFiring("MeterlineRestoreStuckOutOfRange", stuck)
	if a := w.find("MeterlineRestoreStuckOutOfRange", map[string]string{"partition": "1"}); a != nil {
		t.Errorf("partition 1, whose restore gets through, alerts too: %v", a)
	}
	// A partition restoring for longer than the scaled 3 s fires
	// MeterlineRestoreTooLong too.
	w.expectOnly("a restore whose changelog fetches stay out of range", "MeterlineRestoreStuckOutOfRange", "MeterlineRestoreTooLong")
	if n := restoreReplans(t, addr, 0); n < 6 {
		t.Errorf("the status page shows %d re-plans of partition 0's restore; want at least the rule's 6", n)
	}
	if len(dedup.Lines("the changelog's offset range moved past the restore's position (retention deleted records it had not read, or a stale leader answered); planning again")) == 0 {
		t.Errorf("no \"planning again\" log line, which the runbook names")
	}
	t.Logf("%d fetches of changelog partition 0 answered out of range", answered.Load())

	t.Log("---- 3. the fetches answered again: the restore gets through")
	outOfRange.Store(false)
	waitHTTP(t, "http://"+addr+"/readyz", 60*time.Second)
	w.waitResolved("MeterlineRestoreStuckOutOfRange", stuck)
	if n := restoreReplans(t, addr, 0); n != 0 {
		t.Errorf("the status page still shows %d re-plans of partition 0, restored", n)
	}
	w.expectRulesHealthy()
	w.expectFired(realRestoreOORAlertsFired)
	dedup.Stop(t)
}

// kfakeDedup creates the topics, of 2 partitions, on brokers (kfake) and
// returns a function that starts `meterline dedup` as instance d1 on them,
// with its log in work/dedup<n>.log, its HTTP server at addr, its state in
// state and the flags extra.
func kfakeDedup(t *testing.T, bin, work string, brokers []string, addr, state string, extra ...string) func(n string) *testenv.Process {
	runCmd(t, bin, filepath.Join(work, "topics.log"), "topics", "create", "--brokers", strings.Join(brokers, ","),
		"--partitions", "2", "--replication-factor", "1")
	keys := testenv.DedupKeysFile(t)
	return func(n string) *testenv.Process {
		args := append([]string{"dedup",
			"--brokers", strings.Join(brokers, ","), "--log-level", "info",
			"--state-dir", state, "--session-timeout", "6s", "--transaction-timeout", "10s",
			"--instance-id", "d1", "--metrics-addr", addr,
			"--tick-interval", "1s", "--dedup-keys-file", keys, "--sources", "api-gateway"}, extra...)
		return testenv.StartProcess(t, "dedup"+n, filepath.Join(work, "dedup"+n+".log"), bin, args...)
	}
}

// dedupStatus returns the dedup stage of the status at addr
// (/status.json).
func dedupStatus(t *testing.T, addr string) service.StageStatus {
	t.Helper()
	st := processStatus(t, addr)
	for _, sg := range st.Stages {
		if sg.Stage == "dedup" {
			return sg
		}
	}
	t.Fatalf("status.json lists no dedup stage: %+v", st)
	return service.StageStatus{}
}

// processStatus returns the status at addr (/status.json).
func processStatus(t *testing.T, addr string) service.Status {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/status.json")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var st service.Status
	if err := json.Unmarshal(b, &st); err != nil {
		t.Fatalf("status.json: %v\n%s", err, b)
	}
	return st
}

// restoreReplans returns the re-plans of partition p's restore that the
// dedup status at addr (/status.json) shows.
func restoreReplans(t *testing.T, addr string, p int32) int {
	t.Helper()
	for _, ps := range dedupStatus(t, addr).Partitions {
		if ps.Partition == p {
			return ps.RestoreReplans
		}
	}
	t.Fatalf("status.json lists no dedup partition %d", p)
	return 0
}
