package stream

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/meterline/meterline/internal/session"
	"github.com/meterline/meterline/internal/testenv"
)

// The sequence-number guard of seqreset.go. kgo stores a new topic's
// partitions a few instructions after it hands their first records to the
// sinks (storePartitionsUpdate); no request or hook of the client runs in
// between, so a test cannot hold the metadata goroutine there. The tests
// below instead make the client's answer about its stored metadata lag
// (Runtime.storedFn, in front of the real answer), and have kfake refuse
// a batch with OUT_OF_ORDER_SEQUENCE_NUMBER as a broker does when a
// partition missed the reset.

// lagging makes rt's client report the partitions of topic as not in its
// stored metadata while held is set, and counts how often it was asked.
func lagging(topic string, held *atomic.Bool, asked *atomic.Int64) func(*Runtime) {
	return func(rt *Runtime) {
		rt.storedFn = func(tp topicPartition) bool {
			if tp.topic == topic && held.Load() {
				asked.Add(1)
				return false
			}
			return clientHolds(rt.sess.Client(), tp)
		}
	}
}

// A transaction does not end before the partitions it wrote to are in the
// client's stored metadata; it ends once they are, and the session goes on.
func TestCommitWaitsForProducedPartitionsInClientMetadata(t *testing.T) {
	s := newSuite(t, nil, nil)
	fs := vfs.NewMem()
	var held atomic.Bool
	var asked atomic.Int64
	held.Store(true)
	a := s.startRuntime("a", fs, &countProc{output: s.output}, func(*Config) {}, lagging(s.output, &held, &asked))
	s.waitFor("a to own both partitions", func() bool { return a.owned() == 2 })
	s.send(20)
	s.waitFor("the commit to ask about the output's partitions again and again", func() bool { return asked.Load() >= 10 })
	if n := a.metric("meterline_stream_transactions_total", "outcome", "committed"); n != 0 {
		t.Fatalf("%v transactions committed while the partitions they wrote to were not in the client's metadata", n)
	}
	held.Store(false)
	s.caughtUp()
	if n := a.metric("meterline_stream_session_restarts_total", "reason", "metadata_missing"); n != 0 {
		t.Errorf("the session was rebuilt %v times for metadata_missing, want 0: the partitions reached the metadata within the wait", n)
	}
	s.finish(a, fs)
}

// A partition that is still missing from the client's stored metadata when
// the wait ends gets the session rebuilt after the transaction, which
// commits; nothing is lost or counted twice.
func TestSessionRebuiltWhenProducedPartitionsStayOutOfClientMetadata(t *testing.T) {
	s := newSuite(t, nil, nil)
	fs := vfs.NewMem()
	var held atomic.Bool
	var asked atomic.Int64
	held.Store(true)
	lag := lagging(s.output, &held, &asked)
	a := s.startRuntime("a", fs, &countProc{output: s.output}, func(*Config) {}, func(rt *Runtime) {
		lag(rt)
		rt.metadataWait = 50 * time.Millisecond
	})
	s.send(20)
	s.waitFor("the session to be rebuilt for metadata_missing", func() bool {
		return a.metric("meterline_stream_session_restarts_total", "reason", "metadata_missing") >= 1
	})
	if n := a.metric("meterline_stream_transactions_total", "outcome", "committed"); n < 1 {
		t.Errorf("%v transactions committed before the session was rebuilt, want at least 1", n)
	}
	held.Store(false)
	s.finish(a, fs)
}

// clientHolds reads what the client stored: nothing of a topic before its
// first produce, the topic's partitions once its metadata is stored, and
// no partition beyond them.
func TestClientHoldsStoredPartitions(t *testing.T) {
	_, brokers := testenv.KFake(t)
	topic := testenv.Name(t, "t")
	testenv.CreateTopic(t, brokers, topic, 2, nil)
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if clientHolds(cl, topicPartition{topic, 0}) {
		t.Fatal("the client holds a partition of a topic it never produced to")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Partition: 1, Value: []byte("x")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for !clientHolds(cl, topicPartition{topic, 1}) || !clientHolds(cl, topicPartition{topic, 0}) {
		if time.Now().After(deadline) {
			t.Fatal("the client does not hold the partitions of a topic it produced to")
		}
		time.Sleep(time.Millisecond)
	}
	if clientHolds(cl, topicPartition{topic, 2}) {
		t.Error("the client holds partition 2 of a topic of 2 partitions")
	}
}

// refuseSequences makes kfake answer OUT_OF_ORDER_SEQUENCE_NUMBER, as a
// broker does to a partition whose sequence numbers missed the reset, to
// txnID's produce requests that write to topic, while armed is set; once
// set, only to the first such request.
func refuseSequences(t *testing.T, s *suite, txnID, topic string, armed, once *atomic.Bool) (refused *atomic.Int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	td, err := s.adm.ListTopics(ctx, topic)
	if err != nil || td[topic].Err != nil {
		t.Fatalf("describe %s: %v %v", topic, err, td[topic].Err)
	}
	id := [16]byte(td[topic].ID)
	refused = new(atomic.Int64)
	s.cluster.ControlKey(int16(kmsg.Produce), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		s.cluster.KeepControl()
		req := kreq.(*kmsg.ProduceRequest)
		if !armed.Load() || req.TransactionID == nil || *req.TransactionID != txnID {
			return nil, nil, false
		}
		ours := false
		for _, rt := range req.Topics {
			ours = ours || rt.Topic == topic || rt.TopicID == id
		}
		if !ours {
			return nil, nil, false
		}
		if once.Load() {
			armed.Store(false)
		}
		refused.Add(1)
		resp := req.ResponseKind().(*kmsg.ProduceResponse)
		for _, rt := range req.Topics {
			st := kmsg.NewProduceResponseTopic()
			st.Topic, st.TopicID = rt.Topic, rt.TopicID
			for _, rp := range rt.Partitions {
				sp := kmsg.NewProduceResponseTopicPartition()
				sp.Partition, sp.ErrorCode, sp.BaseOffset = rp.Partition, kerr.OutOfOrderSequenceNumber.Code, -1
				st.Partitions = append(st.Partitions, sp)
			}
			resp.Topics = append(resp.Topics, st)
		}
		return resp, nil, true
	})
	return refused
}

// refusedStage starts instance a, has it count inputs, then has kfake
// refuse its produce requests to the output with
// OUT_OF_ORDER_SEQUENCE_NUMBER (refuseSequences: only the first, with
// once) and sends more inputs.
func refusedStage(t *testing.T, once bool) (s *suite, fs vfs.FS, a *instance, armed *atomic.Bool, refused *atomic.Int64) {
	s = newSuite(t, nil, nil)
	fs = vfs.NewMem()
	a = s.start("a", fs)
	s.send(20)
	s.caughtUp()
	armed = new(atomic.Bool)
	var onlyOnce atomic.Bool
	onlyOnce.Store(once)
	refused = refuseSequences(t, s, s.group+"-a", s.output, armed, &onlyOnce)
	armed.Store(true)
	s.send(20)
	return s, fs, a, armed, refused
}

// A transaction whose records the broker refuses with
// OUT_OF_ORDER_SEQUENCE_NUMBER aborts and the session is rebuilt; the stage
// goes on and counts every input once.
func TestOutOfOrderSequenceRebuildsTheSession(t *testing.T) {
	s, fs, a, _, refused := refusedStage(t, true)
	s.waitFor("the session to be rebuilt", func() bool {
		return a.metric("meterline_stream_session_restarts_total", "reason", "out_of_order_sequence") >= 1
	})
	s.caughtUp()
	if n := refused.Load(); n != 1 {
		t.Errorf("kfake refused %d produce requests, want 1", n)
	}
	if n := a.metric("meterline_stream_transactions_total", "outcome", "aborted"); n < 1 {
		t.Errorf("%v transactions aborted, want at least 1", n)
	}
	s.finish(a, fs)
	if n := a.metric("meterline_stream_session_restarts_total", "reason", "out_of_order_sequence"); n != 1 {
		t.Errorf("the session was rebuilt %v times for out_of_order_sequence, want 1 (%s)", n, restartsByReason(t, a))
	}
}

// restartsByReason lists a's session rebuilds by reason, for a failure
// message.
func restartsByReason(t *testing.T, a *instance) string {
	t.Helper()
	var b strings.Builder
	for _, r := range append([]session.RestartReason{session.RestartCommitUnknown, session.RestartFenced, session.RestartInitProducerID, session.RestartOther}, restartReasons...) {
		if n := a.metric("meterline_stream_session_restarts_total", "reason", string(r)); n != 0 {
			fmt.Fprintf(&b, "%s %v; ", r, n)
		}
	}
	return "rebuilds by reason: " + strings.TrimSuffix(b.String(), "; ")
}

// OUT_OF_ORDER_SEQUENCE_NUMBER in every session stops the stage after
// maxSequenceRestarts rebuilds for it, with nothing of those transactions
// committed; a restart then counts every input once. Rebuilds for other
// reasons (a loaded machine's metadata_missing) do not count.
func TestRepeatedOutOfOrderSequenceStops(t *testing.T) {
	s, fs, a, armed, _ := refusedStage(t, false)
	err := a.exit()
	if !errors.Is(err, kerr.OutOfOrderSequenceNumber) {
		t.Fatalf("a stopped with %v, want OUT_OF_ORDER_SEQUENCE_NUMBER", err)
	}
	if n := a.metric("meterline_stream_session_restarts_total", "reason", "out_of_order_sequence"); n != maxSequenceRestarts {
		t.Errorf("the session was rebuilt %v times for out_of_order_sequence, want %d (%s)", n, maxSequenceRestarts, restartsByReason(t, a))
	}
	t.Log(restartsByReason(t, a))
	armed.Store(false)
	a = s.start("a", fs)
	s.finish(a, fs)
}
