package dedup

import (
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/schemas"
)

// TestRules feeds one stage every kind of record and checks where each one
// went: first copies, exact and conflicting copies, every rejection reason,
// and the window edges.
func TestRules(t *testing.T) {
	h := newHarness(t, nil, 4)
	W, S := 35*day, hour
	arr := t0 + 10*day

	first := h.event("acme", "api_calls", "e1", 5, arr-hour, arr)
	exact := h.event("acme", "api_calls", "e1", 5, arr-hour, arr+1000)
	qty := h.event("acme", "api_calls", "e1", 6, arr-hour, arr+2000)
	etime := h.event("acme", "api_calls", "e1", 5, arr-hour+1, arr+3000)
	other := h.event("acme", "api_calls", "e2", 1, arr-hour, arr)
	sameIDOtherMeter := h.event("acme", "tokens", "e1", 5, arr-hour, arr)

	atOld := h.event("acme", "api_calls", "edge-old", 1, arr-W, arr)       // == arrival − W: rejected
	justIn := h.event("acme", "api_calls", "edge-in", 1, arr-W+1, arr)     // accepted
	atSkew := h.event("acme", "api_calls", "edge-skew", 1, arr+S, arr)     // == arrival + S: accepted
	future := h.event("acme", "api_calls", "edge-future", 1, arr+S+1, arr) // rejected
	negative := h.event("acme", "api_calls", "neg", -1, arr-hour, arr)     // invalid
	emptyMeter := h.event("acme", "", "no-meter", 1, arr-hour, arr)        // invalid
	garbage := &kgo.Record{Topic: h.names.EventsTopic(), Partition: 1, Key: []byte("x"), Value: []byte("not avro"),
		Timestamp: time.UnixMilli(arr)}
	unknown := &kgo.Record{Topic: h.names.EventsTopic(), Partition: 2, Value: append([]byte{0xC3, 0x01, 1, 2, 3, 4, 5, 6, 7, 8}, 0),
		Timestamp: time.UnixMilli(arr)}
	huge := h.event("acme", "api_calls", "huge", 1, arr-hour, arr)
	huge.Value = append(huge.Value, make([]byte, schemas.MaxEventBytes)...)
	wrongType := &kgo.Record{Topic: h.names.EventsTopic(), Partition: 0, Value: schemas.MustEncode(&schemas.Watermark{}),
		Timestamp: time.UnixMilli(arr)}

	// Input that exists before the first start is read from the earliest
	// offset (docs/design.md, Exactly-once, 6).
	h.produce(first)
	h.start(h.config("a", vfs.NewMem()))
	h.produce(exact, qty, etime, other, sameIDOtherMeter, atOld, justIn, atSkew, future, negative, emptyMeter,
		garbage, unknown, huge, wrongType)
	h.caughtUp()
	o := h.outputs()

	ids := o.byID()
	for _, id := range []string{"e2", "edge-in", "edge-skew"} {
		if ids[id] != 1 {
			t.Errorf("%s forwarded %d times, want 1", id, ids[id])
		}
	}
	if ids["e1"] != 2 { // acme/api_calls/e1 and acme/tokens/e1 are two identities
		t.Errorf("e1 forwarded %d times, want 2 (one per meter)", ids["e1"])
	}
	for _, id := range []string{"edge-old", "edge-future", "neg", "no-meter", "huge"} {
		if ids[id] != 0 {
			t.Errorf("%s forwarded, want rejected", id)
		}
	}
	if len(o.deduped) != 5 {
		t.Errorf("%d deduped events, want 5", len(o.deduped))
	}
	for i, d := range o.deduped {
		r := o.dedupedRec[i]
		if key := schemas.CustomerKey(d.CustomerID); string(r.Key) != string(key) || r.Partition != schemas.Partition(key, h.n) {
			t.Errorf("deduped key %q in partition %d for %s/%s, want the customer's key %q in partition %d",
				r.Key, r.Partition, d.CustomerID, d.Meter, key, schemas.Partition(key, h.n))
		}
		if d.EventID == "e1" && d.Meter == "api_calls" && (d.Quantity != 5 || d.IngestTime != arr) {
			t.Errorf("the first copy must count: %+v", d)
		}
	}

	// Duplicates: the exact copy, and two conflicts (quantity; event_time).
	if len(o.duplicates) != 3 {
		t.Fatalf("%d duplicates, want 3: %+v", len(o.duplicates), o.duplicates)
	}
	conflicts := 0
	for _, d := range o.duplicates {
		if d.EventID != "e1" || d.OriginalArrival != arr || d.OriginalPartition != first.Partition {
			t.Errorf("duplicate %+v does not reference the original", d)
		}
		if d.DuplicateArrival == arr+1000 && d.Conflict {
			t.Errorf("the exact copy is flagged conflict")
		}
		if d.Conflict {
			conflicts++
		}
	}
	if conflicts != 2 {
		t.Errorf("%d conflicts, want 2 (quantity, event_time)", conflicts)
	}

	reasons := map[string]int{}
	for _, r := range o.rejected {
		reasons[r.Reason]++
		if r.Stage != "dedup" || r.SourceTopic != h.names.EventsTopic() || len(r.RawValue) == 0 {
			t.Errorf("rejected record lacks its source: %+v", r)
		}
	}
	want := map[string]int{
		schemas.ReasonTooOld: 1, schemas.ReasonInFuture: 1, schemas.ReasonInvalid: 3,
		schemas.ReasonUndecodable: 1, schemas.ReasonUnknownSchema: 1, schemas.ReasonOversized: 1,
	}
	for k, v := range want {
		if reasons[k] != v {
			t.Errorf("reason %s: %d rejected, want %d (all: %v)", k, reasons[k], v, reasons)
		}
	}
	for _, r := range o.rejected {
		if r.Reason == schemas.ReasonInvalid && r.EventID == "neg" && !strings.Contains(r.Detail, "quantity") {
			t.Errorf("invalid detail does not name the field: %q", r.Detail)
		}
	}
}

// TestMisrouted covers the three kinds of misrouting: no key, a
// non-canonical key, and the wrong partition. Each is re-routed once, keeps
// its original arrival, and is then deduplicated where it belongs.
func TestMisrouted(t *testing.T) {
	h := newHarness(t, nil, 4)
	st := h.start(h.config("a", vfs.NewMem()))
	arr := t0 + 10*day

	noKey := h.event("acme", "api_calls", "m1", 1, arr-hour, arr)
	noKey.Key = nil
	badKey := h.event("acme", "api_calls", "m2", 1, arr-hour, arr)
	badKey.Key = []byte("acme:api_calls:m2")
	badKey.Partition = schemas.Partition(badKey.Key, h.n)
	wrongPart := h.event("acme", "api_calls", "m3", 1, arr-hour, arr)
	wrongPart.Partition = (wrongPart.Partition + 1) % h.n
	// A later, correctly routed copy of m3 is a duplicate of the re-routed one.
	copyM3 := h.event("acme", "api_calls", "m3", 1, arr-hour, arr+5*hour)
	h.produce(noKey, badKey, wrongPart)
	h.caughtUp()
	h.produce(copyM3)
	h.caughtUp()
	o := h.outputs()
	ids := o.byID()
	for _, id := range []string{"m1", "m2", "m3"} {
		if ids[id] != 1 {
			t.Errorf("%s forwarded %d times, want 1", id, ids[id])
		}
	}
	for _, d := range o.deduped {
		canon := schemas.Identity{CustomerID: d.CustomerID, Meter: d.Meter, EventID: d.EventID}.Key()
		if d.IngestTime != arr {
			t.Errorf("%s: ingest_time %d, want the original arrival %d", d.EventID, d.IngestTime, arr)
		}
		if d.SourcePartition != schemas.Partition(canon, h.n) {
			t.Errorf("%s accepted in partition %d, not its canonical %d", d.EventID, d.SourcePartition, schemas.Partition(canon, h.n))
		}
	}
	if len(o.duplicates) != 1 || o.duplicates[0].EventID != "m3" {
		t.Fatalf("duplicates %+v, want the later copy of m3", o.duplicates)
	}
	if len(o.rejected) != 0 {
		t.Fatalf("misrouted records must not be rejected: %+v", o.rejected)
	}
	// Every re-routed record in usage.events carries the loop-stop header.
	n := 0
	for _, r := range readEvents(t, h) {
		for _, hd := range r.Headers {
			if hd.Key == HeaderRerouted {
				n++
			}
		}
	}
	if n != 3 {
		t.Errorf("%d re-routed records in usage.events, want 3", n)
	}
	_ = st
}

func readEvents(t *testing.T, h *harness) []*kgo.Record {
	return readTopic(t, h, h.names.EventsTopic())
}

// TestSourcesRefuseTheCatchAllLabel: every source not in Sources is
// labelled OtherSource on the per-source metrics, so a source of that
// name would be counted with them: Validate refuses it, naming the field.
func TestSourcesRefuseTheCatchAllLabel(t *testing.T) {
	var cfg Config
	cfg.EnsureDefaults()
	cfg.Sources = []string{"api", OtherSource}
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), `sources: "other"`) {
		t.Errorf("Validate with source %q = %v, want a sources error naming it", OtherSource, err)
	}
}
