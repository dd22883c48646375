package testenv

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// HoldPartition leaves a transaction open on partition p of topic (as a
// producer that is not Meterline's and went away would) and has another
// producer commit three records after it: offset 0 of an empty partition
// is then the open transaction's record, 1-3 the committed ones and 4
// their marker, so the last stable offset stands at 0 with 5 records
// held past it. It returns the producer holding the transaction open
// (transactional id txID, timeout a minute) for the test to abort it;
// the transaction is aborted when the test ends otherwise. It waits for
// the commit marker: a broker writes it once EndTransaction has returned.
func HoldPartition(t testing.TB, brokers []string, topic string, p int32, txID string) *kgo.Client {
	t.Helper()
	ctx := context.Background()
	open := ManualProducer(t, brokers, topic, kgo.TransactionalID(txID), kgo.TransactionTimeout(time.Minute))
	if err := open.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	if err := open.ProduceSync(ctx, &kgo.Record{Partition: p, Value: []byte("open")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = open.EndTransaction(context.Background(), kgo.TryAbort) })
	other := ManualProducer(t, brokers, topic, kgo.TransactionalID(txID+"-other"))
	if err := other.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := other.ProduceSync(ctx, &kgo.Record{Partition: p, Value: []byte("committed")}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	if err := other.EndTransaction(ctx, kgo.TryCommit); err != nil {
		t.Fatal(err)
	}
	WaitPartitionEnd(t, kadm.NewClient(other).ListEndOffsets, topic, p, 5)
	return open
}

// WaitPartitionEnd waits up to 10 s for list (an end offset listing:
// high watermarks, or last stable offsets) to give want for partition p
// of topic.
func WaitPartitionEnd(t testing.TB, list func(context.Context, ...string) (kadm.ListedOffsets, error), topic string, p int32, want int64) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		offs, err := list(context.Background(), topic)
		if err != nil {
			t.Fatal(err)
		}
		if o, ok := offs.Lookup(topic, p); ok && o.Err == nil && o.Offset == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s[%d]: end offsets %v, want %d", topic, p, offs, want)
		}
	}
}

// ManualProducer returns a client producing to topic, each record to the
// partition it names, with opts; it is closed when the test ends.
func ManualProducer(t testing.TB, brokers []string, topic string, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.DefaultProduceTopic(topic)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}
