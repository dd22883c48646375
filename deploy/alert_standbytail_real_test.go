package deploy

import (
	"context"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/internal/topics"
)

// realStandbyTailAlertsFired lists the alerts
// TestRealStandbyTailRestartsAlert fires.
var realStandbyTailAlertsFired = []string{"MeterlineStandbyTailRestarts"}

// refuseChangelogReads makes cluster answer every fetch of partition p of
// topic (its topic ID id) with TOPIC_AUTHORIZATION_FAILED while refuse is
// set, as a broker does once the principal's Read ACL on the changelog is
// gone, and counts them. Only a standby tail, or a restore, fetches a
// changelog.
func refuseChangelogReads(cluster *kfake.Cluster, topic string, id [16]byte, p int32, refuse *atomic.Bool) *atomic.Int64 {
	return failChangelogReads(cluster, topic, id, p, kerr.TopicAuthorizationFailed, refuse)
}

// failChangelogReads makes cluster answer every fetch of partition p of
// topic (its topic ID id) with the error code of e while fail is set, and
// counts them.
func failChangelogReads(cluster *kfake.Cluster, topic string, id [16]byte, p int32, e *kerr.Error, fail *atomic.Bool) *atomic.Int64 {
	return answerWhile(cluster, kmsg.Fetch.Int16(), fail, func(kreq kmsg.Request) kmsg.Response {
		req := kreq.(*kmsg.FetchRequest)
		for _, rt := range req.Topics {
			if rt.Topic != topic && rt.TopicID != id {
				continue
			}
			for _, rp := range rt.Partitions {
				if rp.Partition != p {
					continue
				}
				resp := req.ResponseKind().(*kmsg.FetchResponse)
				st := kmsg.NewFetchResponseTopic()
				st.Topic, st.TopicID = topic, id
				sp := kmsg.NewFetchResponseTopicPartition()
				sp.Partition = p
				sp.ErrorCode = e.Code
				sp.HighWatermark, sp.LastStableOffset, sp.LogStartOffset = -1, -1, -1
				st.Partitions = append(st.Partitions, sp)
				resp.Topics = append(resp.Topics, st)
				return resp
			}
		}
		return nil
	})
}

// answerWhile makes cluster answer requests of key with answer's response
// while on is set, and counts them; a nil response, or on unset, leaves
// the request to kfake.
func answerWhile(cluster *kfake.Cluster, key int16, on *atomic.Bool, answer func(kmsg.Request) kmsg.Response) *atomic.Int64 {
	var n atomic.Int64
	cluster.ControlKey(key, func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		cluster.KeepControl()
		if !on.Load() {
			return nil, nil, false
		}
		resp := answer(kreq)
		if resp == nil {
			return nil, nil, false
		}
		n.Add(1)
		return resp, nil, true
	})
	return &n
}

// TestRealStandbyTailRestartsAlert runs the shipped alert rules (scaled
// as TestRealAlertsFire's, realScale) in a real Prometheus scraping two
// real `meterline dedup --standby-replicas 1` on an in-process Kafka
// (kfake), each the standby of the other's partition (docs/operations.md,
// Standby replicas), with events arriving on both partitions all test
// long:
//
//  1. Healthy: both standby copies keep up; no alert is pending or firing
//     for longer than the scaled window.
//  2. The reads of changelog partition 0 refused (its Read ACL gone): its
//     standby tail stops, and starts again after a wait, again and again,
//     and MeterlineStandbyTailRestarts fires for that instance only.
//  3. The reads allowed again: the tail copies again, its lag is exported
//     again, and the alert resolves.
func TestRealStandbyTailRestartsAlert(t *testing.T) {
	promBin := realPrometheus(t, "alert rules")
	parallelAlertTest(t)
	work := testenv.LogDir(t, "meterline-alerts-standbytail-test-*")
	bin := testenv.Meterline(t)
	cluster, brokers := testenv.KFake(t)

	names := topics.DefaultNames()
	runCmd(t, bin, filepath.Join(work, "topics.log"), "topics", "create", "--brokers", strings.Join(brokers, ","),
		"--partitions", "2", "--replication-factor", "1")
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	changelog := names.DedupChangelogTopic()
	md, err := testenv.Admin(t, brokers).Metadata(ctx, changelog)
	if err != nil || md.Topics[changelog].Err != nil {
		t.Fatalf("metadata of %s: %v %v", changelog, err, md.Topics[changelog].Err)
	}
	var refuse atomic.Bool
	refused := refuseChangelogReads(cluster, changelog, md.Topics[changelog].ID, 0, &refuse)

	addrs, procs := startStandbyDedups(t, bin, work, brokers)
	p := newProducer(t, brokers, "")
	t.Cleanup(p.Close)
	// About 20 events a second on each partition: each writes its key to
	// the changelog, so a tail's fetch session names its partition again
	// and again.
	sendLive(ctx, t, &wg, p, 25*time.Millisecond)
	w := watchScaledRules(t, promBin, work, addrs...)
	w.expectStandbysHealthy(25 * time.Second) // longer than the scaled window and for

	t.Log("---- 2. the reads of changelog partition 0 refused")
	refuse.Store(true)
	w.waitFiring("MeterlineStandbyTailRestarts", map[string]string{"stage": "dedup"})
	a := w.find("MeterlineStandbyTailRestarts", map[string]string{"stage": "dedup"})
	if a == nil {
		t.Fatal("MeterlineStandbyTailRestarts resolved as soon as it fired")
	}
	failing := a.Labels["instance"]
	for _, addr := range addrs {
		if addr != failing {
			if other := w.find("MeterlineStandbyTailRestarts", map[string]string{"instance": addr}); other != nil {
				t.Errorf("the instance whose standby copy keeps up alerts too: %v", other)
			}
		}
	}
	w.expectOnly("a standby tail whose reads are refused", "MeterlineStandbyTailRestarts")
	t.Logf("%d fetches of changelog partition 0 refused", refused.Load())

	t.Log("---- 3. the reads allowed again: the tail copies again")
	refuse.Store(false)
	w.waitValue(`count(meterline_stream_standby_lag_records{stage="dedup"})`, 2, alertWait)
	w.waitResolved("MeterlineStandbyTailRestarts", map[string]string{"stage": "dedup"})
	w.expectOnly("a standby tail copying again")
	w.expectRulesHealthy()
	w.expectFired(realStandbyTailAlertsFired)
	cancel()
	wg.Wait()
	for _, pr := range procs {
		pr.Stop(t)
	}
}
