package stream

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/meterline/meterline/internal/service"
	"github.com/meterline/meterline/internal/testenv"
)

// TestReadyWaitsForUnstableOffsets: a previous owner's (a zombie's)
// transaction that commits offsets of the input partitions for the group
// is open when the stage joins: the coordinator answers its fetch of the
// committed offsets (require_stable) with UNSTABLE_OFFSET_COMMIT until the
// transaction ends, and the partitions are neither restoring nor
// processing meanwhile. The stage is not ready, and /readyz, /status.json
// and meterline_stream_offsets_waiting_partitions say the partitions wait
// on an open transaction, and for how long; once the transaction ends,
// the stage restores, processes and is ready. It was ready, owning
// nothing, throughout the wait.
func TestReadyWaitsForUnstableOffsets(t *testing.T) {
	t.Parallel()
	readyWaitsForUnstableOffsets(t, nil)
}

// TestRealReadyWaitsForUnstableOffsets is TestReadyWaitsForUnstableOffsets
// on the real broker of METERLINE_TEST_KAFKA.
func TestRealReadyWaitsForUnstableOffsets(t *testing.T) {
	t.Parallel()
	readyWaitsForUnstableOffsets(t, testenv.RealKafka(t))
}

func readyWaitsForUnstableOffsets(t *testing.T, brokers []string) {
	s := newSuite(t, brokers, nil)
	s.send(10)
	end := s.openOffsetsTxn(map[int32]int64{0: 0, 1: 0})

	a := s.start("a", vfs.NewMem())
	s.waitFor("a to join its group", func() bool { return testutil.ToFloat64(a.rt.m.session.Member) == 1 })
	s.waitFor("a to find both partitions waiting on the open transaction", func() bool {
		return a.metric("meterline_stream_offsets_waiting_partitions", "cause", "open_transaction") == 2
	})
	time.Sleep(1500 * time.Millisecond) // long enough for a wait of seconds
	err := a.rt.Ready()
	if err == nil {
		t.Fatal("Ready() = nil while the partitions wait on a previous owner's open transaction")
	}
	for _, want := range []string{"2 partitions waiting for their committed offsets", "partitions [0 1]", "UNSTABLE_OFFSET_COMMIT", "open transaction"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Ready() = %q, want it to say %q", err, want)
		}
	}
	if w := a.metric("meterline_stream_offsets_wait_seconds"); w < 1 {
		t.Errorf("meterline_stream_offsets_wait_seconds = %v after more than 1.5 s of waiting, want at least 1", w)
	}
	st := service.StageStatusOf(a.rt)
	if len(st.Partitions) != 2 {
		t.Fatalf("status lists partitions %+v, want both", st.Partitions)
	}
	for _, p := range st.Partitions {
		if p.State != service.PartitionWaiting || p.WaitSeconds == nil || *p.WaitSeconds < 1 || !strings.Contains(p.WaitReason, "UNSTABLE_OFFSET_COMMIT") {
			t.Errorf("status of partition %d: state %q, waited %v, reason %q; want waiting for more than 1 s on the open transaction",
				p.Partition, p.State, p.WaitSeconds, p.WaitReason)
		}
	}
	if a.owned() != 0 {
		t.Errorf("a owns %d partitions while their offsets are unstable", a.owned())
	}

	end(false)
	s.waitFor("a to be ready once the transaction aborted", func() bool { return a.rt.Ready() == nil })
	for _, cause := range []string{"open_transaction", "fetch"} {
		if n := a.metric("meterline_stream_offsets_waiting_partitions", "cause", cause); n != 0 {
			t.Errorf("meterline_stream_offsets_waiting_partitions{cause=%q} = %v once ready, want 0", cause, n)
		}
	}
	if w := a.metric("meterline_stream_offsets_wait_seconds"); w != 0 {
		t.Errorf("meterline_stream_offsets_wait_seconds = %v once ready, want 0", w)
	}
	s.caughtUp()
	a.shutdown()
}

// openOffsetsTxn opens a transaction of a previous owner of the suite's
// group (its own transactional ID) that commits offsets of the input's
// partitions for the group, and returns the function that ends it
// (commit or abort). The transaction is aborted at the end of the test
// if still open.
func (s *suite) openOffsetsTxn(offsets map[int32]int64) (end func(commit bool)) {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	txnID := s.group + "-zombie"
	cl, err := kgo.NewClient(kgo.SeedBrokers(s.brokers...), kgo.TransactionalID(txnID), kgo.TransactionTimeout(time.Minute))
	if err != nil {
		s.t.Fatal(err)
	}
	id, epoch, err := cl.ProducerID(ctx)
	if err != nil {
		s.t.Fatal(err)
	}
	add := kmsg.NewPtrAddOffsetsToTxnRequest()
	add.TransactionalID, add.ProducerID, add.ProducerEpoch, add.Group = txnID, id, epoch, s.group
	addResp, err := add.RequestWith(ctx, cl)
	if err == nil {
		err = kerr.ErrorForCode(addResp.ErrorCode)
	}
	if err != nil {
		s.t.Fatalf("AddOffsetsToTxn: %v", err)
	}
	commit := kmsg.NewPtrTxnOffsetCommitRequest()
	commit.TransactionalID, commit.Group, commit.ProducerID, commit.ProducerEpoch = txnID, s.group, id, epoch
	commit.Generation = -1
	td, err := kadm.NewClient(cl).ListTopics(ctx, s.input)
	if err == nil {
		err = td.Error()
	}
	if err != nil {
		s.t.Fatal(err)
	}
	tp := kmsg.NewTxnOffsetCommitRequestTopic()
	tp.Topic, tp.TopicID = s.input, td[s.input].ID
	for p, o := range offsets {
		rp := kmsg.NewTxnOffsetCommitRequestTopicPartition()
		rp.Partition, rp.Offset = p, o
		tp.Partitions = append(tp.Partitions, rp)
	}
	commit.Topics = append(commit.Topics, tp)
	commitResp, err := commit.RequestWith(ctx, cl)
	if err != nil {
		s.t.Fatalf("TxnOffsetCommit: %v", err)
	}
	for _, rt := range commitResp.Topics {
		for _, rp := range rt.Partitions {
			if err := kerr.ErrorForCode(rp.ErrorCode); err != nil {
				s.t.Fatalf("TxnOffsetCommit %s/%d: %v", rt.Topic, rp.Partition, err)
			}
		}
	}
	ended := false
	end = func(c bool) {
		s.t.Helper()
		if ended {
			return
		}
		ended = true
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		req := kmsg.NewPtrEndTxnRequest()
		req.TransactionalID, req.ProducerID, req.ProducerEpoch, req.Commit = txnID, id, epoch, c
		resp, err := req.RequestWith(ctx, cl)
		if err == nil {
			err = kerr.ErrorForCode(resp.ErrorCode)
		}
		if err != nil {
			s.t.Errorf("EndTxn: %v", err)
		}
	}
	s.t.Cleanup(func() {
		end(false)
		cl.Close()
	})
	return end
}
