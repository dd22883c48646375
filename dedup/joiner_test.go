package dedup

import (
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/schemas"
)

// TestStrayJoinerRejected: a zero-width joiner or non-joiner that joins
// nothing (alone, at an end, in a Latin word) only hides, as the soft
// hyphen does: "acme-1\u200d" shows as "acme-1" in every table, and a
// lone joiner as nothing. A producer writing usage.events directly gets
// the event parked as invalid, naming the field (docs/design.md, Event
// identity and keys); the same identity without the joiner, or a joiner
// in an emoji sequence, is forwarded.
func TestStrayJoinerRejected(t *testing.T) {
	h := newRecordHarness(t)
	defer h.close()
	ids := []struct {
		customer, event string
		reject          bool
	}{
		{"acme-1", "req-1", false},
		{"acme-1\u200d", "req-1", true},
		{"\u200d", "req-1", true},
		{"acme", "req\u200c1", true},
		{"👩\u200d💻", "req-1", false},
	}
	for i, id := range ids {
		e := &schemas.UsageEvent{CustomerID: id.customer, Meter: "api", EventID: id.event, Quantity: 1, EventTime: frStart}
		key := e.Identity().Key()
		p := schemas.Partition(key, frEvents)
		if err := h.local(p).Process([]*kgo.Record{{Topic: h.pr.eventsTopic, Partition: p, Offset: int64(i), Key: key,
			Value: schemas.MustEncode(e), Timestamp: time.UnixMilli(frStart)}}); err != nil {
			t.Fatal(err)
		}
	}
	forwarded, rejected := map[string]bool{}, map[string]string{}
	for p := range int32(frEvents) {
		if err := h.local(p).Commit(); err != nil {
			t.Fatal(err)
		}
		for _, o := range h.local(p).TakeOutput() {
			switch o.Topic {
			case h.pr.dedupedTopic:
				var d schemas.DedupedEvent
				if schemas.DecodeInto(o.Value, &d) == nil {
					forwarded[d.CustomerID+"/"+d.EventID] = true
				}
			case h.pr.rejectedTopic:
				var r schemas.Rejected
				if err := schemas.DecodeInto(o.Value, &r); err != nil {
					t.Fatal(err)
				}
				rejected[r.CustomerID+"/"+r.EventID] = r.Reason + ": " + r.Detail
			}
		}
	}
	for _, id := range ids {
		k := id.customer + "/" + id.event
		switch {
		case id.reject && forwarded[k]:
			t.Errorf("%+q forwarded, want it rejected as invalid", k)
		case id.reject && !strings.HasPrefix(rejected[k], schemas.ReasonInvalid+": ") || id.reject && !strings.Contains(rejected[k], "joiner"):
			t.Errorf("%+q rejected %q, want invalid naming the joiner", k, rejected[k])
		case !id.reject && !forwarded[k]:
			t.Errorf("%+q not forwarded (rejected %q)", k, rejected[k])
		}
	}
}
