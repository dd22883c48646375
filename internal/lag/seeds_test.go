package lag

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/internal/kafka"
	"github.com/meterline/meterline/internal/testenv"
)

// silentBroker accepts connections and never answers, as a broker whose
// process is paused or whose host is cut off does once the cluster has
// fenced it: it stays in every client's seed list.
func silentBroker(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var conns []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c)
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
		for _, c := range conns {
			c.Close()
		}
	})
	return ln.Addr().String()
}

// TestLagSeedBrokerSilent: the seed brokers name a broker that no longer
// answers (paused, its host cut off) while the cluster runs on without
// it. Lag is read from the brokers the cluster lists, never from a seed
// the cluster has dropped, so a partition behind still has its row, and
// the stages' lag series do not vanish while a broker is down
// (docs/operations.md, Lag).
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
	adm := testenv.Admin(t, brokers)
	var offs kadm.Offsets
	offs.AddOffset(topic, 0, 1, -1)
	if _, err := adm.CommitOffsets(ctx, group, offs); err != nil {
		t.Fatal(err)
	}

	// The collector's long-lived client knows the cluster; the seeds it
	// was given hold only the silent broker.
	conn := kafka.Config{Brokers: []string{silentBroker(t)}}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	rows, err := computeWith(cctx, adm, conn, []string{group}, nil, time.Now().Add(time.Second))
	if err != nil {
		t.Fatalf("lag not computed with a silent seed broker: %v", err)
	}
	if len(rows) != 1 || rows[0].Records != 4 || rows[0].Behind <= 0 {
		t.Fatalf("rows %+v, want partition 0 four records behind", rows)
	}
}
