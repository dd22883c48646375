package cli

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/aggregator"
)

// TestEntitlementsGetSkipsStaleCopies: `entitlements get` shows the
// record the aggregator applies: a copy the aggregator re-produced again
// (its misrouted original read from the start by a new group) after a
// newer record of the customer is not the customer's entitlements.
func TestEntitlementsGetSkipsStaleCopies(t *testing.T) {
	a := newAcmeTopic(t)
	value := func(limit int64) []byte { return entPlan(t, "acme", limit) }
	now := time.Now()
	copyOf := func(at time.Time) *kgo.Record {
		return &kgo.Record{Topic: a.topic, Partition: a.canon, Key: a.key, Value: value(5), Timestamp: at, Headers: []kgo.RecordHeader{
			{Key: aggregator.HeaderRerouted, Value: []byte(fmt.Sprintf("%d/0", (a.canon+1)%4))},
			{Key: aggregator.HeaderArrival, Value: []byte(fmt.Sprint(now.Add(-time.Hour).UnixMilli()))}}}
	}
	if err := a.cl.ProduceSync(context.Background(), copyOf(now.Add(-time.Hour+time.Second)),
		&kgo.Record{Topic: a.topic, Partition: a.canon, Key: a.key, Value: value(100), Timestamp: now.Add(-time.Minute)},
		copyOf(now)).FirstErr(); err != nil {
		t.Fatal(err)
	}
	if c, out := a.getCap(t); c != 100 {
		t.Errorf("get shows the cap %d, want 100 (the record after the first copy; the copy re-produced again is stale):\n%s", c, out)
	}
}
