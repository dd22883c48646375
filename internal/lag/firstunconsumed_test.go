package lag

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/internal/testenv"
)

// realTopic creates a topic of two partitions on the real broker and
// names a group for it.
func realTopic(t *testing.T) (brokers []string, topic, group string, adm *kadm.Client) {
	brokers = testenv.RealKafka(t)
	topic, group = testenv.Name(t, "lag"), testenv.Name(t, "group")
	testenv.CreateTopic(t, brokers, topic, 2, nil)
	return brokers, topic, group, testenv.Admin(t, brokers)
}

// commitAt commits group's offsets of topic: offsets[p] for partition p.
func commitAt(t *testing.T, adm *kadm.Client, group, topic string, offsets ...int64) {
	t.Helper()
	var offs kadm.Offsets
	for p, o := range offsets {
		offs.AddOffset(topic, int32(p), o, -1)
	}
	if _, err := adm.CommitOffsets(context.Background(), group, offs); err != nil {
		t.Fatal(err)
	}
}

// TestLagAbortedBeforeOpenTransaction: everything between a group's
// committed offset and the last stable offset is an aborted transaction's
// records, whose abort marker came after another producer opened a
// transaction on the partition (a stage instance that crashed mid-
// transaction and was fenced while another instance's transaction was
// open). A read_committed fetch from the committed offset returns no
// record, so the partition is not behind (docs/operations.md, Lag), and
// the lag of the group, and of every other group, is computed at once
// rather than failing after the read's timeout.
func TestLagAbortedBeforeOpenTransaction(t *testing.T) {
	brokers, topic, group, adm := realTopic(t)
	ctx := context.Background()

	txn := func(id string) *kgo.Client {
		cl := testenv.ManualProducer(t, brokers, topic, kgo.TransactionalID(group+"-"+id))
		if err := cl.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		return cl
	}
	// Offset 0: A's record; offset 1: B's, whose transaction stays open;
	// offset 2: A's abort marker. The last stable offset is 1.
	a, b := txn("a"), txn("b")
	if err := a.ProduceSync(ctx, &kgo.Record{Partition: 0, Value: []byte("aborted")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	if err := b.ProduceSync(ctx, &kgo.Record{Partition: 0, Value: []byte("open")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	if err := a.EndTransaction(ctx, kgo.TryAbort); err != nil {
		t.Fatal(err)
	}
	commitAt(t, adm, group, topic, 0, 0)

	start := time.Now()
	rows := compute(t, brokers, group)
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("lag took %s", took)
	}
	if r := rows[0]; r.End != 1 || r.Records != 0 || r.Behind != 0 {
		t.Errorf("partition 0 (only an aborted record before the open transaction): %+v, want end 1 and not behind", r)
	}
	if err := b.EndTransaction(ctx, kgo.TryCommit); err != nil {
		t.Fatal(err)
	}
	// B committed: its record is the first one the group has not consumed.
	if r := compute(t, brokers, group)[0]; r.End != 4 || r.Records != 4 || r.Behind <= 0 {
		t.Errorf("partition 0 after the open transaction committed: %+v, want end 4 and 4 records behind", r)
	}
}

// TestLagCommittedBelowLogStart: records the group has not consumed were
// deleted (retention, DeleteRecords): its lag counts from its committed
// offset, and its age is the first record still there, where the stage
// reads from.
func TestLagCommittedBelowLogStart(t *testing.T) {
	brokers, topic, group, adm := realTopic(t)
	ctx := context.Background()
	pcl := testenv.ManualProducer(t, brokers, topic)
	for i := 0; i < 10; i++ {
		if err := pcl.ProduceSync(ctx, &kgo.Record{Partition: 1, Value: []byte("x")}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	var del kadm.Offsets
	del.AddOffset(topic, 1, 6, -1)
	if _, err := adm.DeleteRecords(ctx, del); err != nil {
		t.Fatal(err)
	}
	commitAt(t, adm, group, topic, 0, 2)
	if r := compute(t, brokers, group)[1]; r.End != 10 || r.Records != 8 || r.Behind <= 0 {
		t.Errorf("partition 1: %+v, want 8 records behind", r)
	}
}

// TestLagBigBatchBehindAnotherPartition: the first record a group has not
// consumed on a partition is in a batch larger than a partition's share
// of a fetch, and another partition of the same leader comes first in
// the fetch: the partition is still behind (a fetch that returns no
// whole batch of it is no answer).
func TestLagBigBatchBehindAnotherPartition(t *testing.T) {
	brokers, topic, group, adm := realTopic(t)
	ctx := context.Background()
	pcl := testenv.ManualProducer(t, brokers, topic, kgo.ProducerBatchCompression(kgo.NoCompression()))
	if err := pcl.ProduceSync(ctx, &kgo.Record{Partition: 0, Value: []byte("small")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	big := make([]byte, 200<<10)
	if err := pcl.ProduceSync(ctx, &kgo.Record{Partition: 1, Value: big}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	commitAt(t, adm, group, topic, 0, 0)
	rows := compute(t, brokers, group)
	for p := int32(0); p < 2; p++ {
		if r := rows[p]; r.End != 1 || r.Records != 1 || r.Behind <= 0 {
			t.Errorf("partition %d: %+v, want 1 record behind", p, r)
		}
	}
}
