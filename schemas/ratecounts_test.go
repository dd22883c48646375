package schemas

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

// randomRateCard is a RateCard of up to n versions of up to n rates each,
// with strings and numbers at their edges now and then.
func randomRateCard(rng *rand.Rand, n int) *RateCard {
	num := func() int64 {
		switch rng.IntN(4) {
		case 0:
			return math.MaxInt64 - rng.Int64N(3)
		case 1:
			return math.MinInt64 + rng.Int64N(3)
		}
		return rng.Int64N(1 << 40)
	}
	c := &RateCard{}
	for range rng.IntN(n + 1) {
		v := RateVersion{EffectiveFrom: num()}
		for range rng.IntN(n + 1) {
			m := fmt.Sprint("m", rng.IntN(1000))
			if rng.IntN(4) == 0 {
				m = strings.Repeat("x", 128+rng.IntN(200))
			}
			v.Rates = append(v.Rates, Rate{Meter: m, MicroCredits: num(), PerUnits: num()})
		}
		c.Versions = append(c.Versions, v)
	}
	return c
}

// TestRateCardCountsMatchDecode: RateCardCounts gives the counts of
// versions and rates Decode gives, and says ok exactly for the bytes of
// the current RateCard schema that Decode decodes (block counts that
// overflow aside, fast.go): random cards (up to 40 versions of up to 40 rates), each cut short, with bytes
// flipped, changed to every value at a random place, or followed by more;
// other kinds are not ok.
func TestRateCardCountsMatchDecode(t *testing.T) {
	seeds := 150
	if testing.Short() {
		seeds = 40
	}
	var oks, fails int
	for seed := range uint64(seeds) {
		rng := rand.New(rand.NewPCG(seed, 0x7261746563617264))
		v := MustEncode(randomRateCard(rng, []int{3, 40}[rng.IntN(2)]))
		variants := bodyVariants(rng, v)
		for i, w := range variants {
			versions, rates, ok := RateCardCounts(w)
			if _, _, err := rateCardCounts(w); errors.Is(err, errCountOverflow) {
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
			c := m.(*RateCard)
			n := 0
			for _, v := range c.Versions {
				n += len(v.Rates)
			}
			if versions != int64(len(c.Versions)) || rates != int64(n) {
				t.Fatalf("seed %d, variant %d: %d versions, %d rates; Decode: %d, %d", seed, i, versions, rates, len(c.Versions), n)
			}
		}
	}
	for _, m := range []Message{&Tick{InstanceID: "x"}, &Entitlements{Overdraft: Overdraft{Policy: OverdraftAllow}}} {
		if _, _, ok := RateCardCounts(MustEncode(m)); ok {
			t.Errorf("a %s counted as a RateCard", m.Kind())
		}
	}
	if oks == 0 || fails == 0 {
		t.Fatalf("%d variants decoded, %d did not: want both", oks, fails)
	}
	t.Logf("%d variants decoded, %d did not", oks, fails)
}

// TestRateCardCountsAllocatesNothing: counting the rates of a card of
// 330,000 rates (about 1 MB, 6 versions of 55,000: an array holds at most
// maxSliceAlloc items) allocates nothing, where Decode allocates about
// 10 MB.
func TestRateCardCountsAllocatesNothing(t *testing.T) {
	c := &RateCard{}
	for i := range 6 {
		c.Versions = append(c.Versions, RateVersion{EffectiveFrom: int64(i), Rates: make([]Rate, 55_000)})
	}
	v := MustEncode(c)
	var versions, rates int64
	allocs := testing.AllocsPerRun(5, func() { versions, rates, _ = RateCardCounts(v) })
	if versions != 6 || rates != 330_000 || allocs > 0 {
		t.Errorf("%d versions, %d rates, %v allocations; want 6 and 330000, none", versions, rates, allocs)
	}
}

// bodyVariants is v, a message, and variants of it: with a byte more or
// less, cut short at a random place, with a random byte flipped (20
// times), and with one random byte changed to each of its values.
func bodyVariants(rng *rand.Rand, v []byte) [][]byte {
	variants := [][]byte{v, append(bytes.Clone(v), 0), v[:len(v)-1], v[:headerSize+rng.IntN(len(v)-headerSize)]}
	for range 20 {
		w := bytes.Clone(v)
		w[headerSize+rng.IntN(len(w)-headerSize)] ^= byte(1 + rng.IntN(255))
		variants = append(variants, w)
	}
	at := headerSize + rng.IntN(len(v)-headerSize)
	for b := range 256 {
		w := bytes.Clone(v)
		w[at] = byte(b)
		variants = append(variants, w)
	}
	return variants
}
