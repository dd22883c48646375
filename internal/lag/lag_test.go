package lag

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/internal/kafka"
	"github.com/meterline/meterline/internal/testenv"
)

// TestLag: a group whose stage is stopped while input keeps arriving shows
// the records and seconds it is behind; once it has consumed everything
// (committed at the end) it shows none, even on a transactional topic whose
// last offset is a commit marker.
func TestLag(t *testing.T) {
	t.Run("kfake", func(t *testing.T) {
		_, brokers := testenv.KFake(t)
		testLag(t, brokers)
	})
	t.Run("real-kafka", func(t *testing.T) {
		testLag(t, testenv.RealKafka(t))
	})
}

func testLag(t *testing.T, brokers []string) {
	ctx := context.Background()
	topic := testenv.Name(t, "lag")
	group := testenv.Name(t, "group")
	testenv.CreateTopic(t, brokers, topic, 2, nil)
	adm := testenv.Admin(t, brokers)

	// Partition 0: a transaction of 10 records (offsets 0-9, marker at 10).
	tcl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.TransactionalID(group+"-tx"),
		kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.DefaultProduceTopic(topic))
	if err != nil {
		t.Fatal(err)
	}
	defer tcl.Close()
	if err := tcl.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 10; i++ {
		if err := tcl.ProduceSync(ctx, &kgo.Record{Partition: 0, Value: []byte(fmt.Sprint(i))}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	if err := tcl.EndTransaction(ctx, kgo.TryCommit); err != nil {
		t.Fatal(err)
	}
	// The stage had consumed everything of partition 0: it committed the
	// offset after the last record, which is the marker's offset.
	var offs kadm.Offsets
	offs.AddOffset(topic, 0, 10, -1)
	offs.AddOffset(topic, 1, 0, -1)
	if _, err := adm.CommitOffsets(ctx, group, offs); err != nil {
		t.Fatal(err)
	}
	rows := compute(t, brokers, group)
	if r := rows[0]; r.Records != 0 || r.Behind != 0 {
		t.Fatalf("caught-up partition 0 shows lag %+v (a commit marker is not a record)", r)
	}

	// The stage is stopped; producers keep sending to partition 1.
	pcl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.DefaultProduceTopic(topic))
	if err != nil {
		t.Fatal(err)
	}
	defer pcl.Close()
	first := time.Now()
	for i := 0; i < 25; i++ {
		if err := pcl.ProduceSync(ctx, &kgo.Record{Partition: 1, Value: []byte("x")}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(1100 * time.Millisecond)
	rows = compute(t, brokers, group)
	r := rows[1]
	if r.Records != 25 || r.Committed != 0 || r.End != 25 {
		t.Fatalf("partition 1: %+v, want 25 records behind", r)
	}
	if r.Behind < time.Second || r.Behind > time.Since(first)+time.Second {
		t.Fatalf("partition 1 is %s behind, want about %s", r.Behind, time.Since(first))
	}
	for i := 0; i < 5; i++ {
		_ = pcl.ProduceSync(ctx, &kgo.Record{Partition: 1, Value: []byte("y")}).FirstErr()
	}
	if r := compute(t, brokers, group)[1]; r.Records != 30 {
		t.Fatalf("lag did not grow with the input: %+v", r)
	}
}

func compute(t *testing.T, brokers []string, group string) []Row {
	t.Helper()
	rows, err := Compute(context.Background(), kafka.Config{Brokers: brokers}, []string{group}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 2 {
		t.Fatalf("%d rows: %+v", len(rows), rows)
	}
	return rows
}
