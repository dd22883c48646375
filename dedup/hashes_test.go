package dedup

import (
	"crypto/sha256"
	"encoding/binary"
	"strings"
	"testing"

	"github.com/cespare/xxhash/v2"

	"github.com/meterline/meterline/schemas"
)

func bloomKey(i uint64) []byte {
	var buf [8]byte
	binary.BigEndian.PutUint64(buf[:], i)
	s := sha256.Sum256(buf[:])
	return s[:hashLen]
}

// TestBloomFalsePositives checks that the filter has no false negatives
// and answers "maybe" for few absent keys, at sizes that fill one filter,
// spill into a second and a third: every false positive is a Pebble read.
func TestBloomFalsePositives(t *testing.T) {
	for _, n := range []int{bloomFirstCap, 2 * bloomFirstCap, 6 * bloomFirstCap} {
		var b bloom
		for i := 0; i < n; i++ {
			b.add(bloomKey(uint64(i)))
		}
		for i := 0; i < n; i++ {
			if !b.mayContain(bloomKey(uint64(i))) {
				t.Fatalf("n=%d: key %d added but not found", n, i)
			}
		}
		const q = 100_000
		fp := 0
		for i := 0; i < q; i++ {
			if b.mayContain(bloomKey(uint64(i) + 1<<40)) {
				fp++
			}
		}
		rate := float64(fp) / q
		t.Logf("%d keys in %d filters: %.2f%% false positives", n, len(b.filters), 100*rate)
		if rate > 0.025 {
			t.Errorf("%d keys: false positive rate %.2f%%, want about 1%% per full filter", n, 100*rate)
		}
	}
}

// TestPayloadHashStable pins payloadHash to the digest it was first
// computed with (xxhash of quantity, event_time, then each framed
// property, written one after another): stored identities keep the hash
// of their original's payload, and a changed function would flag every
// later exact copy as a conflict.
func TestPayloadHashStable(t *testing.T) {
	for i, e := range []*schemas.UsageEvent{
		{Quantity: 1, EventTime: 2},
		{Quantity: 1 << 40, EventTime: 1_790_000_000_000, Properties: []schemas.Property{{Name: "model", Value: "m1"}, {Name: "region", Value: "eu"}}},
		{Quantity: 7, EventTime: 9, Properties: []schemas.Property{{Name: "big", Value: strings.Repeat("v", 5000)}}},
	} {
		var b [16]byte
		binary.BigEndian.PutUint64(b[:8], uint64(e.Quantity))
		binary.BigEndian.PutUint64(b[8:], uint64(e.EventTime))
		h := xxhash.New()
		_, _ = h.Write(b[:])
		for _, p := range e.Properties {
			_, _ = h.Write(schemas.AppendFramed(nil, p.Name, p.Value))
		}
		var want [payloadLen]byte
		binary.BigEndian.PutUint32(want[:], uint32(h.Sum64()))
		if got := payloadHash(e); got != want {
			t.Errorf("event %d: payloadHash = %x, want %x", i, got, want)
		}
	}
}

// TestBloomSizedFromPreviousBucket checks that a new arrival bucket's
// filter is sized from the bucket before it: a day as busy as yesterday
// fills one filter, not a chain (one cache miss per link on every lookup
// that finds nothing), and keeps the false-positive rate.
func TestBloomSizedFromPreviousBucket(t *testing.T) {
	pt := &partition{filters: newFilters()}
	const n = 5 * bloomFirstCap
	for b := uint32(10); b <= 11; b++ {
		for i := 0; i < n; i++ {
			pt.bloomFor(b).add(bloomKey(uint64(b)<<32 | uint64(i)))
			pt.keys[b]++
		}
	}
	if got := len(pt.blooms[10].filters); got < 2 {
		t.Fatalf("the first bucket (no predecessor) has %d filters for %d keys; the test expects a chain there", got, n)
	}
	if got := len(pt.blooms[11].filters); got != 1 {
		t.Fatalf("the second bucket has %d filters for %d keys, want 1 sized from the first bucket", got, n)
	}
	fp := 0
	for i := 0; i < 100_000; i++ {
		if pt.blooms[11].mayContain(bloomKey(uint64(i) + 1<<60)) {
			fp++
		}
	}
	if rate := float64(fp) / 100_000; rate > 0.02 {
		t.Errorf("false positive rate %.2f%%, want about 1%%", 100*rate)
	}
}
