package dedup

import (
	"errors"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meterline/meterline/internal/stream"
)

// TestOpenPartitionBeyondCount: partitions added to usage.events (and to
// its changelog) while dedup runs reach a running instance at a rebalance.
// It read the partition count when it started, and a new partition's
// state would record the old count, its events all be re-routed by the
// old count and its watermarks name the old count: dedup must stop there,
// as it does when started again, instead of running on.
func TestOpenPartitionBeyondCount(t *testing.T) {
	pr := localProcessorOf(t, Config{}, prometheus.NewRegistry(), partitionCountsT{events: 2, deduped: 2, duplicates: 2, rejected: 2})
	for p := int32(0); p < 2; p++ {
		l, err := stream.NewLocal(pr, p, pr.eventsTopic)
		if err != nil {
			t.Fatalf("open partition %d of 2: %v", p, err)
		}
		_ = l.Close()
	}
	l, err := stream.NewLocal(pr, 2, pr.eventsTopic)
	if err == nil {
		_ = l.Close()
		t.Fatal("partition 2 of a dedup started with 2 partitions opened")
	}
	if !errors.Is(err, ErrPartitionCountChanged) {
		t.Fatalf("open partition 2 = %v, want ErrPartitionCountChanged", err)
	}
	t.Log(err)
}
