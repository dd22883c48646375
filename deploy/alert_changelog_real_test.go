package deploy

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/internal/topics"
)

// realChangelogAlertsFired lists the alerts TestRealChangelogUnsafeAlert
// fires.
var realChangelogAlertsFired = []string{"MeterlineChangelogUnsafe"}

// TestRealChangelogUnsafeAlert runs the shipped alert rules (scaled as
// TestRealAlertsFire's, realScale) in a real Prometheus scraping a real
// `meterline dedup` on an in-process Kafka (kfake), which reads its
// changelog's cleanup policy every second (--changelog-check-interval):
//
//  1. Healthy: the changelog is compacted; no alert.
//  2. Its cleanup.policy set to delete with a retention of an hour (less
//     than dedup's W + S + B) while dedup runs: MeterlineChangelogUnsafe
//     fires, dedup logs one error line, and the status page says so.
//  3. Set back to compact: the alert resolves and the status page clears.
func TestRealChangelogUnsafeAlert(t *testing.T) {
	promBin := realPrometheus(t, "alert rules")
	parallelAlertTest(t)
	work := testenv.LogDir(t, "meterline-alerts-changelog-test-*")
	bin := testenv.Meterline(t)
	_, brokers := testenv.KFake(t)
	addr := testenv.FreeAddr(t)
	dedup := kfakeDedup(t, bin, work, brokers, addr, filepath.Join(work, "state"), "--changelog-check-interval", "1s")("")
	changelog := topics.DefaultNames().DedupChangelogTopic()

	t.Log("---- 1. healthy: the changelog is compacted")
	waitHTTP(t, "http://"+addr+"/readyz", 90*time.Second)
	w := watchScaledRules(t, promBin, work, addr)
	w.expectQuiet("dedup healthy")

	t.Log("---- 2. the changelog set to delete after an hour")
	testenv.AlterTopicConfigs(t, brokers, changelog, map[string]string{"cleanup.policy": "delete", "retention.ms": "3600000"})
	unsafe := map[string]string{"instance": addr, "stage": "dedup", "topic": changelog}
	w.waitFiring("MeterlineChangelogUnsafe", unsafe)
	w.expectOnly("a changelog that deletes records", "MeterlineChangelogUnsafe")
	if n := len(dedup.Lines("the changelog's cleanup policy now deletes state records a restore must read: the next restore of a partition is refused, and the stage with it (set it back)")); n != 1 {
		t.Errorf("%d error lines about the changelog, want 1 (the runbook names it)", n)
	}
	if s := dedupStatus(t, addr).ChangelogUnsafe; !strings.Contains(s, "cleanup.policy=delete") {
		t.Errorf("the status page says %q of the changelog, want its cleanup.policy", s)
	}

	t.Log("---- 3. set back to compact")
	testenv.AlterTopicConfigs(t, brokers, changelog, map[string]string{"cleanup.policy": "compact"})
	w.waitResolved("MeterlineChangelogUnsafe", unsafe)
	if s := dedupStatus(t, addr).ChangelogUnsafe; s != "" {
		t.Errorf("the status page still says %q of the changelog, put back", s)
	}
	w.expectRulesHealthy()
	w.expectFired(realChangelogAlertsFired)
	dedup.Stop(t)
}
