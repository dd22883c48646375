package dedup

import (
	"maps"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/schemas"
)

// TestInvalidText: Avro strings can carry any bytes, so dedup checks the
// text of every event from any client (docs/design.md, Event identity and
// keys): invalid UTF-8 anywhere, and control characters (C0, DEL, C1),
// bidirectional controls and invisible characters in customer_id, meter,
// event_id and source, are rejected as invalid with the field named
// in the detail, and never merge with another identity.
func TestInvalidText(t *testing.T) {
	h := newHarness(t, nil, 4)
	arr := t0 + 10*day
	rec := func(e *schemas.UsageEvent) *kgo.Record {
		if e.Meter == "" {
			e.Meter = "api_calls"
		}
		e.Quantity, e.EventTime = 1, arr-hour
		key := e.Identity().Key()
		return &kgo.Record{Topic: h.names.EventsTopic(), Partition: schemas.Partition(key, h.n), Key: key,
			Value: schemas.MustEncode(e), Timestamp: time.UnixMilli(arr)}
	}
	bad := map[string]string{ // event_id → the field the detail must name
		"ff":        "customer_id",
		"fe":        "customer_id",
		"tab":       "customer_id",
		"nul":       "meter",
		"newline\n": "event_id",
		"src":       "source",
		"prop":      "properties.model",
		"del":       "customer_id",
		"nel":       "customer_id",
		"rlo":       "customer_id",
		"lri":       "source",
		"rlm":       "meter",
	}
	h.produce(
		rec(&schemas.UsageEvent{CustomerID: "acme", EventID: "ok"}),
		rec(&schemas.UsageEvent{CustomerID: "acme\uFFFD", EventID: "ok"}),
		rec(&schemas.UsageEvent{CustomerID: "acme\xff", EventID: "ff"}),
		rec(&schemas.UsageEvent{CustomerID: "acme\xfe", EventID: "fe"}),
		rec(&schemas.UsageEvent{CustomerID: "acme\t", EventID: "tab"}),
		rec(&schemas.UsageEvent{CustomerID: "acme", Meter: "api\x00calls", EventID: "nul"}),
		rec(&schemas.UsageEvent{CustomerID: "acme", EventID: "newline\n"}),
		rec(&schemas.UsageEvent{CustomerID: "acme", EventID: "src", Source: "gw\x1b"}),
		rec(&schemas.UsageEvent{CustomerID: "acme", EventID: "prop", Properties: []schemas.Property{{Name: "model", Value: "m\xc3"}}}),
		rec(&schemas.UsageEvent{CustomerID: "acme\x7f", EventID: "del"}),
		rec(&schemas.UsageEvent{CustomerID: "acme\u0085", EventID: "nel"}),
		rec(&schemas.UsageEvent{CustomerID: "acme\u202e1-", EventID: "rlo"}),
		rec(&schemas.UsageEvent{CustomerID: "acme", EventID: "lri", Source: "gw\u2066"}),
		rec(&schemas.UsageEvent{CustomerID: "acme", Meter: "api_calls\u200f", EventID: "rlm"}),
	)
	h.start(h.config("a", vfs.NewMem()))
	h.caughtUp()
	o := h.outputs()

	customers := map[string]bool{}
	for _, d := range o.deduped {
		customers[d.CustomerID] = true
	}
	if len(o.deduped) != 2 || !customers["acme"] || !customers["acme\uFFFD"] {
		t.Errorf("forwarded %d events for %v; want the two valid ones (acme, acme\\uFFFD)", len(o.deduped), customers)
	}
	if len(o.duplicates) != 0 {
		t.Errorf("%d duplicates; no two of these events share an identity", len(o.duplicates))
	}
	got := map[string]bool{}
	for _, r := range o.rejected {
		field, ok := bad[r.EventID]
		if !ok {
			t.Errorf("rejected %q: %s %s", r.EventID, r.Reason, r.Detail)
			continue
		}
		got[r.EventID] = true
		// Avro strings are UTF-8: the rejection names the identity with
		// U+FFFD for invalid bytes (the raw value keeps them).
		if !utf8.ValidString(r.CustomerID) || !utf8.ValidString(r.Meter) || !utf8.ValidString(r.Detail) {
			t.Errorf("event %q rejected with text that is not UTF-8: customer %q, meter %q, detail %q", r.EventID, r.CustomerID, r.Meter, r.Detail)
		}
		if r.Reason != schemas.ReasonInvalid || !strings.HasPrefix(r.Detail, field+": ") {
			t.Errorf("event %q rejected as %s %q; want invalid naming %s", r.EventID, r.Reason, r.Detail, field)
		}
	}
	for id := range bad {
		if !got[id] {
			t.Errorf("event %q was not rejected", id)
		}
	}
}

// TestBlankIdentityRejected: an identity field of white space only, in a
// record produced straight to Kafka, is rejected as invalid naming the
// field (docs/design.md, Event identity and keys): never forwarded as an
// identity every such event would share, never dropped as a copy. A valid
// event after them is forwarded.
func TestBlankIdentityRejected(t *testing.T) {
	h := newHarness(t, nil, 4)
	arr := t0 + 10*day
	rec := func(customer, meter, id string) *kgo.Record {
		e := &schemas.UsageEvent{CustomerID: customer, Meter: meter, EventID: id, Quantity: 1, EventTime: arr - hour}
		key := e.Identity().Key()
		return &kgo.Record{Topic: h.names.EventsTopic(), Partition: schemas.Partition(key, h.n), Key: key,
			Value: schemas.MustEncode(e), Timestamp: time.UnixMilli(arr)}
	}
	h.produce(
		rec("acme", "api_calls", "   "),
		rec("acme", "api_calls", "   "), // the same again: rejected too, not a duplicate
		rec("acme", "api_calls", "\u00a0\u3000"),
		rec(" ", "api_calls", "b1"),
		rec("acme", "\u2003", "b2"),
		rec("acme", "api_calls", " ok "),
	)
	h.start(h.config("a", vfs.NewMem()))
	h.caughtUp()
	o := h.outputs()
	if len(o.deduped) != 1 || o.deduped[0].EventID != " ok " {
		t.Errorf("forwarded %+v; want the one event whose identity is not blank", o.deduped)
	}
	if len(o.duplicates) != 0 {
		t.Errorf("%d duplicates; want none", len(o.duplicates))
	}
	want := map[string]int{"event_id": 3, "customer_id": 1, "meter": 1} // per field, in any order: partitions differ
	got := map[string]int{}
	for _, r := range o.rejected {
		field, ok := strings.CutSuffix(r.Detail, ": must not be blank (white space only)")
		if r.Reason != schemas.ReasonInvalid || !ok {
			t.Errorf("rejected %q as %s %q; want invalid, must not be blank", r.EventID, r.Reason, r.Detail)
		}
		got[field]++
	}
	if !maps.Equal(got, want) {
		t.Errorf("rejections per field %v, want %v", got, want)
	}
}
