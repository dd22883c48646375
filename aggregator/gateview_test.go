package aggregator_test

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/aggregator"
	"github.com/meterline/meterline/ingest"
)

// The quota gate's view of usage.balances, for the aggregator's tests of
// when the gate opens (aggregator.GateView): this file is of the external
// test package, which may import ingest (ingest imports aggregator).
func init() {
	aggregator.GateView = func(t testing.TB, brokers []string, topic string) func(customer string) (int64, bool) {
		t.Helper()
		b := ingest.NewBalances(topic, nil, nil)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			_ = b.Follow(ctx, kgo.SeedBrokers(brokers...))
		}()
		t.Cleanup(func() { cancel(); <-done })
		select {
		case <-b.Loaded():
		case <-time.After(20 * time.Second):
			t.Fatalf("the gate's view of %s is not loaded after 20s", topic)
		}
		return func(customer string) (int64, bool) {
			var rev int64
			if bal, _, ok := b.Lookup(customer); ok {
				rev = bal.Revision
			}
			_, ok := b.Trusted(customer, ingest.DefaultGateMaxAge)
			return rev, ok
		}
	}
}
