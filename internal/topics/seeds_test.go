package topics_test

import (
	"context"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/meterline/meterline/internal/kafka"
	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/internal/topics"
)

// TestStartChecksSeedBrokerSilent: a stage's checks at start (the
// partition counts, the changelog's configs) with four of five seed
// brokers accepting connections and never answering (paused, their hosts
// cut off, while the cluster runs on without them) answer well under the
// request timeout (10 s) each of their requests waited whenever it
// picked a silent seed (docs/operations.md, Standby replicas).
func TestStartChecksSeedBrokerSilent(t *testing.T) {
	_, brokers := testenv.KFake(t)
	topic := testenv.Name(t, "changelog")
	compact := "compact"
	testenv.CreateTopic(t, brokers, topic, 3, map[string]*string{"cleanup.policy": &compact})
	conn := kafka.Config{Brokers: []string{testenv.SilentBroker(t), testenv.SilentBroker(t), brokers[0],
		testenv.SilentBroker(t), testenv.SilentBroker(t)}}
	core, logs := observer.New(zap.WarnLevel)
	for i := range 3 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		n, err := topics.PartitionCounts(ctx, conn, topic)
		if err != nil || n[topic] != 3 {
			t.Fatalf("check %d: partition counts with silent seeds: %v, %v; want 3 partitions", i, n, err)
		}
		if err := topics.CheckChangelogKeeps(ctx, conn, "dedup", zap.New(core), topic, time.Hour); err != nil || logs.Len() > 0 {
			t.Fatalf("check %d: the changelog's configs with silent seeds: %v %v", i, err, logs.All())
		}
		cancel()
	}
}
