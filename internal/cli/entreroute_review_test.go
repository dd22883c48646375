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

// TestEntitlementsGetDecidesAsTheAggregator: a copy claiming the origin of
// the record in effect with a greater value (headers a client wrote) is
// what the aggregator applies (aggregator.DecideRecord), and so what
// `entitlements get` shows.
func TestEntitlementsGetDecidesAsTheAggregator(t *testing.T) {
	_, brokers := testenv.KFake(t)
	names := testenv.Topics(t, brokers, "ent", testenv.TopicsOpts{})
	topic := names.EntitlementsTopic()
	key := schemas.CustomerKey("acme")
	canon := schemas.Partition(key, 4)
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	value := func(limit int64) []byte {
		v, err := schemas.Encode(&schemas.Entitlements{CustomerID: "acme", Plan: fmt.Sprint("cap-", limit),
			Overdraft: schemas.Overdraft{Policy: schemas.OverdraftAllow},
			Caps:      []schemas.Cap{{Meter: "api_calls", Limit: limit, OnLimit: schemas.OnLimitReject}}})
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	if string(value(100)) <= string(value(5)) {
		t.Fatal("the test wants the value of cap 100 to sort after cap 5's")
	}
	res := cl.ProduceSync(context.Background(), &kgo.Record{Topic: topic, Partition: canon, Key: key, Value: value(5), Timestamp: time.Now()})
	first, err := res.First()
	if err != nil {
		t.Fatal(err)
	}
	if err := cl.ProduceSync(context.Background(), &kgo.Record{Topic: topic, Partition: canon, Key: key, Value: value(100), Timestamp: time.Now(),
		Headers: []kgo.RecordHeader{
			{Key: aggregator.HeaderRerouted, Value: fmt.Appendf(nil, "%d/%d", first.Partition, first.Offset)},
			{Key: aggregator.HeaderArrival, Value: fmt.Append(nil, first.Timestamp.UnixMilli())}}}).FirstErr(); err != nil {
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
		t.Errorf("get shows the cap %d, want 100 (the greater value at the origin of the record in effect):\n%s", d.Caps["api_calls"].Limit.V, out)
	}
}
