package stream

import (
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
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
