package stream

import (
	"context"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TestRestoreRevokedAtOpenTransactionThenReassigned: b's restores wait at
// the last stable offset of a previous owner's transaction open on both
// changelog partitions; c joins and takes one partition (b's restore of
// it is abandoned mid-wait; c's own waits), then leaves, and b restores
// that partition again, still waiting. The transaction then aborts: no
// record of it reaches either state, both restores end, and each input is
// counted once.
func TestRestoreRevokedAtOpenTransactionThenReassigned(t *testing.T) {
	t.Parallel()
	s := newSuite(t, nil, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	prev := s.openGhost(ctx, s.parts)
	s.send(20)

	fsB, fsC := vfs.NewMem(), vfs.NewMem()
	b := s.start("b", fsB)
	s.waitFor("b to restore both partitions up to the open transaction", func() bool {
		return len(partitionsRestoring(b.rt)) == 2
	})
	c := s.start("c", fsC)
	s.waitFor("c to take a partition from b and restore it up to the open transaction", func() bool {
		return len(partitionsRestoring(b.rt)) == 1 && len(partitionsRestoring(c.rt)) == 1
	})
	c.shutdown()
	s.waitFor("b to restore both partitions again", func() bool {
		return len(partitionsRestoring(b.rt)) == 2
	})
	if err := b.rt.Ready(); err == nil {
		t.Fatal("b is ready while the previous owner's transaction is open")
	}
	if err := prev.EndTransaction(ctx, kgo.TryAbort); err != nil {
		t.Fatal(err)
	}
	s.waitFor("b's restores to end once the transaction aborted", func() bool { return b.rt.Ready() == nil })
	s.caughtUp()
	s.finish(b, fsB)
}

// openGhost opens a transaction of a previous owner (its own transactional
// ID, a two-minute timeout) that writes b0=999 to changelog partitions
// 0 … parts-1, and leaves it open: were a restore to apply it, bucket b0
// would count on from 999. The caller ends it.
func (s *suite) openGhost(ctx context.Context, parts int32) *kgo.Client {
	s.t.Helper()
	prev, err := kgo.NewClient(kgo.SeedBrokers(s.brokers...), kgo.TransactionalID(s.group+"-previous"),
		kgo.TransactionTimeout(2*time.Minute), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(prev.Close)
	if err := prev.BeginTransaction(); err != nil {
		s.t.Fatal(err)
	}
	for p := range parts {
		if err := prev.ProduceSync(ctx, &kgo.Record{Topic: s.changelog, Partition: p, Key: []byte("b0"), Value: []byte("999")}).FirstErr(); err != nil {
			s.t.Fatal(err)
		}
	}
	return prev
}
