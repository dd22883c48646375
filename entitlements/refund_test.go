package entitlements

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/meterline/meterline/schemas"
)

// TestRefund: Refund of what Record recorded for an accepted event (units
// of its meter in its period, draws from two grants, an overdraft) gives
// the account back as it was before the event and returns its
// micro-credits, whether the Ledger writes accounts at once or keeps them
// in an AccountCache; an accepted decision that charged nothing has a
// charge whose refund changes nothing, a rejected decision has none, and a
// charge that does not decode is refused.
func TestRefund(t *testing.T) {
	for _, cached := range []bool{false, true} {
		t.Run(map[bool]string{false: "store", true: "cache"}[cached], func(t *testing.T) {
			at := time.Date(2026, 3, 10, 12, 0, 0, 0, time.UTC).UnixMilli()
			l, err := New(Config{Prefix: []byte("e"), Period: monthBounds})
			if err != nil {
				t.Fatal(err)
			}
			ms := newMemStore()
			var st Store = ms
			commit := func() {}
			if cached {
				cs := newCachedStore(l)
				st, commit = cs, cs.commit
			}
			for _, r := range []struct {
				key string
				m   schemas.Message
			}{
				{string(schemas.CustomerKey("acme")), &schemas.Entitlements{CustomerID: "acme", Plan: "team",
					Caps:      []schemas.Cap{{Meter: "m", Limit: 10_000, OnLimit: schemas.OnLimitReject}},
					Grants:    []schemas.Grant{{ID: "g1", Amount: 300, Priority: 0}, {ID: "g2", Amount: 1000, Priority: 1}},
					Overdraft: schemas.Overdraft{Policy: schemas.OverdraftAllow}}},
				{schemas.RateCardKey, &schemas.RateCard{Versions: []schemas.RateVersion{{Rates: []schemas.Rate{{Meter: "m", MicroCredits: 1, PerUnits: 1}}}}}},
			} {
				v, _ := schemas.Encode(r.m)
				rec, err := ParseRecord([]byte(r.key), v, at-1000)
				if err == nil {
					err = l.Apply(st, rec)
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			ev := func(q int64) Event {
				return Event{Meter: "m", Aggregation: "SUM", Quantity: q, EventTime: at, Arrival: at}
			}
			if _, err := l.Decide(st, "acme", ev(500)); err != nil {
				t.Fatal(err)
			}
			commit()
			before := bytes.Clone(ms.m["eA"+string(schemas.CustomerKey("acme"))])
			d, err := l.Evaluate(st, "acme", ev(1200))
			if err != nil || d.Outcome != Accepted || len(d.Draws) != 1 || d.Draws[0].Grant != "g2" || d.Overdraft != 400 {
				t.Fatalf("the event to refund: %+v, %v; want g2's 800 and 400 overdrawn", d, err)
			}
			if err := l.Record(st, "acme", ev(1200), d); err != nil {
				t.Fatal(err)
			}
			charge := d.AppendCharge(nil)
			if cost, err := l.Refund(st, "acme", ev(1200), charge); err != nil || cost != 1200 {
				t.Fatalf("Refund: %d micro-credits, %v; want g2's 800 and 400 overdrawn", cost, err)
			}
			commit()
			if after := ms.m["eA"+string(schemas.CustomerKey("acme"))]; !bytes.Equal(after, before) {
				a, b := &Account{}, &Account{}
				_ = a.UnmarshalBinary(before)
				_ = b.UnmarshalBinary(after)
				t.Fatalf("account after the refund %v, want %v", b, a)
			}
			if d, _ := l.Evaluate(st, "acme", ev(20_000)); d.Outcome != OverLimit || len(d.AppendCharge(nil)) != 0 {
				t.Fatalf("a rejected decision's charge: %+v", d)
			}
			// An accepted event that records nothing (a MAX meter: no
			// usage, no rate) has a charge too, so that a stage knows it
			// was accepted: refunding it changes nothing and returns 0.
			peak := Event{Meter: "peak", Aggregation: "MAX", Quantity: 7, EventTime: at, Arrival: at}
			d0, err := l.Evaluate(st, "acme", peak)
			if err != nil || d0.Outcome != Accepted || d0.Units != 0 || d0.Cost != 0 {
				t.Fatalf("a MAX meter's event: %+v, %v; want accepted, nothing charged", d0, err)
			}
			c0 := d0.AppendCharge(nil)
			if len(c0) == 0 {
				t.Fatal("an accepted event that charged nothing has no charge")
			}
			before = bytes.Clone(ms.m["eA"+string(schemas.CustomerKey("acme"))])
			if cost, err := l.Refund(st, "acme", peak, c0); err != nil || cost != 0 {
				t.Fatalf("Refund of nothing: %d micro-credits, %v", cost, err)
			}
			commit()
			if after := ms.m["eA"+string(schemas.CustomerKey("acme"))]; !bytes.Equal(after, before) {
				t.Fatal("refunding a charge of nothing changed the account")
			}
			for _, bad := range [][]byte{nil, {1}, append(bytes.Clone(charge), 0)} {
				if _, err := l.Refund(st, "acme", ev(1200), bad); !errors.Is(err, ErrCorrupt) {
					t.Errorf("Refund of %x: %v, want ErrCorrupt", bad, err)
				}
			}
		})
	}
}
