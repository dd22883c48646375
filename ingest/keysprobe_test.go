package ingest

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/internal/testenv"
)

// TestTinyAuthMaxAgeFollows: an --auth-max-age of a few nanoseconds (a
// quarter of it is 0) still gives the keys' probe a positive interval:
// Follow's tickers panicked on a zero interval and took the ingest down
// at start.
func TestTinyAuthMaxAgeFollows(t *testing.T) {
	const topic = "meterline.keys"
	_, brokers := testenv.KFake(t, kfake.SeedTopics(1, topic))
	for _, d := range []time.Duration{1, 3, 4} {
		keys := NewKeys(topic, nil)
		keys.SetMaxAge(d)
		if keys.probe <= 0 {
			t.Fatalf("max age %v: probe interval %v", d, keys.probe)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		err := keys.Follow(ctx, kgo.SeedBrokers(brokers...))
		cancel()
		if ctx.Err() == nil {
			t.Fatalf("max age %v: Follow ended before its context: %v", d, err)
		}
	}
}
