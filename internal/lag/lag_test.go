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

// TestLagSeedBrokerSilent: the seed brokers name a broker that no longer
// answers (paused, its host cut off) while the cluster runs on without
// it. Lag is read from the brokers the cluster lists, never from a seed
// the cluster has dropped, so a partition behind still has its row, and
// the stages' lag series do not vanish while a broker is down
// (docs/operations.md, Lag); Compute asks every seed at once which
// brokers the cluster lists, and is as quick.
func TestLagSeedBrokerSilent(t *testing.T) {
	_, brokers := testenv.KFake(t)
	ctx := context.Background()
	topic := testenv.Name(t, "lag")
	group := testenv.Name(t, "group")
	testenv.CreateTopic(t, brokers, topic, 1, nil)
	pcl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(topic))
	if err != nil {
		t.Fatal(err)
	}
	defer pcl.Close()
	for i := 0; i < 5; i++ {
		if err := pcl.ProduceSync(ctx, &kgo.Record{Value: []byte("x")}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	var offs kadm.Offsets
	offs.AddOffset(topic, 0, 1, -1)
	if _, err := kadm.NewClient(pcl).CommitOffsets(ctx, group, offs); err != nil {
		t.Fatal(err)
	}

	// The collector's long-lived client (here pcl) knows the cluster; the
	// seeds it was given hold only the silent broker.
	conn := kafka.Config{Brokers: []string{testenv.SilentBroker(t)}}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	rows, err := computeWith(cctx, pcl, conn, []string{group}, nil, time.Now().Add(time.Second), true)
	if err != nil {
		t.Fatalf("lag not computed with a silent seed broker: %v", err)
	}
	if len(rows) != 1 || rows[0].Records != 4 || rows[0].Behind <= 0 {
		t.Fatalf("rows %+v, want partition 0 four records behind", rows)
	}

	// Compute, `meterline lag`'s computation, starts from the seeds with
	// a new client: with four silent seeds of five, a client left to
	// pick a seed for its first request picks a silent one four times in
	// five, and waits for its request timeout (10 s).
	seeds := []string{testenv.SilentBroker(t), testenv.SilentBroker(t), brokers[0], testenv.SilentBroker(t), testenv.SilentBroker(t)}
	for range 3 {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		rows, err := Compute(cctx, kafka.Config{Brokers: seeds}, []string{group}, time.Now().Add(time.Second))
		cancel()
		if err != nil {
			t.Fatalf("Compute with silent seed brokers: %v", err)
		}
		if len(rows) != 1 || rows[0].Records != 4 {
			t.Fatalf("Compute with silent seed brokers: rows %+v, want partition 0 four records behind", rows)
		}
	}
}
