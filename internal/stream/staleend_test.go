package stream

import (
	"context"
	"errors"
	"math"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"

	"github.com/meterline/meterline/internal/clock"
	"github.com/meterline/meterline/internal/testenv"
)

// staleLeader makes kfake answer listings of w's changelog end (and last
// stable offset) as a broker does that was paused, lost the leadership of
// the changelog's partition meanwhile and has just been resumed, still
// believing it leads: a listing without a leader epoch (-1) gets its stale
// end, always; the first fenced listings (with the partition's current
// epoch, which it is behind) get UNKNOWN_LEADER_EPOCH, or, with
// staleFenced, its stale end too (it is the broker the lister's metadata
// came from). It returns the number of fenced listings answered so.
func staleLeader(w *kvWorld, staleEnd int64, fenced int64, staleFenced bool) *atomic.Int64 {
	var n atomic.Int64
	w.cluster.ControlKey(kmsg.ListOffsets.Int16(), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		w.cluster.KeepControl()
		req := kreq.(*kmsg.ListOffsetsRequest)
		if len(req.Topics) != 1 || req.Topics[0].Topic != w.changelog {
			return nil, nil, false
		}
		resp := req.ResponseKind().(*kmsg.ListOffsetsResponse)
		rt := kmsg.NewListOffsetsResponseTopic()
		rt.Topic = w.changelog
		for _, rp := range req.Topics[0].Partitions {
			if rp.Timestamp != -1 {
				return nil, nil, false
			}
			sp := kmsg.NewListOffsetsResponseTopicPartition()
			sp.Partition = rp.Partition
			switch {
			case rp.CurrentLeaderEpoch < 0:
				sp.Offset = staleEnd
			case n.Add(1) > fenced:
				return nil, nil, false
			case staleFenced:
				sp.Offset, sp.LeaderEpoch = staleEnd, rp.CurrentLeaderEpoch
			default:
				sp.ErrorCode = kerr.UnknownLeaderEpoch.Code
			}
			rt.Partitions = append(rt.Partitions, sp)
		}
		resp.Topics = append(resp.Topics, rt)
		return resp, nil, true
	})
	return &n
}

// commitToChangelog writes key=value to w's changelog in a committed
// transaction that carries no input offset: what a Worker's chunk or a
// punctuation with an effect writes.
func commitToChangelog(t *testing.T, w *kvWorld, key, value string) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(w.brokers...), kgo.DefaultProduceTopic(w.changelog),
		kgo.TransactionalID(testenv.Name(t, "work")))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx := context.Background()
	if err := cl.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	if err := cl.ProduceSync(ctx, &kgo.Record{Key: []byte(key), Value: []byte(value)}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	if err := cl.EndTransaction(ctx, kgo.TryCommit); err != nil {
		t.Fatal(err)
	}
}

// ranOnce returns a kvWorld whose instance "a" has processed a=1 on the
// returned clock and state, then stopped.
func ranOnce(t *testing.T) (*kvWorld, *skewClock, vfs.FS) {
	t.Helper()
	w := newKVWorld(t, nil)
	clk := &skewClock{}
	fsA := vfs.NewMem()
	w.send("a", "1")
	if _, err := w.run("a", fsA, clk); err != nil {
		t.Fatal(err)
	}
	return w, clk, fsA
}

// TestRestoreReplaysPastStaleChangelogEnd: a restore planned while the
// changelog's former leader, paused and just resumed, answers listings
// with its stale end reads the changelog to its true end. The state's
// checkpoint is at or below that stale end and the records past it are a
// transaction without input (a Worker's chunk, a punctuation), so nothing
// else notices: the input offsets in the state agree with the group's.
// A restore that took the stale end stopped there and ran on without
// them.
func TestRestoreReplaysPastStaleChangelogEnd(t *testing.T) {
	t.Parallel()
	w, clk, fsA := ranOnce(t)
	stale := w.changelogEnd()
	commitToChangelog(t, w, "z", "2")
	w.send("b", "1")

	fenced := staleLeader(w, stale, 2, false)
	if _, err := w.run("a", fsA, clk); err != nil {
		t.Fatalf("restart on a stale changelog end: %v", err)
	}
	if got := w.state(fsA); got["z"] != "2" || got["a"] != "1" || got["b"] != "1" {
		t.Errorf("state after the restore: %v; want a=1, b=1 and z=2 (z lies past the stale end %d)", got, stale)
	}
	if fenced.Load() < 2 {
		t.Errorf("%d fenced listings of the changelog; want the restore's to carry the leader epoch", fenced.Load())
	}
}

// TestRestoreIgnoresStaleEndBelowCheckpoint: a restore planned while the
// changelog's former leader answers with a stale end below the state's
// checkpoint does not stop the stage as if the changelog had been
// truncated (on the three-broker cluster, after a broker was paused and
// resumed: "checkpoint 175 beyond changelog end 129").
func TestRestoreIgnoresStaleEndBelowCheckpoint(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name        string
		staleFenced bool // the stale broker also answers fenced listings (its epoch was the lister's)
	}{{"fenced listing refused", false}, {"fenced listing stale too", true}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			w, clk, fsA := ranOnce(t)
			stale := w.changelogEnd()
			w.send("b", "1")
			if _, err := w.run("a", fsA, clk); err != nil {
				t.Fatal(err)
			}
			w.send("c", "1")
			staleLeader(w, stale, 3, c.staleFenced)
			if _, err := w.run("a", fsA, clk); err != nil {
				t.Fatalf("restart on a stale changelog end below the checkpoint: %v", err)
			}
			if got := w.state(fsA); got["a"] != "1" || got["b"] != "1" || got["c"] != "1" {
				t.Errorf("state: %v; want a=1, b=1, c=1", got)
			}
		})
	}
}

// TestRestoreOnTruncatedChangelogStops: a checkpoint beyond an end that
// stays there (the changelog lost its tail, every broker answering so)
// still stops the stage, once the end was listed again for the truncation
// wait. (A changelog deleted and created again is refused before, by its
// topic ID: TestRestoreRefusesRecreatedChangelog.)
func TestRestoreOnTruncatedChangelogStops(t *testing.T) {
	t.Parallel()
	w, clk, fsA := ranOnce(t)
	staleLeader(w, 0, math.MaxInt64, true)
	w.send("b", "1")
	const wait = 2 * time.Second
	start := time.Now()
	err := w.runWith("a", fsA, clk, prometheus.NewRegistry(), func(rt *Runtime) { rt.truncationWait = wait })
	if err == nil || !strings.Contains(err.Error(), "beyond changelog end 0") || !strings.Contains(err.Error(), "the changelog was recreated or truncated") {
		t.Fatalf("Run on a recreated changelog: %v; want the truncation error", err)
	}
	if took := time.Since(start); took < wait {
		t.Errorf("stopped after %s; want the end listed again for %s first", took, wait)
	}
}

// TestCurrentLeaderFromReplicas: a partition's current leader is the one
// named with the highest epoch by any broker asked, whatever the order of
// their answers (a resumed broker, behind, names itself with its old
// epoch); a partition with no leader yet is an error only until a broker
// names one; an authorization failure is a *kadm.AuthError.
func TestCurrentLeaderFromReplicas(t *testing.T) {
	const topic = "cl"
	meta := func(topicErr *kerr.Error, parts ...kmsg.MetadataResponseTopicPartition) *kmsg.MetadataResponse {
		resp := kmsg.NewPtrMetadataResponse()
		rt := kmsg.NewMetadataResponseTopic()
		rt.Topic = kmsg.StringPtr(topic)
		if topicErr != nil {
			rt.ErrorCode = topicErr.Code
		}
		rt.Partitions = parts
		resp.Topics = append(resp.Topics, rt)
		return resp
	}
	part := func(p, leader, epoch int32, err *kerr.Error) kmsg.MetadataResponseTopicPartition {
		pt := kmsg.NewMetadataResponseTopicPartition()
		pt.Partition, pt.Leader, pt.LeaderEpoch = p, leader, epoch
		if err != nil {
			pt.ErrorCode = err.Code
		}
		return pt
	}
	want := map[int32]bool{0: true, 1: true}
	stale := meta(nil, part(0, 1, 4, nil), part(1, -1, 7, kerr.LeaderNotAvailable))
	fresh := meta(nil, part(0, 2, 5, nil), part(1, 3, 8, nil), part(2, 3, 1, nil))
	for name, order := range map[string][]*kmsg.MetadataResponse{"stale first": {stale, fresh}, "fresh first": {fresh, stale}} {
		leaders := map[int32]partitionLeader{}
		for _, m := range order {
			if found, err := mergeLeaders(leaders, m, topic, want); !found || err != nil {
				t.Fatalf("%s: found %v, err %v", name, found, err)
			}
		}
		if l := leaders[0]; l.leader != 2 || l.epoch != 5 || l.err != nil {
			t.Errorf("%s: partition 0: %+v; want leader 2 at epoch 5", name, l)
		}
		if l := leaders[1]; l.leader != 3 || l.epoch != 8 || l.err != nil {
			t.Errorf("%s: partition 1: %+v; want leader 3 at epoch 8", name, l)
		}
		if _, ok := leaders[2]; ok {
			t.Errorf("%s: partition 2 was not asked for", name)
		}
	}
	leaders := map[int32]partitionLeader{}
	if _, err := mergeLeaders(leaders, stale, topic, want); err != nil {
		t.Fatal(err)
	}
	if l := leaders[1]; !errors.Is(l.err, kerr.LeaderNotAvailable) {
		t.Errorf("no leader named: %+v; want LEADER_NOT_AVAILABLE", l)
	}
	if found, err := mergeLeaders(map[int32]partitionLeader{}, meta(kerr.UnknownTopicOrPartition), topic, want); found || err != nil {
		t.Errorf("unknown topic: found %v, err %v; want not found, no error", found, err)
	}
	if _, err := mergeLeaders(map[int32]partitionLeader{}, meta(kerr.TopicAuthorizationFailed), topic, want); !errors.As(err, new(*kadm.AuthError)) {
		t.Errorf("not authorized: err %v; want a *kadm.AuthError", err)
	}
}

// TestCurrentLeaderNoneAtHighestEpoch: a resumed broker, behind, names
// itself leader at its old epoch while the others report the partition
// leaderless at a later one (its next leader was lost too): the partition
// has no leader, whatever the order of the answers. Taking the old leader
// instead would ask the stale broker at the epoch it still believes in,
// and pass on its end, behind the records its successor committed.
func TestCurrentLeaderNoneAtHighestEpoch(t *testing.T) {
	const topic = "cl"
	meta := func(leader, epoch int32, err *kerr.Error) *kmsg.MetadataResponse {
		resp := kmsg.NewPtrMetadataResponse()
		rt := kmsg.NewMetadataResponseTopic()
		rt.Topic = kmsg.StringPtr(topic)
		pt := kmsg.NewMetadataResponseTopicPartition()
		pt.Partition, pt.Leader, pt.LeaderEpoch = 0, leader, epoch
		if err != nil {
			pt.ErrorCode = err.Code
		}
		rt.Partitions = append(rt.Partitions, pt)
		resp.Topics = append(resp.Topics, rt)
		return resp
	}
	want := map[int32]bool{0: true}
	stale := meta(1, 4, nil)
	leaderless := meta(-1, 6, kerr.LeaderNotAvailable)
	sameEpoch := meta(-1, 4, kerr.LeaderNotAvailable)
	for name, order := range map[string][]*kmsg.MetadataResponse{"stale first": {stale, leaderless}, "stale last": {leaderless, stale}} {
		leaders := map[int32]partitionLeader{}
		for _, m := range order {
			if _, err := mergeLeaders(leaders, m, topic, want); err != nil {
				t.Fatal(err)
			}
		}
		if l := leaders[0]; !errors.Is(l.err, kerr.LeaderNotAvailable) {
			t.Errorf("%s: %+v; want LEADER_NOT_AVAILABLE, not broker 1 at its old epoch 4", name, l)
		}
	}
	// A leader named with REPLICA_NOT_AVAILABLE (a follower offline) is
	// the leader: at the highest epoch, it is listed from.
	for name, order := range map[string][]*kmsg.MetadataResponse{"first": {meta(2, 6, kerr.ReplicaNotAvailable), stale}, "last": {stale, meta(2, 6, kerr.ReplicaNotAvailable)}} {
		leaders := map[int32]partitionLeader{}
		for _, m := range order {
			if _, err := mergeLeaders(leaders, m, topic, want); err != nil {
				t.Fatal(err)
			}
		}
		if l := leaders[0]; l.err != nil || l.leader != 2 || l.epoch != 6 {
			t.Errorf("a follower offline, its answer %s: %+v; want leader 2 at epoch 6", name, l)
		}
	}
	// At the same epoch a broker that names the leader wins over one that
	// does not know it.
	for name, order := range map[string][]*kmsg.MetadataResponse{"named first": {stale, sameEpoch}, "named last": {sameEpoch, stale}} {
		leaders := map[int32]partitionLeader{}
		for _, m := range order {
			if _, err := mergeLeaders(leaders, m, topic, want); err != nil {
				t.Fatal(err)
			}
		}
		if l := leaders[0]; l.err != nil || l.leader != 1 || l.epoch != 4 {
			t.Errorf("%s: %+v; want leader 1 at epoch 4", name, l)
		}
	}
}

// threeReplicas returns three kfake brokers, a client and a topic of one
// partition with three replicas, led by broker 0.
func threeReplicas(t *testing.T) (*kfake.Cluster, *kgo.Client, string) {
	t.Helper()
	cluster, brokers := testenv.KFake(t, kfake.NumBrokers(3))
	topic := testenv.Name(t, "changelog")
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(topic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := kadm.NewClient(cl).CreateTopic(ctx, 1, 3, nil, topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		t.Fatal(err)
	}
	if err := cluster.MoveTopicPartition(topic, 0, 0); err != nil {
		t.Fatal(err)
	}
	return cluster, cl, topic
}

// TestListFencedAsksEveryBroker: on three brokers, the changelog
// partition's leadership moved from broker 0 to broker 1 (epoch + 1) while
// broker 0, resumed and behind, still names itself the leader at the old
// epoch in its metadata and answers its stale end to any listing at that
// epoch. A fenced listing takes the epoch of the brokers that know the
// move and gets the true end from the new leader, every time; so does
// the standbys' shared listing (endLister).
func TestListFencedAsksEveryBroker(t *testing.T) {
	t.Parallel()
	cluster, cl, topic := threeReplicas(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := cl.ProduceSync(ctx, kvRecords("a", "1", "b", "2")...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	meta, err := topicMetadata(topic).RequestWith(ctx, cl)
	if err != nil {
		t.Fatal(err)
	}
	staleMeta := meta // broker 0's view: leader 0 at the old epoch
	oldEpoch := meta.Topics[0].Partitions[0].LeaderEpoch
	if err := cluster.MoveTopicPartition(topic, 0, 1); err != nil {
		t.Fatal(err)
	}
	if err := cl.ProduceSync(ctx, kvRecords("c", "3")...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	const staleEnd, trueEnd = 2, 3

	var staleAnswers atomic.Int64
	cluster.ControlKey(kmsg.Metadata.Int16(), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		cluster.KeepControl()
		req := kreq.(*kmsg.MetadataRequest)
		if cluster.CurrentNode() != 0 || len(req.Topics) != 1 || req.Topics[0].Topic == nil || *req.Topics[0].Topic != topic {
			return nil, nil, false
		}
		resp := req.ResponseKind().(*kmsg.MetadataResponse)
		resp.Brokers, resp.ClusterID, resp.ControllerID = staleMeta.Brokers, staleMeta.ClusterID, staleMeta.ControllerID
		resp.Topics = staleMeta.Topics
		staleAnswers.Add(1)
		return resp, nil, true
	})
	cluster.ControlKey(kmsg.ListOffsets.Int16(), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		cluster.KeepControl()
		req := kreq.(*kmsg.ListOffsetsRequest)
		if cluster.CurrentNode() != 0 || len(req.Topics) != 1 || req.Topics[0].Topic != topic {
			return nil, nil, false
		}
		resp := req.ResponseKind().(*kmsg.ListOffsetsResponse)
		rt := kmsg.NewListOffsetsResponseTopic()
		rt.Topic = topic
		for _, rp := range req.Topics[0].Partitions {
			sp := kmsg.NewListOffsetsResponseTopicPartition()
			sp.Partition = rp.Partition
			switch le := rp.CurrentLeaderEpoch; {
			case le == -1 || le == oldEpoch:
				sp.Offset, sp.LeaderEpoch = staleEnd, oldEpoch
			default:
				sp.ErrorCode = kerr.UnknownLeaderEpoch.Code
			}
			rt.Partitions = append(rt.Partitions, sp)
		}
		resp.Topics = append(resp.Topics, rt)
		return resp, nil, true
	})

	for i := range 12 {
		offs, err := listFenced(ctx, cl, topic, []int32{0}, listEnd)
		if err != nil {
			t.Fatalf("listing %d: %v", i, err)
		}
		o, ok := offs.Lookup(topic, 0)
		if !ok || o.Err != nil || o.Offset != trueEnd {
			t.Fatalf("listing %d: %+v (listed: %v); want the true end %d, not broker 0's %d", i, o, ok, trueEnd, staleEnd)
		}
	}
	// The standbys' shared listing is as fenced.
	l := newEndLister(topic, func() (*kgo.Client, error) { return kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...)) }, clock.Real{}, zap.NewNop())
	l.interval = 50 * time.Millisecond
	defer l.stop()
	sub := l.subscribe(0)
	for i := 0; i < 6; {
		if ctx.Err() != nil {
			t.Fatal("the standbys' listing gave too few ends")
		}
		if le, ok := sub.take(); ok {
			if le.end != trueEnd {
				t.Fatalf("standbys' listing %d: end %d; want the true end %d, not broker 0's %d", i, le.end, trueEnd, staleEnd)
			}
			i++
		}
		time.Sleep(10 * time.Millisecond)
	}
	if staleAnswers.Load() == 0 {
		t.Error("broker 0 never answered the metadata: the test shows nothing")
	}
}

// TestListFencedPausedReplica: a broker that does not answer (paused)
// holds a listing up for replicaMetadataWait, not longer: the others'
// metadata names the leader.
func TestListFencedPausedReplica(t *testing.T) {
	t.Parallel()
	cluster, cl, topic := threeReplicas(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := cl.ProduceSync(ctx, kvRecords("a", "1")...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	// Broker 2 is paused: it answers nothing about the topic until the
	// test ends.
	paused := make(chan struct{})
	t.Cleanup(func() { close(paused) })
	cluster.ControlKey(kmsg.Metadata.Int16(), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		cluster.KeepControl()
		req := kreq.(*kmsg.MetadataRequest)
		if cluster.CurrentNode() == 2 && len(req.Topics) == 1 && req.Topics[0].Topic != nil && *req.Topics[0].Topic == topic {
			cluster.SleepControl(func() { <-paused })
		}
		return nil, nil, false
	})
	for i := range 2 {
		start := time.Now()
		offs, err := listFenced(ctx, cl, topic, []int32{0}, listEnd)
		took := time.Since(start)
		if o, ok := offs.Lookup(topic, 0); err != nil || !ok || o.Err != nil || o.Offset != 1 {
			t.Fatalf("listing %d: %+v, %v; want the end 1", i, o, err)
		}
		if took > replicaMetadataWait+time.Second {
			t.Errorf("listing %d took %s with a paused replica; want about %s at most", i, took, replicaMetadataWait)
		}
	}
}

// TestListFencedPausedLeader: the leader of one of three partitions does
// not answer its ListOffsets (paused): the leaders are asked at once, so
// the other two partitions are listed all the same, passed on before the
// listing gives up on the paused one.
func TestListFencedPausedLeader(t *testing.T) {
	t.Parallel()
	cluster, brokers, topic := spreadTopic(t, listBrokers)
	paused := make(chan struct{})
	t.Cleanup(func() { close(paused) })
	cluster.ControlKey(kmsg.ListOffsets.Int16(), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		cluster.KeepControl()
		if cluster.CurrentNode() == 2 {
			cluster.SleepControl(func() { <-paused })
		}
		return nil, nil, false
	})
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	// The leaders' order varies from one listing to the next: three
	// listings, each given up after a while.
	for i := range 3 {
		ctx, cancel := context.WithTimeout(context.Background(), replicaMetadataWait+time.Second)
		got := map[int32]kadm.ListedOffset{}
		err := listFencedEach(ctx, cl, topic, []int32{0, 1, 2}, listEnd, func(o kadm.ListedOffset) { got[o.Partition] = o })
		cancel()
		for _, p := range []int32{0, 1} {
			if o, ok := got[p]; !ok || o.Err != nil || o.Offset != 0 {
				t.Fatalf("listing %d: partition %d: %+v (listed %v; the listing's error %v); want its end 0 despite partition 2's paused leader", i, p, o, ok, err)
			}
		}
		if o, ok := got[2]; ok && o.Err == nil {
			t.Fatalf("listing %d: partition 2 listed %+v from its paused leader", i, o)
		}
		if err == nil {
			t.Fatalf("listing %d: no error for the paused leader", i)
		}
	}
}
