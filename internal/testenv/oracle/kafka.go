package oracle

import (
	"strings"
	"testing"
	"time"

	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/internal/topics"
	"github.com/meterline/meterline/schemas"
)

// Read reads the aggregator's outputs from the topics (read_committed, up
// to the high watermarks read now).
func Read(t testing.TB, brokers []string, names topics.Names) Outputs {
	t.Helper()
	out := read(t, brokers, names)
	out.Rejected = len(testenv.ReadAll(t, brokers, names.RejectedTopic()))
	return out
}

// read is Read without usage.rejected: what Verify polls.
func read(t testing.TB, brokers []string, names topics.Names) Outputs {
	t.Helper()
	var out Outputs
	for _, r := range testenv.ReadAll(t, brokers, names.AggregatesTopic()) {
		var a schemas.Aggregate
		if err := schemas.DecodeInto(r.Value, &a); err != nil {
			t.Fatalf("%s %d/%d: %v", names.AggregatesTopic(), r.Partition, r.Offset, err)
		}
		out.Aggregates = append(out.Aggregates, &a)
	}
	for _, r := range testenv.ReadAll(t, brokers, names.AdjustmentsTopic()) {
		var a schemas.Adjustment
		if err := schemas.DecodeInto(r.Value, &a); err != nil {
			t.Fatalf("%s %d/%d: %v", names.AdjustmentsTopic(), r.Partition, r.Offset, err)
		}
		out.Adjustments = append(out.Adjustments, &a)
	}
	return out
}

// AwaitTimeout bounds Verify's wait for the outputs to be complete.
const AwaitTimeout = 2 * time.Minute

// Verify waits until the outputs in the topics are complete for the
// events (Bill.Complete; at most AwaitTimeout: then Check says what is
// missing), checks them against the model's bill, and fails the test with
// every problem found. The events are every event produced to
// usage.deduped, in production order.
func Verify(t testing.TB, brokers []string, names topics.Names, m *Model, events []*Event) Report {
	t.Helper()
	b := m.Bill(events)
	deadline := time.Now().Add(AwaitTimeout)
	for out := read(t, brokers, names); !b.Complete(out); out = read(t, brokers, names) {
		if time.Now().After(deadline) {
			t.Logf("after %s the outputs are still incomplete", AwaitTimeout)
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	rep := b.Check(Read(t, brokers, names))
	if len(rep.Problems) > 0 {
		t.Fatalf("the outputs disagree with the model of docs/design.md (Time) (%d events):\n  %s", len(events), strings.Join(rep.Problems, "\n  "))
	}
	t.Logf("the model agrees: %d events, %d keys, %d FINAL (one each), %d OPEN revisions, %d adjustments",
		len(events), rep.Keys, rep.Finals, rep.OpenRevisions, rep.Adjustments)
	return rep
}
