package entitlements

import (
	"testing"
	"time"

	"github.com/meterline/meterline/schemas"
)

// TestBalanceCapsUntil (docs/entitlements.md, Topics): a balance's
// caps_until is the earliest effective time after its updated_at at which
// the records read so far change the caps or unmetered in effect for the
// customer: its own record scheduled for later; the default plan's while
// the customer is on it, or will be until its own record takes effect;
// not the default plan's behind the customer's own record, nor a version
// that changes only what the gate does not read (grants, plan name). 0
// when nothing is scheduled. Through a ResolveCache and without one.
func TestBalanceCapsUntil(t *testing.T) {
	min := func(m int) int64 { return time.Date(2026, 11, 10, 12, m, 0, 0, time.UTC).UnixMilli() }
	capped := func(customer string, limit, from int64) *schemas.Entitlements {
		return &schemas.Entitlements{CustomerID: customer, Plan: "p", EffectiveFrom: from, Overdraft: schemas.Overdraft{Policy: schemas.OverdraftAllow},
			Caps: []schemas.Cap{{Meter: "api_calls", Limit: limit, OnLimit: schemas.OnLimitReject}}}
	}
	def := []byte(schemas.DefaultPlanKey)
	key := func(c string) []byte { return schemas.CustomerKey(c) }
	type rec struct {
		key []byte
		m   *schemas.Entitlements
		at  int64
	}
	unmetered := capped("up", 0, min(30))
	unmetered.Unmetered, unmetered.Caps = true, nil
	grantsOnly := capped("", 10, min(20))
	grantsOnly.Plan, grantsOnly.Grants = "renamed", []schemas.Grant{{ID: "g", Amount: 5}}
	for _, c := range []struct {
		name     string
		recs     []rec
		customer string
		at       int64
		want     int64
	}{
		{"nothing scheduled", []rec{{def, capped("", 10, 0), min(0)}, {key("own"), capped("own", 2, 0), min(1)}}, "own", min(5), 0},
		{"own raise scheduled", []rec{{key("own"), capped("own", 2, 0), min(1)}, {key("own"), capped("own", 10, min(14)), min(2)}},
			"own", min(5), min(14)},
		{"own raise in effect", []rec{{key("own"), capped("own", 2, 0), min(1)}, {key("own"), capped("own", 10, min(14)), min(2)}},
			"own", min(14), 0},
		{"own unmetered scheduled", []rec{{key("up"), capped("up", 2, 0), min(1)}, {key("up"), unmetered, min(2)}}, "up", min(5), min(30)},
		{"default plan's raise, customer on it", []rec{{def, capped("", 2, 0), min(0)}, {def, capped("", 10, min(20)), min(2)}},
			"dflt", min(5), min(20)},
		{"default plan's raise behind the own record", []rec{{def, capped("", 2, 0), min(0)}, {key("own"), capped("own", 2, 0), min(1)},
			{def, capped("", 10, min(20)), min(2)}}, "own", min(5), 0},
		{"default plan's raise before the own record takes effect", []rec{{def, capped("", 2, 0), min(0)},
			{key("late"), capped("late", 2, min(40)), min(1)}, {def, capped("", 10, min(20)), min(2)}}, "late", min(5), min(20)},
		{"default plan's unchanged caps, own record's change", []rec{{def, capped("", 10, 0), min(0)},
			{key("late"), capped("late", 2, min(40)), min(1)}, {def, grantsOnly, min(2)}}, "late", min(5), min(40)},
		{"a default plan where there was none", []rec{{def, capped("", 10, min(20)), min(2)}}, "none", min(5), min(20)},
		{"a version whose caps are the same", []rec{{def, capped("", 10, 0), min(0)}, {def, grantsOnly, min(2)}}, "dflt", min(5), 0},
	} {
		for _, cached := range []bool{false, true} {
			l, err := New(Config{Prefix: []byte("e"), Period: monthBounds})
			if err != nil {
				t.Fatal(err)
			}
			var st Store = newMemStore()
			if cached {
				st = newBenchStore(l)
			}
			for _, r := range c.recs {
				var m schemas.Message
				if r.m != nil {
					m = r.m
				}
				applyTo(t, l, st, r.key, m, r.at)
			}
			b, err := l.Balance(st, c.customer, c.at, 1)
			if err != nil {
				t.Fatal(err)
			}
			if b.CapsUntil != c.want {
				t.Errorf("%s (resolve cache %v): caps_until %d, want %d", c.name, cached, b.CapsUntil, c.want)
			}
		}
	}
}
