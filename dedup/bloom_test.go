package dedup

import (
	"crypto/sha256"
	"encoding/binary"
	"testing"
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
