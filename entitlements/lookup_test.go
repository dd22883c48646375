package entitlements

import (
	"fmt"
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
