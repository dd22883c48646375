package dedup

import (
	"bytes"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/schemas"
)

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
