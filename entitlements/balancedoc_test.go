package entitlements

import (
	"math"
	"testing"
)

// TestUsedPercent: rounded down, 0 without a limit, and no overflow for
// usage a producer could push anywhere up to MaxInt64.
func TestUsedPercent(t *testing.T) {
	for _, c := range []struct{ usage, limit, want int64 }{
		{0, 1000, 0}, {875, 1000, 87}, {999, 1000, 99}, {1000, 1000, 100}, {1500, 1000, 150},
		{5, 0, 0}, {-5, 10, 0},
		{math.MaxInt64, math.MaxInt64, 100},
		{math.MaxInt64 - 1, math.MaxInt64, 99},
		{math.MaxInt64 / 2, 3, math.MaxInt64},
		{math.MaxInt64, 1, math.MaxInt64},
		{math.MaxInt64 / 200, 1, math.MaxInt64 / 200 * 100},
	} {
		if got := usedPercent(c.usage, c.limit); got != c.want {
			t.Errorf("usedPercent(%d, %d) = %d, want %d", c.usage, c.limit, got, c.want)
		}
	}
	if got := satAdd(math.MaxInt64-1, 5); got != math.MaxInt64 {
		t.Errorf("satAdd saturates: got %d", got)
	}
}
