package stream

import (
	"context"
	"maps"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/internal/testenv"
)

// newClusterSuite is newSuite on the real cluster of
// METERLINE_TEST_KAFKA_CLUSTER: topics replicated on its three brokers
// (min.insync.replicas 2), so that one broker may be paused.
func newClusterSuite(t *testing.T) (*suite, *testenv.Cluster) {
	cluster := testenv.RealCluster(t)
	s := &suite{t: t, brokers: cluster.Brokers, parts: 2,
		input: testenv.Name(t, "in"), output: testenv.Name(t, "out"), changelog: testenv.Name(t, "changelog"),
		group: testenv.Name(t, "group")}
	cl, err := kgo.NewClient(kgo.SeedBrokers(s.brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	s.producer, s.adm = cl, kadm.NewClient(cl)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	keep, isr := "-1", "2"
	topics := []string{s.input, s.output, s.changelog}
	for _, name := range topics {
		resp, err := s.adm.CreateTopic(ctx, s.parts, 3, map[string]*string{"retention.ms": &keep, "min.insync.replicas": &isr}, name)
		if err == nil {
			err = resp.Err
		}
		if err != nil {
			t.Fatalf("create topic %s: %v", name, err)
		}
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = s.adm.DeleteTopics(ctx, topics...)
		_, _ = s.adm.DeleteGroups(ctx, s.group)
	})
	s.sent = make([][]input, s.parts)
	return s, cluster
}

// changelogLeader returns the broker leading changelog partition p.
func (s *suite) changelogLeader(p int32) int32 {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	td, err := s.adm.ListTopics(ctx, s.changelog)
	if err != nil {
		s.t.Fatal(err)
	}
	return td[s.changelog].Partitions[p].Leader
}

// TestRealClusterStandbyFollowsPausedLeader: on a cluster of three
// brokers, the broker leading the changelog partition a standby tails is
// paused (SIGSTOP: its connections stay open, it answers nothing) while
// the partition's owner keeps writing; the leadership moves, and the
// paused broker comes back believing for a moment that it still leads.
// The standby follows the new leader: its copy reaches the changelog's
// end and holds its state, and when the owner leaves, the standby takes
// the partition with a restore of the tail past its checkpoint only, and
// every input is counted once.
func TestRealClusterStandbyFollowsPausedLeader(t *testing.T) {
	s, cluster := newClusterSuite(t)
	a, b, procB, fsB := startWarmPair(s, func(c *Config) {
		c.StandbyReplicas = 1
		c.SessionTimeout, c.RebalanceTimeout = 30*time.Second, 30*time.Second
		c.TransactionTimeout = 20 * time.Second
	})
	var aOwns int32 = -1
	a.rt.EachPartitionStatus(func(p int32, _ bool, _ int64, _, _ string) { aOwns = p })
	s.send(40)
	s.caughtUp()
	leader := s.changelogLeader(aOwns)
	t.Logf("a owns partition %d; its changelog leader is broker %d", aOwns, leader)
	before := s.changelogEnd()
	cluster.Pause(t, leader)
	paused := time.Now()
	for time.Since(paused) < 12*time.Second {
		s.send(4)
		time.Sleep(200 * time.Millisecond)
	}
	cluster.Resume(t, leader)
	now := s.changelogLeader(aOwns)
	t.Logf("broker %d resumed after %s; changelog partition %d now led by %d", leader, time.Since(paused).Round(time.Millisecond), aOwns, now)
	if now == leader {
		t.Fatalf("the leadership of changelog partition %d did not move off paused broker %d", aOwns, leader)
	}
	s.send(40)
	s.caughtUp()
	ends := s.changelogEnd()
	if ends[aOwns] <= before[aOwns] {
		t.Fatalf("changelog partition %d: end %d, not past %d before the pause: nothing was written under the new leader", aOwns, ends[aOwns], before[aOwns])
	}
	caught := time.Now()
	s.waitFor("b's standby copy to reach the changelog's end", func() bool {
		ok := false
		b.rt.EachStandbyStatus(func(p int32, off, lag int64) { ok = ok || p == aOwns && off >= ends[p] })
		return ok
	})
	t.Logf("b's copy reached the changelog's end %d %s after the group caught up", ends[aOwns], time.Since(caught).Round(time.Millisecond))
	if got, want := s.storeState(b.rt.store, aOwns), s.changelogState()[aOwns]; !maps.Equal(got, want) {
		t.Fatalf("b's standby copy of partition %d: %q, want the changelog's %q", aOwns, got, want)
	}
	cp, _, err := b.rt.store.Checkpoint(aOwns)
	if err != nil {
		t.Fatal(err)
	}
	fullBefore := b.metric("meterline_stream_restores_total", "kind", "full")
	a.shutdown()
	s.waitFor("b to own both partitions", func() bool { return b.owned() == 2 })
	if full := b.metric("meterline_stream_restores_total", "kind", "full") - fullBefore; full != 0 {
		t.Fatalf("b restored %v partitions in full on the failover (its checkpoint was %d)", full, cp.Offset)
	}
	procB.mu.Lock()
	info := procB.opened[aOwns]
	procB.mu.Unlock()
	if !info.warm || !info.matches {
		t.Fatalf("Open of the promoted partition: %+v, want the standby's warm state, equal to the restored state", info)
	}
	s.send(20)
	s.caughtUp()
	s.finish(b, fsB)
}
