package dedup

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/schemas"
)

// paddedLong appends v as an Avro long in 10 bytes: a zig-zag varint with
// continuation bits it does not need, which every Avro decoder reads as v.
func paddedLong(dst []byte, v int64) []byte {
	u := uint64(v<<1) ^ uint64(v>>63)
	for i := 0; i < 9; i++ {
		dst = append(dst, byte(u>>(7*i))&0x7f|0x80)
	}
	return append(dst, byte(u>>63))
}

func paddedString(dst []byte, s string) []byte { return append(paddedLong(dst, int64(len(s))), s...) }

// TestMisroutedOversizedWithItsKey: a record of at most MaxEventBytes whose
// event, with its canonical key, is more than that (identity fields at
// their limit, a value written with padded varints and one property per
// block) is rejected as oversized where it is read, never re-routed
// (docs/design.md, Bad input): re-routed, it came back as a record dedup
// itself rejected as oversized, under the re-routed coordinates, and
// counted as forged headers.
func TestMisroutedOversizedWithItsKey(t *testing.T) {
	e := &schemas.UsageEvent{CustomerID: strings.Repeat("c", schemas.MaxIdentityFieldBytes),
		Meter: strings.Repeat("m", schemas.MaxIdentityFieldBytes), EventID: strings.Repeat("e", schemas.MaxIdentityFieldBytes),
		Quantity: 1, EventTime: frStart, Source: strings.Repeat("s", schemas.MaxSourceBytes)}
	v := schemas.MustEncode(&schemas.UsageEvent{EventID: "x", CustomerID: "x", Meter: "x", EventTime: frStart})[:10]
	v = paddedString(v, e.EventID)
	v = paddedString(v, e.CustomerID)
	v = paddedString(v, e.Meter)
	v = paddedLong(v, e.Quantity)
	v = paddedLong(v, e.EventTime)
	v = paddedString(v, e.Source)
	val := strings.Repeat("v", schemas.MaxPropertiesBytes/schemas.MaxProperties-3)
	for i := range schemas.MaxProperties {
		name := fmt.Sprintf("p%02d", i)
		v = append(v, 1) // a block of one item, with its byte size
		v = paddedLong(v, int64(20+len(name)+len(val)))
		v = paddedString(paddedString(v, name), val)
	}
	v = append(v, 0)
	m, err := schemas.Decode(v)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.(*schemas.UsageEvent).Validate(); err != nil {
		t.Fatal(err)
	}
	canon := m.(*schemas.UsageEvent).Identity().Key()
	if len(v) > schemas.MaxEventBytes || len(canon)+len(v) <= schemas.MaxEventBytes {
		t.Fatalf("value %d bytes, with its key %d: the test needs at most %d, and more with its key", len(v), len(canon)+len(v), schemas.MaxEventBytes)
	}

	h := newRecordHarness(t)
	defer h.close()
	l := h.local(0)
	rec := &kgo.Record{Topic: h.pr.eventsTopic, Partition: 0, Offset: 7, Value: v, Timestamp: time.UnixMilli(frStart)}
	if err := l.Process([]*kgo.Record{rec}); err != nil {
		t.Fatal(err)
	}
	if err := l.Commit(); err != nil {
		t.Fatal(err)
	}
	var rejected []*schemas.Rejected
	for _, o := range l.TakeOutput() {
		switch o.Topic {
		case h.pr.eventsTopic:
			t.Errorf("re-routed to partition %d: a record of %d bytes, which dedup rejects as oversized when it reads it", o.Partition, len(o.Key)+len(o.Value))
		case h.pr.rejectedTopic:
			var r schemas.Rejected
			if err := schemas.DecodeInto(o.Value, &r); err != nil {
				t.Fatal(err)
			}
			rejected = append(rejected, &r)
		}
	}
	if len(rejected) != 1 || rejected[0].Reason != schemas.ReasonOversized || rejected[0].SourceOffset != 7 {
		t.Fatalf("rejected %+v, want the record at offset 7 as %s", rejected, schemas.ReasonOversized)
	}
}

// TestIdentityBytewise: identity fields are compared byte for byte, with
// no case folding and no Unicode normalization (docs/design.md,
// Event identity and keys): events that differ only so are different events, each
// forwarded.
func TestIdentityBytewise(t *testing.T) {
	h := newRecordHarness(t)
	defer h.close()
	ids := [][3]string{
		{"acme", "api", "req-1"}, {"Acme", "api", "req-1"}, {"acme", "API", "req-1"}, {"acme", "api", "REQ-1"},
		{"caf\u00e9", "api", "req-1"}, {"cafe\u0301", "api", "req-1"},
	}
	for i, id := range ids {
		e := &schemas.UsageEvent{CustomerID: id[0], Meter: id[1], EventID: id[2], Quantity: 1, EventTime: frStart}
		key := e.Identity().Key()
		p := schemas.Partition(key, frEvents)
		if err := h.local(p).Process([]*kgo.Record{{Topic: h.pr.eventsTopic, Partition: p, Offset: int64(i), Key: key,
			Value: schemas.MustEncode(e), Timestamp: time.UnixMilli(frStart)}}); err != nil {
			t.Fatal(err)
		}
	}
	forwarded := 0
	for p := range int32(frEvents) {
		if err := h.local(p).Commit(); err != nil {
			t.Fatal(err)
		}
		for _, o := range h.local(p).TakeOutput() {
			if o.Topic == h.pr.dedupedTopic {
				if m, err := schemas.Decode(o.Value); err == nil && m.Kind() == schemas.KindDedupedEvent {
					forwarded++
				}
			} else {
				t.Errorf("output to %s", o.Topic)
			}
		}
	}
	if forwarded != len(ids) {
		t.Fatalf("%d events forwarded, want %d: identities that differ only in case or normalization are distinct", forwarded, len(ids))
	}
}

// TestSizeLimitExact: a record of key and value together over
// MaxEventBytes is oversized (docs/design.md, Bad input), one of exactly
// MaxEventBytes is read: bytes that are no Avro are then undecodable.
func TestSizeLimitExact(t *testing.T) {
	h := newRecordHarness(t)
	defer h.close()
	l := h.local(0)
	key := []byte("x")
	var recs []*kgo.Record
	for off, n := range []int{schemas.MaxEventBytes, schemas.MaxEventBytes + 1} {
		recs = append(recs, &kgo.Record{Topic: h.pr.eventsTopic, Partition: 0, Offset: int64(off), Key: key,
			Value: bytes.Repeat([]byte{'v'}, n-len(key)), Timestamp: time.UnixMilli(frStart)})
	}
	if err := l.Process(recs); err != nil {
		t.Fatal(err)
	}
	if err := l.Commit(); err != nil {
		t.Fatal(err)
	}
	want := []string{schemas.ReasonUndecodable, schemas.ReasonOversized}
	var got []string
	for _, o := range l.TakeOutput() {
		if o.Topic != h.pr.rejectedTopic {
			continue
		}
		var r schemas.Rejected
		if err := schemas.DecodeInto(o.Value, &r); err != nil {
			t.Fatal(err)
		}
		got = append(got, fmt.Sprintf("%d:%s", r.SourceOffset, r.Reason))
	}
	if len(got) != 2 || got[0] != "0:"+want[0] || got[1] != "1:"+want[1] {
		t.Fatalf("rejections %v, want the record of %d bytes %s and the one of %d bytes %s",
			got, schemas.MaxEventBytes, want[0], schemas.MaxEventBytes+1, want[1])
	}
}

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

// TestLongKeyRejectedWithoutKey: a record whose key is longer than
// MaxRejectedRawBytes is rejected as oversized by a usage.rejected record
// with no key (schemas.RejectedKey: its value keeps the key's prefix,
// length and digest), placed by the whole key. The key must not be the
// prefix Bound cut: a prefix is no key of the source record, and keys
// longer than it that share it would share it.
func TestLongKeyRejectedWithoutKey(t *testing.T) {
	h := newRecordHarness(t)
	defer h.close()
	key := bytes.Repeat([]byte("k"), schemas.MaxRejectedRawBytes+100)
	l := h.local(0)
	if err := l.Process([]*kgo.Record{{Topic: h.pr.eventsTopic, Partition: 0, Offset: 0, Key: key,
		Value: []byte("v"), Timestamp: time.UnixMilli(frStart)}}); err != nil {
		t.Fatal(err)
	}
	if err := l.Commit(); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, o := range l.TakeOutput() {
		if o.Topic != h.pr.rejectedTopic {
			continue
		}
		n++
		var r schemas.Rejected
		if err := schemas.DecodeInto(o.Value, &r); err != nil {
			t.Fatal(err)
		}
		if r.Reason != schemas.ReasonOversized || r.RawKeyLength != int64(len(key)) {
			t.Errorf("rejected %s with a key of %d bytes, want oversized, %d", r.Reason, r.RawKeyLength, len(key))
		}
		if o.Key != nil {
			t.Errorf("the rejected record's key is %d bytes of the source key, want none", len(o.Key))
		}
		if want := schemas.Partition(key, h.pr.counts.rejected); o.Partition != want {
			t.Errorf("rejected record in partition %d, want %d (the whole key's)", o.Partition, want)
		}
	}
	if n != 1 {
		t.Fatalf("%d rejected records, want 1", n)
	}
}

// TestLongKeyRejectedWithoutKeyOnBrokers: TestLongKeyRejectedWithoutKey
// as a record of usage.rejected on a broker: a producer's record of a
// 20 KiB key comes out with no key, in the partition of its whole key.
func TestLongKeyRejectedWithoutKeyOnBrokers(t *testing.T) {
	onBrokers(t, func(t *testing.T, brokers []string) {
		h := newHarness(t, brokers, 2)
		key := bytes.Repeat([]byte("k"), schemas.MaxRejectedRawBytes+4096)
		h.start(h.config("a", vfs.NewMem()))
		h.produce(&kgo.Record{Topic: h.names.EventsTopic(), Partition: 0, Key: key, Value: []byte("v"), Timestamp: time.Now()})
		h.caughtUp()
		recs := readTopic(t, h, h.names.RejectedTopic())
		if len(recs) != 1 {
			t.Fatalf("%d records in %s, want 1", len(recs), h.names.RejectedTopic())
		}
		if recs[0].Key != nil {
			t.Errorf("the rejected record's key is %d bytes of the source key, want none", len(recs[0].Key))
		}
		if want := schemas.Partition(key, h.n); recs[0].Partition != want {
			t.Errorf("rejected record in partition %d, want %d (the whole key's)", recs[0].Partition, want)
		}
	})
}
