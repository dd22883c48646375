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
// the account back as it was before the event, whether the Ledger writes
// accounts at once or keeps them in an AccountCache; a rejected decision
// has no charge, and a charge that does not decode is refused.
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
			if err := l.Refund(st, "acme", ev(1200), charge); err != nil {
				t.Fatal(err)
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
			for _, bad := range [][]byte{nil, {1}, append(bytes.Clone(charge), 0)} {
				if err := l.Refund(st, "acme", ev(1200), bad); !errors.Is(err, ErrCorrupt) {
					t.Errorf("Refund of %x: %v, want ErrCorrupt", bad, err)
				}
			}
		})
	}
}
