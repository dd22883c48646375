package entitlements

import (
	"testing"

	"github.com/meterline/meterline/schemas"
)

// unitCard is a rate card of one micro-credit a unit of meter m.
func unitCard() *schemas.RateCard {
	return &schemas.RateCard{Versions: []schemas.RateVersion{{Rates: []schemas.Rate{{Meter: "m", MicroCredits: 1, PerUnits: 1}}}}}
}

// applyCard applies the rate card c, written at broker time at.
func applyCard(t *testing.T, l *Ledger, st Store, c *schemas.RateCard, at int64) {
	t.Helper()
	v, _ := schemas.Encode(c)
	rec, _ := ParseRecord([]byte(schemas.RateCardKey), v, at)
	if err := l.Apply(st, rec); err != nil {
		t.Fatal(err)
	}
}

// readRecord does what the aggregator does with a record of key (m nil: a
// tombstone) read at broker time at: it parses and applies it, then prunes
// what lies before horizon: customer acme's state after acme's record,
// the shared state after a reserved key's.
func readRecord(t *testing.T, l *Ledger, st Store, key []byte, m schemas.Message, at, horizon int64) {
	t.Helper()
	var v []byte
	if m != nil {
		v, _ = schemas.Encode(m)
	}
	rec, err := ParseRecord(key, v, at)
	if err == nil {
		err = l.Apply(st, rec)
	}
	if err == nil && rec.Key.Reserved == "" {
		err = l.PruneCustomer(st, "acme", horizon)
	} else if err == nil {
		err = l.PruneShared(st, horizon)
	}
	if err != nil {
		t.Fatal(err)
	}
}
