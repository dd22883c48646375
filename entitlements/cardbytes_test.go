package entitlements

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/meterline/meterline/schemas"
)

// TestCheckCardBytesAgreesWithSetWithin: CheckCardBytes, which `meterline
// entitlements set-rates` runs before writing, refuses exactly the cards
// that a RateHistory with no card refuses for their bytes, at the bound
// and one byte past it, counting only the versions that can price an
// event from the time the card is read.
func TestCheckCardBytesAgreesWithSetWithin(t *testing.T) {
	const at = 1_800_000_000_000
	card := func(lastName int, past bool) *schemas.RateCard {
		v := schemas.RateVersion{EffectiveFrom: at}
		// 763 rates of 1,000-byte names and one of lastName bytes:
		// versionsBytes is 786,432 (MaxVersionBytes) for 492.
		for i := range 763 {
			v.Rates = append(v.Rates, schemas.Rate{Meter: fmt.Sprintf("%04d", i) + strings.Repeat("m", 996), MicroCredits: 1, PerUnits: 1})
		}
		v.Rates = append(v.Rates, schemas.Rate{Meter: "z" + strings.Repeat("m", lastName-1), MicroCredits: 1, PerUnits: 1})
		c := &schemas.RateCard{Versions: []schemas.RateVersion{v}}
		if past {
			// The same version before it: it prices no event once the
			// card is read at at.
			c.Versions = append([]schemas.RateVersion{{EffectiveFrom: at - 1, Rates: v.Rates}}, c.Versions...)
		}
		return c
	}
	for _, c := range []struct {
		lastName int
		past     bool
		refused  bool
	}{{492, false, false}, {493, false, true}, {492, true, false}, {493, true, true}} {
		cc := card(c.lastName, c.past)
		checked := CheckCardBytes(cc, at)
		set := (&RateHistory{}).Set(at, cc)
		if (checked != nil) != c.refused || (set != nil) != c.refused || c.refused && !errors.Is(checked, ErrTooManyVersions) {
			t.Errorf("last name of %d bytes, a past version %v: CheckCardBytes %v, Set %v; want refused %v",
				c.lastName, c.past, checked, set, c.refused)
		}
	}
}
