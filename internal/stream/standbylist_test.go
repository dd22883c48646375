package stream

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/meterline/meterline/internal/clock"
	"github.com/meterline/meterline/internal/kafka"
	"github.com/meterline/meterline/internal/session"
	"github.com/meterline/meterline/internal/testenv"
)

// standbyListWorld is a runtime on a kfake cluster of listBrokers brokers
// whose changelog has n partitions, each led by broker p % listBrokers,
// that keeps every one of them warm as a standby; and counters of the
// changelog's metadata and ListOffsets requests the cluster answers.
type standbyListWorld struct {
	cluster            *kfake.Cluster
	rt                 *Runtime
	changelog          string
	metadata, listings *atomic.Int64
	n                  int32
	stopped            bool
}

const listBrokers = 3

// spreadTopic starts listBrokers kfake brokers with a topic of n
// partitions, partition p led by broker p % listBrokers.
func spreadTopic(tb testing.TB, n int32) (*kfake.Cluster, []string, string) {
	tb.Helper()
	cluster, brokers := testenv.KFake(tb, kfake.NumBrokers(listBrokers))
	topic := testenv.Name(tb, "changelog")
	testenv.CreateTopic(tb, brokers, topic, n, nil)
	for p := range n {
		if err := cluster.MoveTopicPartition(topic, p, p%listBrokers); err != nil {
			tb.Fatal(err)
		}
	}
	return cluster, brokers, topic
}

// countListings counts the metadata and ListOffsets requests of topic
// that cluster answers.
func countListings(cluster *kfake.Cluster, topic string) (metadata, listings *atomic.Int64) {
	metadata, listings = new(atomic.Int64), new(atomic.Int64)
	cluster.ControlKey(kmsg.Metadata.Int16(), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		cluster.KeepControl()
		req := kreq.(*kmsg.MetadataRequest)
		if len(req.Topics) == 1 && req.Topics[0].Topic != nil && *req.Topics[0].Topic == topic {
			metadata.Add(1)
		}
		return nil, nil, false
	})
	cluster.ControlKey(kmsg.ListOffsets.Int16(), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		cluster.KeepControl()
		req := kreq.(*kmsg.ListOffsetsRequest)
		if len(req.Topics) == 1 && req.Topics[0].Topic == topic {
			listings.Add(1)
		}
		return nil, nil, false
	})
	return metadata, listings
}

func newStandbyListWorld(t *testing.T, n int32) *standbyListWorld {
	t.Helper()
	cluster, brokers, changelog := spreadTopic(t, n)
	w := &standbyListWorld{cluster: cluster, changelog: changelog, n: n}
	w.metadata, w.listings = countListings(cluster, changelog)
	input := testenv.Name(t, "in")
	testenv.CreateTopic(t, brokers, input, n, nil)
	cfg := Config{Stage: "count",
		Config: session.Config{Kafka: kafka.Config{Brokers: brokers}, Group: testenv.Name(t, "group"), InstanceID: "a",
			SessionTimeout: 3 * time.Second, RebalanceTimeout: 3 * time.Second},
		InputTopic: input, ChangelogTopic: w.changelog, FS: vfs.NewMem(), StateDir: "state-a",
		StandbyReplicas: 1, Registerer: prometheus.NewRegistry(),
		Logger: zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))}
	rt, err := New(cfg, &countProc{})
	if err != nil {
		t.Fatal(err)
	}
	w.rt = rt
	t.Cleanup(w.stop)
	return w
}

// standbyAll makes the runtime a standby of every partition and waits until
// every tail knows its lag (it listed the changelog's end).
func (w *standbyListWorld) standbyAll(t *testing.T) {
	t.Helper()
	ps := make([]int32, w.n)
	for p := range w.n {
		ps[p] = p
	}
	w.rt.sb.assigned(StandbyAssignment{Standby: ps})
	deadline := time.Now().Add(30 * time.Second)
	for {
		known := 0
		w.rt.EachStandbyStatus(func(_ int32, _, lag int64) {
			if lag >= 0 {
				known++
			}
		})
		if known == int(w.n) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d standby tails running after 30 s", known, w.n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (w *standbyListWorld) stop() {
	if w.stopped {
		return
	}
	w.stopped = true
	w.rt.sb.stopAll()
	w.rt.restores.Wait()
	_ = w.rt.store.Close()
}

// TestStandbyListingIndependentOfPartitions: the standby tails of one
// runtime share their periodic listing of the changelog's end. With 2 or 8
// standby partitions on 3 brokers, an interval costs one metadata request
// per broker and one ListOffsets per partition leader, not that for each
// partition.
func TestStandbyListingIndependentOfPartitions(t *testing.T) {
	t.Parallel()
	const window = 5 * standbyListInterval
	for _, n := range []int32{2, 8} {
		t.Run(fmt.Sprintf("%d partitions", n), func(t *testing.T) {
			t.Parallel()
			w := newStandbyListWorld(t, n)
			w.standbyAll(t)
			time.Sleep(standbyListInterval + standbyListInterval/2) // the tails' start listings are over
			md0, lo0 := w.metadata.Load(), w.listings.Load()
			time.Sleep(window)
			md, lo := w.metadata.Load()-md0, w.listings.Load()-lo0
			intervals := int64(window / standbyListInterval)
			leaders := int64(min(n, listBrokers))
			t.Logf("%d standby partitions on %d brokers (%d leaders), over %d intervals: %d metadata requests, %d ListOffsets (%.1f, %.1f per interval)",
				n, listBrokers, leaders, intervals, md, lo, float64(md)/float64(intervals), float64(lo)/float64(intervals))
			// One interval more than the window holds: a listing that
			// straddles its edge.
			if limit := listBrokers * (intervals + 1); md > limit {
				t.Errorf("%d metadata requests of the changelog in %d intervals, want at most %d (one per broker per interval, whatever the partitions)", md, intervals, limit)
			}
			if limit := leaders * (intervals + 1); lo > limit {
				t.Errorf("%d ListOffsets requests of the changelog in %d intervals, want at most %d (one per leader per interval, whatever the partitions)", lo, intervals, limit)
			}
			if lo < intervals-1 {
				t.Errorf("%d ListOffsets requests in %d intervals: the standbys stopped listing", lo, intervals)
			}
		})
	}
}

// TestStandbyListingEntriesFollowTails: a tail registers with the shared
// listing when it starts and unregisters when it stops, and the listing
// stops once no tail is left; a tail started again is listed again.
func TestStandbyListingEntriesFollowTails(t *testing.T) {
	t.Parallel()
	w := newStandbyListWorld(t, 4)
	w.standbyAll(t)
	l := w.rt.sb.ends
	entries := func() (n int, running bool) {
		l.mu.Lock()
		defer l.mu.Unlock()
		return len(l.subs), l.running
	}
	waitUntil := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within 10 s", what)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitUntil("4 entries", func() bool { n, _ := entries(); return n == 4 })
	w.rt.sb.assigned(StandbyAssignment{Standby: []int32{1, 3}})
	waitUntil("2 entries once 2 tails stopped", func() bool { n, _ := entries(); return n == 2 })
	w.rt.sb.assigned(StandbyAssignment{})
	waitUntil("the listing to stop without tails", func() bool { n, running := entries(); return n == 0 && !running })
	lo := w.listings.Load()
	time.Sleep(2 * standbyListInterval)
	if got := w.listings.Load(); got != lo {
		t.Fatalf("%d listings without standby tails", got-lo)
	}
	w.standbyAll(t)
	lo = w.listings.Load()
	waitUntil("listings again", func() bool { return w.listings.Load() > lo })
	if n, running := entries(); n != 4 || !running {
		t.Fatalf("%d entries (running %v) after the tails started again, want 4", n, running)
	}
}

// TestStandbyListingHoldsNoPartitionBack: the leader of one partition
// answers its ListOffsets with an error, or not at all (paused): the other
// partitions are listed all the same, every interval (a paused broker
// delays each listing by replicaMetadataWait, the wait for its metadata,
// not by the request's timeout), the failing one gets nothing, and
// neither unregistering nor stopping waits for the paused broker.
func TestStandbyListingHoldsNoPartitionBack(t *testing.T) {
	t.Parallel()
	for _, pause := range []bool{false, true} {
		t.Run(map[bool]string{false: "error", true: "paused"}[pause], func(t *testing.T) {
			t.Parallel()
			standbyListingFailingLeader(t, pause)
		})
	}
}

func standbyListingFailingLeader(t *testing.T, pause bool) {
	cluster, brokers, topic := spreadTopic(t, listBrokers)
	paused := make(chan struct{})
	var unpause sync.Once
	t.Cleanup(func() { unpause.Do(func() { close(paused) }) })
	cluster.ControlKey(kmsg.ListOffsets.Int16(), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		cluster.KeepControl()
		if cluster.CurrentNode() != 2 {
			return nil, nil, false
		}
		if pause {
			cluster.SleepControl(func() { <-paused })
			return nil, nil, false
		}
		req := kreq.(*kmsg.ListOffsetsRequest)
		resp := req.ResponseKind().(*kmsg.ListOffsetsResponse)
		for _, rt := range req.Topics {
			st := kmsg.NewListOffsetsResponseTopic()
			st.Topic = rt.Topic
			for _, rp := range rt.Partitions {
				sp := kmsg.NewListOffsetsResponseTopicPartition()
				sp.Partition, sp.ErrorCode = rp.Partition, kerr.UnknownLeaderEpoch.Code
				st.Partitions = append(st.Partitions, sp)
			}
			resp.Topics = append(resp.Topics, st)
		}
		return resp, nil, true
	})
	l := newEndLister(topic, func() (*kgo.Client, error) { return kgo.NewClient(kgo.SeedBrokers(brokers...)) }, clock.Real{}, zap.NewNop())
	l.interval = 100 * time.Millisecond
	want, within := 10, 3*time.Second
	if pause {
		want, within = 3, 3*replicaMetadataWait+2*time.Second
	}
	subs := make([]*endSub, listBrokers)
	for p := range subs {
		subs[p] = l.subscribe(int32(p))
	}
	got := make([]int, listBrokers)
	start := time.Now()
	for time.Since(start) < within && (got[0] < want || got[1] < want) {
		for p, s := range subs {
			if le, ok := s.take(); ok {
				if le.end != 0 {
					t.Fatalf("partition %d listed at %d, want 0", p, le.end)
				}
				got[p]++
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("listings taken per partition in %s: %v", time.Since(start).Round(time.Millisecond), got)
	if got[0] < want || got[1] < want {
		t.Fatalf("listings taken per partition %v within %s, want %d of partitions 0 and 1: the failing leader of partition 2 holds the others back", got, within, want)
	}
	if got[2] != 0 {
		t.Fatalf("partition 2 got %d listings from its failing leader", got[2])
	}
	start = time.Now()
	for _, s := range subs {
		l.unsubscribe(s)
	}
	l.stop()
	if took := time.Since(start); took > time.Second {
		t.Fatalf("stopping the listing took %s", took)
	}
}

// BenchmarkStandbyInterval measures what one interval of the standbys'
// listing costs on 3 kfake brokers, with n standby partitions: each
// partition listed by its own tail (per_partition, n fenced listings) or
// all of them in the shared one (shared, one listing, as endLister's
// round). It reports the metadata and ListOffsets requests per interval.
func BenchmarkStandbyInterval(b *testing.B) {
	for _, n := range []int32{1, 8, 32} {
		cluster, brokers, topic := spreadTopic(b, n)
		metadata, listings := countListings(cluster, topic)
		cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
		if err != nil {
			b.Fatal(err)
		}
		ps := make([]int32, n)
		for p := range n {
			ps[p] = p
		}
		ctx := context.Background()
		if _, err := listFenced(ctx, cl, topic, ps, listEnd); err != nil { // the client knows the brokers
			b.Fatal(err)
		}
		list := func(ps []int32) {
			offs, err := listFenced(ctx, cl, topic, ps, listEnd)
			if err != nil {
				b.Fatal(err)
			}
			for _, p := range ps {
				if o, ok := offs.Lookup(topic, p); !ok || o.Err != nil {
					b.Fatalf("partition %d: %+v (listed %v)", p, o, ok)
				}
			}
		}
		for _, mode := range []string{"per_partition", "shared"} {
			b.Run(fmt.Sprintf("%s/partitions=%d", mode, n), func(b *testing.B) {
				md0, lo0 := metadata.Load(), listings.Load()
				for b.Loop() {
					if mode == "shared" {
						list(ps)
						continue
					}
					for _, p := range ps {
						list([]int32{p})
					}
				}
				b.ReportMetric(float64(metadata.Load()-md0)/float64(b.N), "metadata/op")
				b.ReportMetric(float64(listings.Load()-lo0)/float64(b.N), "listoffsets/op")
			})
		}
		cl.Close()
	}
}
