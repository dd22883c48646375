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
	a := newAcmeTopic(t)
	value := func(limit int64) []byte { return entPlan(t, "acme", limit) }
	if string(value(100)) <= string(value(5)) {
		t.Fatal("the test wants the value of cap 100 to sort after cap 5's")
	}
	res := a.cl.ProduceSync(context.Background(), &kgo.Record{Topic: a.topic, Partition: a.canon, Key: a.key, Value: value(5), Timestamp: time.Now()})
	first, err := res.First()
	if err != nil {
		t.Fatal(err)
	}
	if err := a.cl.ProduceSync(context.Background(), &kgo.Record{Topic: a.topic, Partition: a.canon, Key: a.key, Value: value(100), Timestamp: time.Now(),
		Headers: originHeaders(first)}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	if c, out := a.getCap(t); c != 100 {
		t.Errorf("get shows the cap %d, want 100 (the greater value at the origin of the record in effect):\n%s", c, out)
	}
}

// acmeTopic is a kfake cluster with the entitlements topic of prefix
// "ent" (4 partitions), acme's key and canonical partition in it, and a
// client that writes each record to the partition it names.
type acmeTopic struct {
	brokers []string
	prefix  string
	topic   string
	key     []byte
	canon   int32
	cl      *kgo.Client
}

func newAcmeTopic(t *testing.T) *acmeTopic {
	_, brokers := testenv.KFake(t)
	names := testenv.Topics(t, brokers, "ent", testenv.TopicsOpts{})
	key := schemas.CustomerKey("acme")
	return &acmeTopic{brokers: brokers, prefix: names.Prefix, topic: names.EntitlementsTopic(), key: key,
		canon: schemas.Partition(key, 4), cl: manualClient(t, brokers)}
}

// getCap runs `entitlements get` of acme (args: others, such as
// --default) and returns the api_calls cap it shows and what it printed.
func (a *acmeTopic) getCap(t *testing.T, args ...string) (int64, string) {
	t.Helper()
	if len(args) == 0 {
		args = []string{"acme"}
	}
	what := "get " + strings.Join(args, " ")
	code, out, errOut := run(t, "", append(append([]string{"entitlements", "get"}, args...),
		"--brokers", strings.Join(a.brokers, ","), "--topic-prefix", a.prefix)...)
	if code != 0 {
		t.Fatalf("%s: %d\n%s\n%s", what, code, out, errOut)
	}
	return capOf(t, out), out
}

// originHeaders are the re-route headers of a copy of r: its partition,
// offset and broker time.
func originHeaders(r *kgo.Record) []kgo.RecordHeader {
	return []kgo.RecordHeader{
		{Key: aggregator.HeaderRerouted, Value: fmt.Appendf(nil, "%d/%d", r.Partition, r.Offset)},
		{Key: aggregator.HeaderArrival, Value: fmt.Append(nil, r.Timestamp.UnixMilli())}}
}

// entPlan is the encoded Entitlements record of customer (empty: the
// default plan) with one cap of limit on api_calls.
func entPlan(t *testing.T, customer string, limit int64) []byte {
	t.Helper()
	v, err := schemas.Encode(&schemas.Entitlements{CustomerID: customer, Plan: fmt.Sprint("cap-", limit),
		Overdraft: schemas.Overdraft{Policy: schemas.OverdraftAllow},
		Caps:      []schemas.Cap{{Meter: "api_calls", Limit: limit, OnLimit: schemas.OnLimitReject}}})
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// manualClient is a client of brokers that writes each record to the
// partition it names.
func manualClient(t *testing.T, brokers []string) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// capOf parses a document `entitlements get` (or one of `list`) printed
// and returns its api_calls cap.
func capOf(t *testing.T, doc string) int64 {
	t.Helper()
	d, err := entitlements.ParseDocument([]byte(doc))
	if err != nil {
		t.Fatalf("%v\n%s", err, doc)
	}
	return d.Caps["api_calls"].Limit.V
}

// TestEntitlementsGetSkipsRejectedRecords: a customer's record the
// aggregator rejects on its canonical partition (undecodable, or invalid:
// entitlements.ParseRecord) leaves the record before it in effect, and
// the aggregator restates that record after it (restateRejected).
// `entitlements get` and `list` show the record in effect, whether the
// restated copy follows the rejected record yet or not.
func TestEntitlementsGetSkipsRejectedRecords(t *testing.T) {
	_, brokers := testenv.KFake(t)
	cl := manualClient(t, brokers)
	bad := map[string][]byte{
		"undecodable":    []byte("not a record"),
		"wrong customer": entPlan(t, "globex", 7),
	}
	for name, x := range bad {
		for _, restated := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/restated=%v", name, restated), func(t *testing.T) {
				names := testenv.Topics(t, brokers, "ent", testenv.TopicsOpts{})
				topic := names.EntitlementsTopic()
				key := schemas.CustomerKey("acme")
				canon := schemas.Partition(key, 4)
				ctx := context.Background()
				v, err := cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Partition: canon, Key: key, Value: entPlan(t, "acme", 5), Timestamp: time.Now()}).First()
				if err != nil {
					t.Fatal(err)
				}
				if _, err := entitlements.ParseRecord(key, x, 0); err == nil {
					t.Fatal("the rejected record parses")
				}
				recs := []*kgo.Record{{Topic: topic, Partition: canon, Key: key, Value: x, Timestamp: time.Now()}}
				if restated {
					// What the aggregator writes after it: the record in
					// effect, marked with its origin.
					recs = append(recs, &kgo.Record{Topic: topic, Partition: canon, Key: key, Value: v.Value, Timestamp: time.Now(),
						Headers: originHeaders(v)})
				}
				if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
					t.Fatal(err)
				}
				flags := []string{"--brokers", strings.Join(brokers, ","), "--topic-prefix", names.Prefix}
				code, out, errOut := run(t, "", append([]string{"entitlements", "get", "acme"}, flags...)...)
				if code != 0 {
					t.Fatalf("get: %d, want the record in effect (cap 5)\n%s\n%s", code, out, errOut)
				}
				if c := capOf(t, out); c != 5 {
					t.Errorf("get shows the cap %d, want 5 (the record in effect)\n%s", c, out)
				}
				code, out, errOut = run(t, "", append([]string{"entitlements", "list"}, flags...)...)
				if code != 0 || strings.Contains(errOut, "offset") || strings.Count(out, "customer:") != 1 {
					t.Fatalf("list: %d, want acme's record in effect alone\n%s\n%s", code, out, errOut)
				}
				if c := capOf(t, out); c != 5 {
					t.Errorf("list shows the cap %d, want 5 (the record in effect)\n%s", c, out)
				}
			})
		}
	}
}

// TestEntitlementsGetReservedKeysDecidedByOrigin: the aggregator decides
// the records of a reserved key (the default plan, the rate card) as a
// customer's, by aggregator.DecideRecord, for it restates them after a
// record it rejects. A default plan written with forged re-route headers
// claiming an origin before the one in effect is a stale copy, not
// applied, and `entitlements get --default` shows the one in effect.
func TestEntitlementsGetReservedKeysDecidedByOrigin(t *testing.T) {
	a := newAcmeTopic(t)
	key := []byte(schemas.DefaultPlanKey)
	ctx := context.Background()
	for p := int32(0); p < 4; p++ {
		if err := a.cl.ProduceSync(ctx, &kgo.Record{Topic: a.topic, Partition: p, Key: key, Value: entPlan(t, "", 5), Timestamp: time.Now()}).FirstErr(); err != nil {
			t.Fatal(err)
		}
		if err := a.cl.ProduceSync(ctx, &kgo.Record{Topic: a.topic, Partition: p, Key: key, Value: entPlan(t, "", 9), Timestamp: time.Now(),
			Headers: []kgo.RecordHeader{
				{Key: aggregator.HeaderRerouted, Value: []byte("9/999")},
				{Key: aggregator.HeaderArrival, Value: []byte("1")}}}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	if c, out := a.getCap(t, "--default"); c != 5 {
		t.Errorf("get --default shows the cap %d, want 5 (the record in effect: the aggregator skips the stale copy)\n%s", c, out)
	}
}
