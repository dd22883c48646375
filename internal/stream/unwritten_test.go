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
	s := newSuite(t, nil, nil)
	fs := vfs.NewMem()
	a := s.start("a", fs, func(c *Config, _ *countProc) { c.TransactionTimeout = 2 * time.Second })
	s.send(20)
	s.caughtUp()

	// The output's leaders are gone: produce requests answer
	// NOT_LEADER_FOR_PARTITION and the metadata kgo then asks for answers
	// LEADER_NOT_AVAILABLE, so the records wait unsent.
	gone := s.cluster.Fault(
		kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: s.output, Err: kerr.NotLeaderForPartition, Count: -1},
		kfake.Fault{Keys: []kmsg.Key{kmsg.Metadata}, Topic: s.output, Err: kerr.LeaderNotAvailable, Count: -1},
	)
	s.send(20)
	s.waitFor("a transaction to abort", func() bool {
		return a.metric("meterline_stream_transactions_total", "outcome", "aborted") >= 1
	})
	gone.Remove()
	s.waitFor("the session to be rebuilt for records_unwritten", func() bool {
		return a.metric("meterline_stream_session_restarts_total", "reason", "records_unwritten") >= 1
	})
	s.caughtUp()
	s.finish(a, fs)
}
