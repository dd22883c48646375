package stream

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/meterline/meterline/internal/testenv"
)

// TestStartOffsetAfterAbortedFirstRead: partition 0 of the second input
// topic, which the group has no committed offset of, starts with an
// aborted transaction (offsets 0-2), so kgo starts its reading at the
// first record it polls (3) while the partition's start is 0. The first
// transaction that reads it aborts (the group's TxnOffsetCommit answers
// CONCURRENT_TRANSACTIONS once, an abort without a session restart), and
// its records are not fetched again for a while (the partition paused,
// as a slow fetch would be). The punctuations meanwhile commit the start
// offset 0 with the state; kgo, told of that commit, still holds its
// position 3 and would commit it in the next transaction, which consumed
// nothing of the topic: the group's offset 3 against the state's 0, and
// the next restore stops on ErrOffsetMismatch. Every transaction must
// commit the state's offset of a topic it did not consume, and nothing of
// a partition it did not fence. Punctuations: the start is committed by
// punctuations (seqProc), and kgo's position offered with the next.
// OtherPartition: the start is committed with input of the first topic
// (countProc, whose punctuations do nothing), and kgo's position offered
// with a transaction that consumed only partition 1.
func TestStartOffsetAfterAbortedFirstRead(t *testing.T) {
	t.Parallel()
	t.Run("Punctuations", func(t *testing.T) {
		t.Parallel()
		startOffsetAfterAbortedFirstRead(t, false)
	})
	t.Run("OtherPartition", func(t *testing.T) {
		t.Parallel()
		startOffsetAfterAbortedFirstRead(t, true)
	})
}

func startOffsetAfterAbortedFirstRead(t *testing.T, otherPartition bool) {
	s := newSuite(t, nil, nil, true)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	txp, err := kgo.NewClient(kgo.SeedBrokers(s.brokers...), kgo.TransactionalID(testenv.Name(t, "txp")),
		kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer txp.Close()
	if err := txp.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{"gone1", "gone2"} {
		if err := txp.ProduceSync(ctx, &kgo.Record{Topic: s.extra, Partition: 0, Key: []byte("xb0"), Value: []byte(v)}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	if err := txp.EndTransaction(ctx, kgo.TryAbort); err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	s.sent[0] = append(s.sent[0], input{id: "kept", bucket: "xb0", extra: true})
	s.mu.Unlock()
	s.produce(&kgo.Record{Topic: s.extra, Partition: 0, Key: []byte("xb0"), Value: []byte("kept")})

	var a *instance
	var refused atomic.Bool
	s.cluster.ControlKey(kmsg.TxnOffsetCommit.Int16(), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		s.cluster.KeepControl()
		req := kreq.(*kmsg.TxnOffsetCommitRequest)
		// Only the second topic's partition 0 has records (offset 3,
		// read up to 4); the request may name its topics by ID.
		reads := false
		for _, rt := range req.Topics {
			for _, rp := range rt.Partitions {
				reads = reads || rp.Partition == 0 && rp.Offset == 4
			}
		}
		if !reads || refused.Load() {
			return nil, nil, false
		}
		refused.Store(true)
		a.rt.sess.Client().PauseFetchPartitions(map[string][]int32{s.extra: {0}})
		return testenv.RefuseTxnOffsetCommit(kreq, kerr.ConcurrentTransactions.Code), nil, true
	})

	punct := func(c *Config) { c.PunctuateInterval = 10 * time.Millisecond }
	proc := func() Processor {
		if otherPartition {
			return &countProc{output: s.output}
		}
		return newSeqProc(s.output)
	}
	fs := vfs.NewMem()
	a = s.startProc("a", fs, proc(), punct)
	s.waitFor("the first read of the second topic's partition 0 to be refused", refused.Load)
	committed := func() float64 { return a.metric("meterline_stream_transactions_total", "outcome", "committed") }
	before := committed()
	if otherPartition {
		s.sendTo(0, "b0", "p0")
		s.waitFor("a to commit partition 0's input", func() bool { return committed() >= before+1 })
		s.sendTo(1, "b1", "p1")
		s.waitFor("a to commit partition 1's input", func() bool { return committed() >= before+2 })
	} else {
		s.waitFor("a to commit punctuations", func() bool { return committed() >= before+5 })
	}
	a.shutdown()
	got, err := testenv.Committed(ctx, s.brokers, s.group, s.extra)
	if err != nil {
		t.Fatal(err)
	}
	if o := got[0]; o != 0 {
		t.Errorf("%s/0: the group committed %d, a record it never consumed in a committed transaction; the state says 0 (its start)", s.extra, o)
	}

	a = s.startProc("a", fs, proc(), punct)
	s.waitFor("a to own both partitions again", func() bool { return a.owned() == 2 })
	s.caughtUp()
	a.shutdown()
	if !otherPartition {
		s.checkSeqOnce()
	}
}
