package entitlements

import (
	"errors"
	"strings"
	"testing"

	"github.com/meterline/meterline/schemas"
)

// TestValidateBoundedOnHugeRecords: a record written straight to the
// topic may hold as many caps, grants or rates as the decoder takes
// (65,536 each in 530 KB). Validate named every bad one: 10 MB of error
// text, 170 MB and a third of a second of the aggregator's for one
// record. It names the first maxFieldErrors problems and looks at no item
// past the bounds; the record is still refused, saying why.
func TestValidateBoundedOnHugeRecords(t *testing.T) {
	const n = 1 << 16
	e := &schemas.Entitlements{CustomerID: "acme", Overdraft: schemas.Overdraft{Policy: schemas.OverdraftAllow}}
	for range n {
		e.Caps = append(e.Caps, schemas.Cap{OnLimit: schemas.OnLimitReject})
		e.Grants = append(e.Grants, schemas.Grant{})
	}
	card := &schemas.RateCard{Versions: []schemas.RateVersion{{}}}
	for range n {
		card.Versions[0].Rates = append(card.Versions[0].Rates, schemas.Rate{})
	}
	for range n {
		card.Versions = append(card.Versions, schemas.RateVersion{})
	}
	for _, c := range []struct {
		name, want string
		validate   func() error
	}{
		{"plan", "65536 caps, more than 256", func() error { return Validate(e, nil) }},
		{"rate card", "65536 rates in all, more than 10000", func() error { return ValidateRateCard(card, nil) }},
	} {
		var err error
		allocs := testing.AllocsPerRun(1, func() { err = c.validate() })
		switch {
		case !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.want):
			t.Errorf("%s: %v, want invalid saying %q", c.name, err, c.want)
		case !strings.Contains(err.Error(), "not named"):
			t.Errorf("%s: the error does not say that more problems are not named", c.name)
		case len(err.Error()) > 16<<10:
			t.Errorf("%s: an error of %d bytes", c.name, len(err.Error()))
		}
		if allocs > 100_000 {
			t.Errorf("%s: %.0f allocations to validate", c.name, allocs)
		}
		t.Logf("%s: %.0f allocations, an error of %d bytes", c.name, allocs, len(err.Error()))
	}
}
