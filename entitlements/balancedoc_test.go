package entitlements

import (
	"math"
	"testing"

	"github.com/meterline/meterline/schemas"
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

// TestBalanceDocumentCapsUntil: a balance's caps_until is printed as a
// time, and left out when it is 0 (no change known).
func TestBalanceDocumentCapsUntil(t *testing.T) {
	b := &schemas.Balance{CustomerID: "acme", OverdraftPolicy: schemas.OverdraftAllow}
	if d := BalanceDocumentOf(b); d.CapsUntil != "" {
		t.Errorf("caps_until 0: %q, want none", d.CapsUntil)
	}
	b.CapsUntil = 1796479200000
	if d := BalanceDocumentOf(b); d.CapsUntil != "2026-12-05T14:00:00.000Z" {
		t.Errorf("caps_until %d: %q", b.CapsUntil, d.CapsUntil)
	}
}
