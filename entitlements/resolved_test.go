package entitlements

import (
	"testing"
	"time"

	"github.com/meterline/meterline/schemas"
)

// applyTo applies a record of usage.entitlements (m nil: a tombstone)
// read at written.
func applyTo(t *testing.T, l *Ledger, st Store, key []byte, m schemas.Message, written int64) {
	t.Helper()
	var v []byte
	if m != nil {
		var err error
		if v, err = schemas.Encode(m); err != nil {
			t.Fatal(err)
		}
	}
	rec, err := ParseRecord(key, v, written)
	if err == nil {
		err = l.Apply(st, rec)
	}
	if err != nil {
		t.Fatal(err)
	}
}

// TestResolvedFollowsRecords: through a ResolveCache, each event is
// decided by the plan in effect at its arrival, across a version of the
// customer's own that takes effect later and back before it, and a new
// Resolved comes with every change of the customer's entitlements, the
// default plan or the rate card.
func TestResolvedFollowsRecords(t *testing.T) {
	l, err := New(Config{Prefix: []byte("e"), Period: monthBounds})
	if err != nil {
		t.Fatal(err)
	}
	st := newBenchStore(l)
	day := func(m time.Month, d int) int64 { return time.Date(2026, m, d, 0, 0, 0, 0, time.UTC).UnixMilli() }
	plan := func(name string) *schemas.Entitlements {
		return &schemas.Entitlements{Plan: name, Overdraft: schemas.Overdraft{Policy: schemas.OverdraftAllow}}
	}
	acme := schemas.CustomerKey("acme")
	applyTo(t, l, st, []byte(schemas.DefaultPlanKey), plan("default-a"), day(1, 1))
	own := plan("own-b")
	own.CustomerID, own.EffectiveFrom = "acme", day(2, 1)
	applyTo(t, l, st, acme, own, day(1, 2))
	decide := func(arrival int64, want string) {
		t.Helper()
		d, err := l.Evaluate(st, "acme", Event{Meter: "api_calls", Aggregation: "SUM", Quantity: 1, EventTime: arrival - 1, Arrival: arrival})
		if err != nil {
			t.Fatal(err)
		}
		got := "none"
		if d.Plan != nil {
			got = d.Plan.Name
		}
		if got != want {
			t.Fatalf("arrival %s: plan %s, want %s", time.UnixMilli(arrival).UTC(), got, want)
		}
	}
	decide(day(1, 10), "default-a")
	decide(day(1, 20), "default-a")
	decide(day(2, 1), "own-b")
	decide(day(2, 10), "own-b")
	decide(day(1, 31), "default-a")
	applyTo(t, l, st, []byte(schemas.DefaultPlanKey), plan("default-c"), day(1, 3))
	decide(day(1, 10), "default-c")
	decide(day(2, 10), "own-b")
	applyTo(t, l, st, acme, nil, day(1, 4))
	decide(day(2, 10), "default-c")
	applyTo(t, l, st, []byte(schemas.RateCardKey), &schemas.RateCard{Versions: []schemas.RateVersion{{Rates: []schemas.Rate{
		{Meter: "api_calls", MicroCredits: 7, PerUnits: 1}}}}}, day(1, 5))
	d, err := l.Evaluate(st, "acme", Event{Meter: "api_calls", Aggregation: "SUM", Quantity: 2, EventTime: day(1, 9), Arrival: day(1, 10)})
	if err != nil || d.Cost != 14 {
		t.Fatalf("after a new rate card: cost %d, %v; want 14", d.Cost, err)
	}
}
