package cli

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/aggregator"
	"github.com/meterline/meterline/entitlements"
	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/schemas"
)

// TestEntitlementsGetSkipsStaleCopies: `entitlements get` shows the
// record the aggregator applies: a copy the aggregator re-produced again
// (its misrouted original read from the start by a new group) after a
// newer record of the customer is not the customer's entitlements.
func TestEntitlementsGetSkipsStaleCopies(t *testing.T) {
	_, brokers := testenv.KFake(t)
	names := testenv.Topics(t, brokers, "ent", testenv.TopicsOpts{})
	topic := names.EntitlementsTopic()
	key := schemas.CustomerKey("acme")
	canon := schemas.Partition(key, 4)
	cl := manualClient(t, brokers)
	value := func(limit int64) []byte { return entPlan(t, "acme", limit) }
	now := time.Now()
	copyOf := func(at time.Time) *kgo.Record {
		return &kgo.Record{Topic: topic, Partition: canon, Key: key, Value: value(5), Timestamp: at, Headers: []kgo.RecordHeader{
			{Key: aggregator.HeaderRerouted, Value: []byte(fmt.Sprintf("%d/0", (canon+1)%4))},
			{Key: aggregator.HeaderArrival, Value: []byte(fmt.Sprint(now.Add(-time.Hour).UnixMilli()))}}}
	}
	if err := cl.ProduceSync(context.Background(), copyOf(now.Add(-time.Hour+time.Second)),
		&kgo.Record{Topic: topic, Partition: canon, Key: key, Value: value(100), Timestamp: now.Add(-time.Minute)},
		copyOf(now)).FirstErr(); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := run(t, "", "entitlements", "get", "acme", "--brokers", strings.Join(brokers, ","), "--topic-prefix", names.Prefix)
	if code != 0 {
		t.Fatalf("get: %d\n%s\n%s", code, out, errOut)
	}
	d, err := entitlements.ParseDocument([]byte(out))
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if d.Caps["api_calls"].Limit.V != 100 {
		t.Errorf("get shows the cap %d, want 100 (the record after the first copy; the copy re-produced again is stale):\n%s",
			d.Caps["api_calls"].Limit.V, out)
	}
}
