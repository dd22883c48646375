package entitlements

import (
	"fmt"
	"math/rand/v2"
	"sort"
	"testing"

	"github.com/meterline/meterline/schemas"
)

// TestRateSmallAndLargeCards: Rate compares the rates of a version one by
// one up to smallRates and searches them past it; both find what a search
// of the sorted rates finds, for every meter priced and for meters before,
// between and after them, on either side of smallRates.
func TestRateSmallAndLargeCards(t *testing.T) {
	for n := 0; n <= 2*smallRates+1; n++ {
		var rates []schemas.Rate
		for i := range n {
			rates = append(rates, schemas.Rate{Meter: fmt.Sprintf("m%02d", 2*i+1), MicroCredits: int64(i + 1), PerUnits: 1})
		}
		var h RateHistory
		if err := h.Set(0, &schemas.RateCard{Versions: []schemas.RateVersion{{Rates: rates}}}); err != nil {
			t.Fatal(err)
		}
		for k := 0; k <= 2*n+2; k++ {
			meter := fmt.Sprintf("m%02d", k)
			i := sort.Search(len(rates), func(i int) bool { return rates[i].Meter >= meter })
			want, wantOK := schemas.Rate{}, i < len(rates) && rates[i].Meter == meter
			if wantOK {
				want = rates[i]
			}
			if got, ok := h.Rate(10, 10, meter); got != want || ok != wantOK {
				t.Errorf("%d rates: Rate(%s) = %+v, %v; want %+v, %v", n, meter, got, ok, want, wantOK)
			}
		}
	}
}

// TestAtLatestVersionFirst: At looks at the latest version first; an
// arrival before it still finds the version in effect then, none before
// the first, and a tombstone as nil.
func TestAtLatestVersionFirst(t *testing.T) {
	var tl Timeline
	for i, name := range []string{"a", "b", "", "d"} {
		p := plan(name)
		if name == "" {
			p = nil
		}
		if err := tl.Set(int64(100*(i+1)), int64(100*(i+1)), p); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		at   int64
		want string
	}{{99, "none"}, {100, "a"}, {199, "a"}, {200, "b"}, {250, "b"}, {300, "deleted"}, {399, "deleted"},
		{400, "d"}, {1 << 40, "d"}} {
		if got := planName(tl.At(c.at)); got != c.want {
			t.Errorf("At(%d) = %s, want %s", c.at, got, c.want)
		}
	}
}

// TestResolvedPlanAtIsPlanAt: what a Resolved works out once (its steady
// plan) decides as planAt on its timelines does, at every arrival, for
// timelines of a customer and of the default plan with none, one or
// several versions, tombstones among them, the latest version of either
// being the later.
func TestResolvedPlanAtIsPlanAt(t *testing.T) {
	rnd := rand.New(rand.NewPCG(14, 1))
	timeline := func(prefix string) *Timeline {
		tl := &Timeline{}
		at := int64(0)
		for i := range rnd.IntN(4) {
			at += 1 + rnd.Int64N(100)
			var p *Plan
			if rnd.IntN(3) > 0 {
				p = plan(fmt.Sprintf("%s%d", prefix, i))
			}
			if err := tl.Set(at, at+rnd.Int64N(50), p); err != nil {
				t.Fatal(err)
			}
		}
		return tl
	}
	for range 2000 {
		own, def := timeline("own"), timeline("def")
		r := newResolved(own, def, &RateHistory{})
		for at := int64(-1); at < 700; at++ {
			if got, want := r.planAt(at), planAt(own, def, at); got != want {
				t.Fatalf("arrival %d: %s, planAt %s (own %v, default %v)", at, planName(got, true), planName(want, true),
					own.versions, def.versions)
			}
		}
	}
}
