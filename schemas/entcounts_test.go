package schemas

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

// randomEntitlements is an Entitlements of up to n caps and n grants, with
// strings and numbers at their edges now and then.
func randomEntitlements(rng *rand.Rand, n int) *Entitlements {
	str := func() string {
		switch rng.IntN(4) {
		case 0:
			return ""
		case 1:
			return strings.Repeat("x", 128+rng.IntN(200))
		}
		return fmt.Sprint("s", rng.IntN(1000))
	}
	num := func() int64 {
		switch rng.IntN(4) {
		case 0:
			return math.MaxInt64 - rng.Int64N(3)
		case 1:
			return math.MinInt64 + rng.Int64N(3)
		}
		return rng.Int64N(1 << 40)
	}
	e := &Entitlements{CustomerID: str(), Plan: str(), EffectiveFrom: num(), Unmetered: rng.IntN(2) == 0,
		Overdraft: Overdraft{Policy: []OverdraftPolicy{OverdraftAllow, OverdraftDeny}[rng.IntN(2)], Limit: num()}}
	for range rng.IntN(n + 1) {
		e.Caps = append(e.Caps, Cap{Meter: str(), Limit: num(), OnLimit: []OnLimit{OnLimitReject, OnLimitAllow}[rng.IntN(2)]})
	}
	for range rng.IntN(n + 1) {
		e.Grants = append(e.Grants, Grant{ID: str(), Amount: num(), Priority: int32(num()), EffectiveFrom: num(), ExpiresAt: num()})
	}
	return e
}

// TestEntitlementsCountsMatchDecode: EntitlementsCounts gives the
// customer_id and the counts of caps and grants Decode gives, and says ok
// exactly for the bytes of the current Entitlements schema that Decode
// decodes (block counts that overflow aside, fast.go): random records (up to 300 caps and grants, hamba writing
// blocks of 100 items), each cut short, with bytes flipped, changed to
// every value at a random place, or followed by more; other kinds are
// not ok.
func TestEntitlementsCountsMatchDecode(t *testing.T) {
	seeds := 150
	if testing.Short() {
		seeds = 40
	}
	var oks, fails int
	for seed := range uint64(seeds) {
		rng := rand.New(rand.NewPCG(seed, 0x656e74636f756e74))
		e := randomEntitlements(rng, []int{3, 300}[rng.IntN(2)])
		v := MustEncode(e)
		variants := bodyVariants(rng, v)
		for i, w := range variants {
			cust, caps, grants, ok := EntitlementsCounts(w)
			if _, _, _, err := entitlementsCounts(w); errors.Is(err, errCountOverflow) {
				continue // taken by hamba, refused by fast.go (its file comment)
			}
			m, err := Decode(w)
			if ok != (err == nil) {
				t.Fatalf("seed %d, variant %d: counts ok %v, Decode: %v", seed, i, ok, err)
			}
			if !ok {
				fails++
				continue
			}
			oks++
			d := m.(*Entitlements)
			if cust != d.CustomerID || caps != int64(len(d.Caps)) || grants != int64(len(d.Grants)) {
				t.Fatalf("seed %d, variant %d: %q, %d caps, %d grants; Decode: %q, %d, %d", seed, i, cust, caps, grants, d.CustomerID, len(d.Caps), len(d.Grants))
			}
		}
	}
	for _, m := range []Message{&Tick{InstanceID: "x"}, &RateCard{Versions: []RateVersion{{}}}} {
		if _, _, _, ok := EntitlementsCounts(MustEncode(m)); ok {
			t.Errorf("a %s counted as Entitlements", m.Kind())
		}
	}
	if oks == 0 || fails == 0 {
		t.Fatalf("%d variants decoded, %d did not: want both", oks, fails)
	}
	t.Logf("%d variants decoded, %d did not", oks, fails)
}

// TestEntitlementsCountsAllocatesNothing: counting the items of a record
// of 65,536 caps and as many grants (about 530 KB) allocates nothing but
// its customer_id, where Decode allocates about 30 MB.
func TestEntitlementsCountsAllocatesNothing(t *testing.T) {
	e := &Entitlements{CustomerID: "acme", Overdraft: Overdraft{Policy: OverdraftAllow}}
	for range 1 << 16 {
		e.Caps = append(e.Caps, Cap{OnLimit: OnLimitReject})
		e.Grants = append(e.Grants, Grant{})
	}
	v := MustEncode(e)
	var caps, grants int64
	allocs := testing.AllocsPerRun(5, func() { _, caps, grants, _ = EntitlementsCounts(v) })
	if caps != 1<<16 || grants != 1<<16 || allocs > 1 {
		t.Errorf("%d caps, %d grants, %v allocations; want 65536 each, at most 1 allocation", caps, grants, allocs)
	}
}
