package lag

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/internal/kafka"
	"github.com/meterline/meterline/internal/testenv"
)

// TestCollectorHeldByOpenTransaction: a producer (not Meterline's) left
// a transaction open on partition 0 of a group's input, and committed
// records followed it from another producer. The last stable offset
// stands at the open transaction's first record, so the group is not
// behind (records behind 0, as before), but
// meterline_consumer_lag_held_records counts the records past it and
// meterline_consumer_lag_held_seconds grows with the collector's clock
// from the first computation that saw them. Once the transaction is
// aborted nothing is held: both are 0, and the group is behind by the
// records it can read now. Partition 1, untouched, holds nothing.
func TestCollectorHeldByOpenTransaction(t *testing.T) {
	t.Run("kfake", func(t *testing.T) {
		_, brokers := testenv.KFake(t)
		testCollectorHeld(t, brokers)
	})
	t.Run("real-kafka", func(t *testing.T) {
		testCollectorHeld(t, testenv.RealKafka(t))
	})
}

func testCollectorHeld(t *testing.T, brokers []string) {
	ctx := context.Background()
	topic, group := testenv.Name(t, "held"), testenv.Name(t, "group")
	testenv.CreateTopic(t, brokers, topic, 2, nil)

	// Offset 0: the open transaction's record; 1-3: another producer's
	// committed transaction; 4: its marker.
	open := testenv.HoldPartition(t, brokers, topic, 0, group+"-open")
	aborted := false
	defer func() {
		if !aborted {
			_ = open.EndTransaction(context.Background(), kgo.TryAbort)
		}
	}()

	clock := &fakeNow{t: time.Now()}
	c, err := NewCollector(kafka.Config{Brokers: brokers}, []string{group}, WithClock(clock.now), WithCacheTTL(5*time.Second),
		WithInputTopics(group, topic))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)

	type want struct{ records, held, heldSeconds float64 }
	check := func(stage string, w map[int32]want) {
		t.Helper()
		got := gather(t, reg)
		for p, w := range w {
			k := key{group, topic, p}
			g := want{got[MetricRecords][k], got[MetricHeldRecords][k], got[MetricHeldSeconds][k]}
			if g != w {
				t.Errorf("%s: partition %d: records behind, held, held seconds = %v, want %v", stage, p, g, w)
			}
		}
		if n := len(got[MetricHeldRecords]) + len(got[MetricHeldSeconds]); n != 4 {
			t.Errorf("%s: %d held series, want 4 (two metrics of two partitions): %v", stage, n, got)
		}
	}
	check("first scrape", map[int32]want{0: {0, 5, 0}, 1: {0, 0, 0}})
	clock.add(6 * time.Second)
	check("6 s later", map[int32]want{0: {0, 5, 6}, 1: {0, 0, 0}})
	clock.add(30 * time.Second)
	check("36 s later", map[int32]want{0: {0, 5, 36}, 1: {0, 0, 0}})

	if err := open.EndTransaction(ctx, kgo.TryAbort); err != nil {
		t.Fatal(err)
	}
	aborted = true
	// Offset 5: the abort marker, which a broker writes once
	// EndTransaction has returned. The group is then behind from offset 0
	// to the last stable offset, 6; nothing is held.
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		clock.add(6 * time.Second)
		if gather(t, reg)[MetricHeldRecords][key{group, topic, 0}] == 0 {
			break
		}
	}
	clock.add(6 * time.Second)
	check("aborted", map[int32]want{0: {6, 0, 0}, 1: {0, 0, 0}})
}
