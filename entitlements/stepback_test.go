package entitlements

import (
	"fmt"
	"testing"
	"time"

	"github.com/meterline/meterline/schemas"
)

// TestStepBackRecordDecidesAlike: a record of usage.entitlements whose
// broker time is earlier than what the partition has been read up to (a
// broker clock that stepped back, or a leader moved to a broker whose clock
// is behind) takes effect no earlier than that read-to time. An event that
// arrived before it may have been decided already (a stage caught up), or
// not yet (a stage that lags, or a replay that read the entitlements
// partition further first): both decide it alike (docs/entitlements.md, The
// ordering rule: broker time: "a replay, or an aggregator an hour behind,
// decides alike"). For a customer's record, the default plan and the rate
// card.
func TestStepBackRecordDecidesAlike(t *testing.T) {
	base := time.Date(2026, time.December, 1, 0, 0, 0, 0, time.UTC).UnixMilli()
	const minute = int64(time.Minute / time.Millisecond)
	capped := func(customer string) []byte {
		v, err := schemas.Encode(&schemas.Entitlements{CustomerID: customer, Plan: "free",
			Caps:      []schemas.Cap{{Meter: "api_calls", Limit: 1, OnLimit: schemas.OnLimitReject}},
			Overdraft: schemas.Overdraft{Policy: schemas.OverdraftAllow}})
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	card := func(micro int64) []byte {
		v, err := schemas.Encode(&schemas.RateCard{Versions: []schemas.RateVersion{{EffectiveFrom: 0,
			Rates: []schemas.Rate{{Meter: "api_calls", MicroCredits: micro, PerUnits: 1}}}}})
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	type rec struct {
		key, value []byte
		written    int64
	}
	for _, c := range []struct {
		name  string
		first []rec // read before the tick
		late  rec   // read after the tick, its broker time behind it
	}{
		{"customer", nil, rec{schemas.CustomerKey("acme"), capped("acme"), base + 10*minute}},
		{"default plan", nil, rec{[]byte(schemas.DefaultPlanKey), capped(""), base + 10*minute}},
		{"rate card", []rec{{[]byte(schemas.RateCardKey), card(1), base}}, rec{[]byte(schemas.RateCardKey), card(7), base + 10*minute}},
	} {
		t.Run(c.name, func(t *testing.T) {
			// The event arrived after the late record's broker time and
			// before the tick's: a stage that read the tick may decide it.
			ev := Event{Meter: "api_calls", Aggregation: "SUM", Quantity: 5, EventTime: base + 20*minute, Arrival: base + 30*minute}
			tick := base + 60*minute
			decide := func(lagging bool) string {
				l, err := New(Config{Prefix: []byte("e"), Period: monthBounds})
				if err != nil {
					t.Fatal(err)
				}
				st := newMemStore()
				apply := func(r rec) {
					t.Helper()
					pr, err := ParseRecord(r.key, r.value, r.written)
					if err == nil {
						err = l.Apply(st, pr)
					}
					if err != nil {
						t.Fatal(err)
					}
				}
				for _, r := range c.first {
					apply(r)
				}
				if err := l.Advance(st, tick); err != nil {
					t.Fatal(err)
				}
				if rt, _ := l.ReadTo(st); ev.Arrival >= rt {
					t.Fatalf("the event (arrival %d) cannot be decided at read-to %d", ev.Arrival, rt)
				}
				var d Decision
				if !lagging {
					d, err = l.Decide(st, "acme", ev)
				}
				apply(c.late)
				if lagging {
					d, err = l.Decide(st, "acme", ev)
				}
				if err != nil {
					t.Fatal(err)
				}
				return fmt.Sprintf("%s cost %d overdraft %d", d.Outcome, d.Cost, d.Overdraft)
			}
			caughtUp, lagging := decide(false), decide(true)
			if caughtUp != lagging {
				t.Fatalf("decided before the late record was read: %s; after: %s", caughtUp, lagging)
			}
		})
	}
}
