package stream

import (
	"errors"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/meterline/meterline/internal/service"
)

// A transaction whose records cannot be written within the transaction
// timeout, because their partitions have no reachable leader (on a real
// broker stopped mid-transaction: refused dials), aborts; kgo then fails
// the records it never sent with its last attempt's error. The broker
// refused nothing: the stage rebuilds its session and, once the leaders
// are back, counts every input once (TestRealKafkaOutageAlert's dedup
// stopped with "a record of the transaction could not be written ...
// connection refused").
func TestUnwrittenRecordsRebuildTheSession(t *testing.T) {
	// The output's leaders are gone: produce requests answer
	// NOT_LEADER_FOR_PARTITION and the metadata kgo then asks for answers
	// LEADER_NOT_AVAILABLE, so the records wait unsent.
	unwrittenRebuilds(t, func(s *suite) []kfake.Fault {
		return []kfake.Fault{
			{Keys: []kmsg.Key{kmsg.Produce}, Topic: s.output, Err: kerr.NotLeaderForPartition, Count: -1},
			{Keys: []kmsg.Key{kmsg.Metadata}, Topic: s.output, Err: kerr.LeaderNotAvailable, Count: -1},
		}
	})
}

// unwrittenRebuilds runs a stage whose output the faults keep unwritten
// for longer than its transaction timeout, then removes them: the
// transaction aborts, the session is rebuilt for records_unwritten, and
// every input counts once. It returns the stage's instance.
func unwrittenRebuilds(t *testing.T, faults func(s *suite) []kfake.Fault) *instance {
	s := newSuite(t, nil, nil)
	fs := vfs.NewMem()
	a := s.start("a", fs, func(c *Config, _ *countProc) { c.TransactionTimeout = 2 * time.Second })
	s.send(20)
	s.caughtUp()

	held := s.cluster.Fault(faults(s)...)
	s.send(20)
	s.waitFor("a transaction to abort", func() bool {
		return a.metric("meterline_stream_transactions_total", "outcome", "aborted") >= 1
	})
	held.Remove()
	s.waitFor("the session to be rebuilt for records_unwritten", func() bool {
		return a.metric("meterline_stream_session_restarts_total", "reason", "records_unwritten") >= 1
	})
	s.caughtUp()
	s.finish(a, fs)
	return a
}

// A transaction whose records the brokers keep refusing with
// NOT_ENOUGH_REPLICAS (a partition's in-sync replicas below its
// min.insync.replicas: two brokers of three down) cannot be written within
// the transaction timeout either. kgo retries the records until the
// transaction aborts, then fails them as aborted (or, once the coordinator
// timed the transaction out, with INVALID_PRODUCER_EPOCH): the session is
// rebuilt for records_unwritten, never counted as the producer's own state
// or a fence, which say another process took the transactional ID.
func TestNotEnoughReplicasRebuildsForUnwrittenRecords(t *testing.T) {
	a := unwrittenRebuilds(t, func(s *suite) []kfake.Fault {
		return []kfake.Fault{{Keys: []kmsg.Key{kmsg.Produce}, Topic: s.output, Err: kerr.NotEnoughReplicas, Count: -1}}
	})
	for _, reason := range []string{"producer_state", "fenced"} {
		if n := a.metric("meterline_stream_session_restarts_total", "reason", reason); n != 0 {
			t.Errorf("sessions rebuilt for %s: %v, want 0 (the records were never written)", reason, n)
		}
	}
}

// TestReadyNotEnoughReplicas: while the brokers refuse the stage's writes
// with NOT_ENOUGH_REPLICAS (the output's partitions in sync on one
// replica of three, their min.insync.replicas 2), the stage is not ready,
// and /readyz, /status.json and meterline_stream_write_refused_partitions
// say it cannot write and why, naming the partitions, from when the
// transaction's records have waited unwritten for 5 s, before the
// transaction times out; before, it was ready throughout but for the
// session's rebuilds, and only its log said why, after each abort. Once
// the replicas are back in sync and a transaction commits, it is ready
// again.
func TestReadyNotEnoughReplicas(t *testing.T) {
	t.Parallel()
	s := newSuite(t, nil, nil)
	a := s.start("a", vfs.NewMem(), func(c *Config, _ *countProc) {
		c.TransactionTimeout = 12 * time.Second
		c.OutputTopics = []string{s.output}
	})
	s.send(20)
	s.caughtUp()
	setMinInsync(t, s, s.output, 2)

	shrunk := shrinkISR(t, s, s.output)
	held := s.cluster.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: s.output, Err: kerr.NotEnoughReplicas, Count: -1})
	s.send(20)
	s.waitFor("the stage to say it cannot write", func() bool {
		err := a.rt.Ready()
		return err != nil && strings.Contains(err.Error(), "cannot write")
	})
	err := a.rt.Ready()
	t.Logf("Ready() = %v", err)
	if n := a.metric("meterline_stream_transactions_total", "outcome", "aborted"); n != 0 {
		t.Errorf("the stage said it cannot write only once %v transactions aborted, want it said while the first waits", n)
	}
	for _, want := range []string{"min.insync.replicas 2", "NOT_ENOUGH_REPLICAS", s.output + "/0", s.output + "/1"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Ready() = %q, want it to say %q", err, want)
		}
	}
	if n := a.metric("meterline_stream_write_refused_partitions", "cause", "below_min_insync"); n != 2 {
		t.Errorf("meterline_stream_write_refused_partitions{cause=below_min_insync} = %v, want 2", n)
	}
	if st := service.StageStatusOf(a.rt); !strings.Contains(st.CannotWrite, "NOT_ENOUGH_REPLICAS") {
		t.Errorf("status cannot_write = %q, want the cause", st.CannotWrite)
	}

	held.Remove()
	shrunk.Store(false)
	s.caughtUp()
	s.waitFor("the stage to be ready once a transaction committed", func() bool { return a.rt.Ready() == nil })
	if n := a.metric("meterline_stream_write_refused_partitions"); n != 0 {
		t.Errorf("meterline_stream_write_refused_partitions = %v once a transaction committed, want 0", n)
	}
	if st := service.StageStatusOf(a.rt); st.CannotWrite != "" {
		t.Errorf("status cannot_write = %q once a transaction committed, want empty", st.CannotWrite)
	}
	a.shutdown()
}

// setMinInsync sets topic's min.insync.replicas.
func setMinInsync(t *testing.T, s *suite, topic string, n int) {
	t.Helper()
	v := strconv.Itoa(n)
	rs, err := s.adm.AlterTopicConfigs(t.Context(), []kadm.AlterConfig{{Name: "min.insync.replicas", Value: &v}}, topic)
	if err == nil {
		for _, r := range rs {
			err = errors.Join(err, r.Err)
		}
	}
	if err != nil {
		t.Fatal(err)
	}
}

// shrinkISR makes the suite's cluster, while the returned flag is set,
// answer every Metadata request with the cluster's metadata as it was when
// shrinkISR was called, but for topic's partitions, which list three
// replicas of which only the leader is in sync (the other two brokers
// down). The flag starts set.
func shrinkISR(t *testing.T, s *suite, topic string) *atomic.Bool {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(s.brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	req := kmsg.NewPtrMetadataRequest()
	snap, err := req.RequestWith(t.Context(), cl)
	if err != nil {
		t.Fatal(err)
	}
	for i := range snap.Topics {
		st := &snap.Topics[i]
		if st.Topic == nil || *st.Topic != topic {
			continue
		}
		for j := range st.Partitions {
			sp := &st.Partitions[j]
			sp.Replicas = []int32{sp.Leader, sp.Leader + 100, sp.Leader + 101}
			sp.ISR = []int32{sp.Leader}
			sp.OfflineReplicas = []int32{sp.Leader + 100, sp.Leader + 101}
		}
	}
	var on atomic.Bool
	on.Store(true)
	s.cluster.ControlKey(int16(kmsg.Metadata), func(kr kmsg.Request) (kmsg.Response, error, bool) {
		s.cluster.KeepControl()
		if !on.Load() {
			return nil, nil, false
		}
		r := kr.(*kmsg.MetadataRequest)
		resp := *snap
		resp.Version = r.Version
		if r.Topics != nil {
			resp.Topics = nil
			for _, rt := range r.Topics {
				for _, st := range snap.Topics {
					if rt.Topic != nil && st.Topic != nil && *rt.Topic == *st.Topic || rt.Topic == nil && rt.TopicID == st.TopicID {
						resp.Topics = append(resp.Topics, st)
					}
				}
			}
		}
		return &resp, nil, true
	})
	return &on
}
