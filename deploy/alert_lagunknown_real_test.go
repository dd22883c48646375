package deploy

import (
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/meterline/meterline/internal/testenv"
)

// realLagUnknownAlertsFired lists the alerts TestRealConsumerLagUnknownAlert
// fires.
var realLagUnknownAlertsFired = []string{"MeterlineConsumerLagUnknown"}

// refuseOffsetFetches makes cluster answer every OffsetFetch with
// GROUP_AUTHORIZATION_FAILED while refuse is set, as a broker does once
// the principal's Describe ACL on the group is gone, and counts them. A
// stage fetches its group's offsets when partitions are assigned to it;
// its lag collector, at every computation.
func refuseOffsetFetches(cluster *kfake.Cluster, refuse *atomic.Bool) *atomic.Int64 {
	return answerWhile(cluster, kmsg.OffsetFetch.Int16(), refuse, func(kreq kmsg.Request) kmsg.Response {
		req := kreq.(*kmsg.OffsetFetchRequest)
		resp := req.ResponseKind().(*kmsg.OffsetFetchResponse)
		resp.ErrorCode = kerr.GroupAuthorizationFailed.Code
		for _, g := range req.Groups {
			rg := kmsg.NewOffsetFetchResponseGroup()
			rg.Group, rg.ErrorCode = g.Group, kerr.GroupAuthorizationFailed.Code
			resp.Groups = append(resp.Groups, rg)
		}
		return resp
	})
}

// TestRealConsumerLagUnknownAlert runs the shipped alert rules (scaled as
// TestRealAlertsFire's, realScale) in a real Prometheus scraping a real
// `meterline dedup` on an in-process Kafka (kfake):
//
//  1. Healthy: dedup exports its lag and meterline_consumer_lag_computed
//     1; no alert.
//  2. Its group's offsets refused (its Describe ACL on the group gone):
//     the lag series are gone, the gauge is 0, the status page's
//     lag_error names the ACL, and MeterlineConsumerLagUnknown fires for
//     the dedup group, and nothing else does.
//  3. The offsets answered again: the lag series are back and the alert
//     resolves.
func TestRealConsumerLagUnknownAlert(t *testing.T) {
	promBin := realPrometheus(t, "alert rules")
	parallelAlertTest(t)
	work := testenv.LogDir(t, "meterline-alerts-lagunknown-test-*")
	bin := testenv.Meterline(t)
	cluster, brokers := testenv.KFake(t)
	addr := testenv.FreeAddr(t)
	dedup := kfakeDedup(t, bin, work, brokers, addr, filepath.Join(work, "state"))("")
	var refuse atomic.Bool
	refused := refuseOffsetFetches(cluster, &refuse)

	t.Log("---- 1. healthy: dedup computes its lag")
	waitHTTP(t, "http://"+addr+"/readyz", 90*time.Second)
	w := watchScaledRules(t, promBin, work, addr)
	w.waitValue(`min(meterline_consumer_lag_computed{stage="dedup"})`, 1, alertWait)
	w.waitValue(`count(meterline_consumer_lag_records{stage="dedup"}) > bool 0`, 1, alertWait)
	w.expectQuiet("dedup computes its lag")

	t.Log("---- 2. the group's offsets refused (no Describe on the group)")
	refuse.Store(true)
	unknown := map[string]string{"stage": "dedup"}
	w.waitFiring("MeterlineConsumerLagUnknown", unknown)
	w.expectOnly("the lag not computed", "MeterlineConsumerLagUnknown")
	w.waitValue(`count(meterline_consumer_lag_records{stage="dedup"}) or vector(0)`, 0, alertWait)
	if s := processStatus(t, addr).LagError; !strings.Contains(s, "Describe on group") {
		t.Errorf("the status page's lag_error is %q, want it to name Describe on the group", s)
	}
	t.Logf("%d offset fetches refused", refused.Load())

	t.Log("---- 3. the offsets answered again")
	refuse.Store(false)
	w.waitResolved("MeterlineConsumerLagUnknown", unknown)
	w.waitValue(`count(meterline_consumer_lag_records{stage="dedup"}) > bool 0`, 1, alertWait)
	w.expectOnly("the lag computed again")
	w.expectRulesHealthy()
	w.expectFired(realLagUnknownAlertsFired)
	dedup.Stop(t)
}
