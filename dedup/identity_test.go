package dedup

import (
	"bytes"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/schemas"
)

// TestIdentityRecordIsWhatDedupWrites: the seeding helper's record is the
// changelog record the stage writes for an event's first copy.
func TestIdentityRecordIsWhatDedupWrites(t *testing.T) {
	h := newHarness(t, nil, 1)
	now := time.Now().UnixMilli()
	rec := h.event("acme", "api_calls", "seed-1", 3, now-1000, now)
	h.start(h.config("a", vfs.NewMem()))
	h.produce(rec)
	h.caughtUp()
	e, err := schemas.Decode(rec.Value)
	if err != nil {
		t.Fatal(err)
	}
	key, val := IdentityRecord(e.(*schemas.UsageEvent), now, DefaultBucket, 0)
	found := false
	for _, r := range testenv.ReadAll(t, h.brokers, h.names.DedupChangelogTopic()) {
		if bytes.Equal(r.Key, key) {
			found = true
			if !bytes.Equal(r.Value, val) {
				t.Fatalf("IdentityRecord value %x, dedup wrote %x", val, r.Value)
			}
		}
	}
	if !found {
		t.Fatalf("no changelog record with IdentityRecord's key %x", key)
	}
}
