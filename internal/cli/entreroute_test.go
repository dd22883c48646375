package cli

import (
	"context"
	"fmt"
	"strings"
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

// TestEntitlementsGetSkipsMovedMark: the delete the aggregator writes
// after a record it moved, on the partition where it found it
// (aggregator.HeaderMoved), is not a delete of the customer: `get` shows
// the copy on the customer's partition and notes the misrouted record
// itself, not the delete after it.
func TestEntitlementsGetSkipsMovedMark(t *testing.T) {
	a := newAcmeTopic(t)
	wrong := (a.canon + 1) % 4
	ctx := context.Background()
	orig := &kgo.Record{Topic: a.topic, Partition: wrong, Key: a.key, Value: entPlan(t, "acme", 5), Timestamp: time.Now().Add(-time.Minute)}
	if err := a.cl.ProduceSync(ctx, orig).FirstErr(); err != nil {
		t.Fatal(err)
	}
	if err := a.cl.ProduceSync(ctx,
		&kgo.Record{Topic: a.topic, Partition: a.canon, Key: a.key, Value: orig.Value, Timestamp: time.Now(), Headers: originHeaders(orig)},
		&kgo.Record{Topic: a.topic, Partition: wrong, Key: a.key, Timestamp: time.Now(),
			Headers: []kgo.RecordHeader{{Key: aggregator.HeaderMoved, Value: fmt.Append(nil, orig.Offset)}}}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := run(t, "", "entitlements", "get", "acme", "--brokers", strings.Join(a.brokers, ","), "--topic-prefix", a.prefix)
	if code != 0 {
		t.Fatalf("get acme: %d\n%s\n%s", code, out, errOut)
	}
	if c := capOf(t, out); c != 5 {
		t.Errorf("get shows the cap %d, want 5 (the copy of the moved record):\n%s", c, out)
	}
	if want := fmt.Sprintf("partition %d holds a record of acme at offset %d,", wrong, orig.Offset); !strings.Contains(errOut, want) {
		t.Errorf("get's note %q does not say %q", errOut, want)
	}
}

// TestEntitlementsGetMovedMarkOnOwnPartitionDeletes: a delete marked
// moved (aggregator.HeaderMoved) on the customer's own partition is no
// mark of the aggregator's (it writes them on wrong partitions only): a
// client wrote it, and it deletes the customer, as the aggregator
// decides.
func TestEntitlementsGetMovedMarkOnOwnPartitionDeletes(t *testing.T) {
	a := newAcmeTopic(t)
	ctx := context.Background()
	plan := &kgo.Record{Topic: a.topic, Partition: a.canon, Key: a.key, Value: entPlan(t, "acme", 5), Timestamp: time.Now().Add(-time.Minute)}
	if err := a.cl.ProduceSync(ctx, plan).FirstErr(); err != nil {
		t.Fatal(err)
	}
	if err := a.cl.ProduceSync(ctx, &kgo.Record{Topic: a.topic, Partition: a.canon, Key: a.key, Timestamp: time.Now(),
		Headers: []kgo.RecordHeader{{Key: aggregator.HeaderMoved, Value: fmt.Append(nil, plan.Offset)}}}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := run(t, "", "entitlements", "get", "acme", "--brokers", strings.Join(a.brokers, ","), "--topic-prefix", a.prefix)
	if code != 1 || !strings.Contains(errOut, "the entitlements of acme were deleted at") {
		t.Errorf("get acme after a delete marked moved on its own partition: exit %d, want 1 and %q\n%s\n%s",
			code, "the entitlements of acme were deleted at", out, errOut)
	}
}
