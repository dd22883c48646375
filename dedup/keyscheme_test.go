package dedup

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/schemas"
)

// TestDedupedKeyedByCustomer: usage.deduped is keyed by the framed
// customer (docs/design.md, Topics), so every meter of a customer lands in
// one partition, the one Kafka's default partitioner picks for that key.
func TestDedupedKeyedByCustomer(t *testing.T) {
	h := newHarness(t, nil, 8)
	h.start(h.config("a", vfs.NewMem()))
	arr := t0 + 10*day
	meters := []string{"api_calls", "tokens", "storage_gb", "seats", "egress"}
	var recs []*kgo.Record
	for c := 0; c < 6; c++ {
		for _, m := range meters {
			recs = append(recs, h.event(fmt.Sprintf("cust-%d", c), m, "e1", 1, arr-hour, arr))
		}
	}
	h.produce(recs...)
	h.caughtUp()
	o := h.outputs()
	if len(o.deduped) != len(recs) {
		t.Fatalf("%d deduped events, want %d", len(o.deduped), len(recs))
	}
	parts := map[string]map[int32]bool{}
	for i, d := range o.deduped {
		r := o.dedupedRec[i]
		key := schemas.CustomerKey(d.CustomerID)
		if !bytes.Equal(r.Key, key) {
			t.Errorf("%s/%s keyed %q, want %q", d.CustomerID, d.Meter, r.Key, key)
		}
		if want := schemas.Partition(key, h.n); r.Partition != want {
			t.Errorf("%s/%s in partition %d, want %d", d.CustomerID, d.Meter, r.Partition, want)
		}
		if parts[d.CustomerID] == nil {
			parts[d.CustomerID] = map[int32]bool{}
		}
		parts[d.CustomerID][r.Partition] = true
	}
	for c, ps := range parts {
		if len(ps) != 1 {
			t.Errorf("customer %s's meters are in partitions %v, want one", c, ps)
		}
	}
}

// TestKeySchemeRefused: dedup records the key scheme of usage.deduped in
// its state, and refuses state of another scheme, or state written before
// schemes were recorded (keyed by customer and meter), with a clear error.
func TestKeySchemeRefused(t *testing.T) {
	var n [4]byte
	binary.BigEndian.PutUint32(n[:], 1)
	for _, tc := range []struct {
		name string
		meta map[string][]byte
	}{
		{"older state", map[string][]byte{string(keyPartitions): n[:]}},
		{"other scheme", map[string][]byte{string(keyPartitions): n[:], string(keyKeyScheme): []byte("customer+meter")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, nil, 1)
			for k, v := range tc.meta {
				h.produce(&kgo.Record{Topic: h.names.DedupChangelogTopic(), Partition: 0, Key: []byte(k), Value: v})
			}
			h.produce(h.event("acme", "api_calls", "e1", 1, t0-hour, t0))
			st := h.start(h.config("a", vfs.NewMem()))
			err, ok := st.wait(30 * time.Second)
			if !ok {
				t.Fatal("dedup runs on state of another key scheme")
			}
			if !errors.Is(err, schemas.ErrKeyScheme) {
				t.Fatalf("Run = %v, want ErrKeyScheme", err)
			}
			t.Log(err)
			if d := h.outputs().deduped; len(d) != 0 {
				t.Errorf("%d events forwarded on state of another key scheme", len(d))
			}
		})
	}
	t.Run("new state records it", func(t *testing.T) {
		h := newHarness(t, nil, 1)
		h.start(h.config("a", vfs.NewMem()))
		h.produce(h.event("acme", "api_calls", "e1", 1, t0-hour, t0))
		h.caughtUp()
		found := false
		for _, r := range readTopic(t, h, h.names.DedupChangelogTopic()) {
			found = found || (bytes.Equal(r.Key, keyKeyScheme) && string(r.Value) == schemas.DedupedKeyScheme)
		}
		if !found {
			t.Errorf("the changelog does not record the key scheme %q", schemas.DedupedKeyScheme)
		}
	})
}
