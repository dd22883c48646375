package clustertest

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TestRealClusterNotEnoughReplicas takes the pipeline's writes below
// min.insync.replicas under load (docs/operations.md, Replication: "two
// down stop every write (NOT_ENOUGH_REPLICAS, retried) until one
// returns"). On the local cluster two brokers down also take the
// controller quorum, so writes there wait without an answer; the brokers
// answer NOT_ENOUGH_REPLICAS when a partition's ISR is below its
// min.insync.replicas, which one broker down and min.insync.replicas 3 on
// every topic of the pipeline gives, with the quorum up. For longer than
// the stages' transaction and session timeouts every write is refused;
// then min.insync.replicas goes back to 2 and the broker returns. No stage
// instance may exit by itself, each must say in its log why it cannot
// commit, and every output reconciles exactly with the generator's truth.
func TestRealClusterNotEnoughReplicas(t *testing.T) {
	s := newSuite(t, 50*time.Second)
	s.startAll()
	g := s.generate(100)
	s.cluster.WaitHealthy(t, healthyTimeout)
	s.waitReady(time.Minute)
	s.sleep(5 * time.Second)

	cl, err := kgo.NewClient(kgo.SeedBrokers(s.brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	b := s.cluster.MostLeader(t, s.topicNames()...)
	since := time.Now()
	s.note("kill -9 broker %d", b)
	s.cluster.Kill(t, b)
	waitOutOfISR(t, adm, b, since, s.topicNames()...)
	setMinISR(t, adm, "3", s.topicNames()...)
	held := time.Now()
	s.note("min.insync.replicas 3 on every topic with broker %d down: every write is refused NOT_ENOUGH_REPLICAS", b)

	// Longer than the transaction timeout (10 s) twice over and the
	// sessions (6 s): a stage rides it out and says why it cannot commit.
	// Dedup writes its outputs all along: each instance's /readyz says it
	// cannot write, and why (docs/operations.md, Replication).
	c := http.Client{Timeout: 2 * time.Second}
	notReady, refused := map[string]string{}, map[string]bool{}
	for end := time.Now().Add(30 * time.Second); time.Now().Before(end); s.sleep(2 * time.Second) {
		for _, st := range stages {
			for _, id := range s.running(st) {
				why := ready(&c, s, st, id)
				if why != "" {
					notReady[st+"/"+id] = why
				}
				if strings.Contains(why, "cannot write") && strings.Contains(why, "NOT_ENOUGH_REPLICAS") {
					refused[st+"/"+id] = true
				}
			}
		}
	}
	for _, id := range s.running("dedup") {
		if !refused["dedup/"+id] {
			t.Errorf("dedup %s: /readyz never said it cannot write with NOT_ENOUGH_REPLICAS while every write was refused for 30 s; last not ready: %q", id, notReady["dedup/"+id])
		}
	}
	setMinISR(t, adm, "2", s.topicNames()...)
	released := time.Now()
	s.note("min.insync.replicas 2 again after %s; /readyz answered not ready meanwhile: %v", time.Since(held).Round(time.Second), notReady)
	// Enough in-sync replicas again, with broker b still down: the next
	// transaction commits and every instance is ready.
	s.waitReady(45 * time.Second)
	s.note("every stage instance ready %s after min.insync.replicas 2", time.Since(released).Round(100*time.Millisecond))
	s.cluster.Start(t, b)
	s.cluster.WaitHealthy(t, healthyTimeout)

	// Dedup's log names the cause: an SRE reads NOT_ENOUGH_REPLICAS and
	// the partitions, not only that transactions abort. No stage rebuilds
	// its session for a fence or its producer's state meanwhile: those
	// say another process took its transactional ID. (The aggregator has
	// records to write only while dedup's last outputs reach it, and the
	// sink writes only offsets here, to __consumer_offsets.)
	named := false
	for _, st := range stages {
		for _, id := range []string{"i1", "i2"} {
			if st == "dedup" && len(s.proc(st, id).Lines(notEnoughMsg)) > 0 {
				named = true
			}
			for _, l := range s.proc(st, id).LogLines() {
				r, _ := l.Fields["reason"].(string)
				if l.Msg == rebuildMsg && l.TS.After(held) && l.TS.Before(released) && (r == "fenced" || r == "producer_state") {
					t.Errorf("%s %s rebuilt its session for %s while its writes were refused (a fence says another process took its transactional ID): %v", st, id, r, l.Fields["error"])
				}
			}
		}
	}
	if !named {
		t.Errorf("dedup: no %q line while every write was refused for 30 s", notEnoughMsg)
	}
	if wait := time.Until(time.UnixMilli(s.cutoff).Add(10 * time.Second)); wait > 0 {
		s.note("load goes on %s, past P's cutoff", wait.Round(time.Second))
		s.sleep(wait)
	}
	s.finish(g)
	s.noteWarnings()
}

const (
	notEnoughMsg = "the brokers refuse the stage's writes: partitions it writes to have fewer in-sync replicas than their min.insync.replicas (NOT_ENOUGH_REPLICAS); nothing commits until enough replicas are back in sync"
	rebuildMsg   = "rebuilding the Kafka session with the same transactional ID (which aborts or completes the open transaction), then restoring"
)

// setMinISR sets min.insync.replicas on the topics.
func setMinISR(t *testing.T, adm *kadm.Client, v string, topicNames ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rs, err := adm.AlterTopicConfigs(ctx, []kadm.AlterConfig{{Name: "min.insync.replicas", Value: kadm.StringPtr(v)}}, topicNames...)
	if err == nil {
		for _, r := range rs {
			if r.Err != nil {
				err = r.Err
				break
			}
		}
	}
	if err != nil {
		t.Fatalf("setting min.insync.replicas %s: %v", v, err)
	}
}
