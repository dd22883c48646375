package entitlements

import (
	"errors"
	"math"
	"testing"
	"time"
)

// FuzzChargeDecode: a charge kept in the state (Decision.AppendCharge, in
// either format: with generations, or as written before them) that does
// not decode is an error wrapping ErrCorrupt when Refund reads it, never a
// panic, and a Refund takes back no more than the account holds (nothing
// goes below zero).
func FuzzChargeDecode(f *testing.F) {
	d := Decision{Outcome: Accepted, Units: 5, Overdraft: 2, Draws: []Draw{{Grant: "g", Amount: 3, gen: 7}, {Grant: "h", Amount: 1, gen: legacyGen}}}
	f.Add(d.AppendCharge(nil))
	old := newEnc(16) // a charge as written before generations
	old.int(5)
	old.int(0)
	old.count(1)
	old.str("g")
	old.int(3)
	f.Add(old.bytes())
	f.Add([]byte{stateFormatGen})
	f.Add([]byte{stateFormatGen, 0, 0, 1, 1, 'g', 1, 0x80})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		l, err := New(Config{Prefix: []byte("e"), Period: monthBounds, Window: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		st := newMemStore()
		a := &Account{uses: []grantUse{{id: "g", gen: 7, consumed: 2, own: 9}, {id: "h", gen: legacyGen, consumed: 1}}}
		p, _ := a.addPeriod(0)
		p.add("m", 4)
		p.overdrawn = 1
		l.WriteAccount(st, "acme", a, nil)
		ev := Event{Meter: "m", Aggregation: "SUM", Quantity: 5, EventTime: 10, Arrival: 10}
		if _, err := l.Refund(st, "acme", ev, b); err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("refund: %v", err)
			}
			return
		}
		got, err := l.account(st, "acme")
		if err != nil {
			t.Fatal(err)
		}
		for _, u := range got.uses {
			if u.consumed < 0 || u.consumed > 2 {
				t.Fatalf("grant %s/%d consumed %d after a refund", u.id, u.gen, u.consumed)
			}
		}
		if pu := got.period(0); pu != nil && (pu.units("m") < 0 || pu.overdrawn < 0) {
			t.Fatalf("period after a refund: %+v", pu)
		}
	})
}

// FuzzStateDecodeEarlierFormat: FuzzStateDecode's property (corrupt state
// is ErrCorrupt, never a panic; what decodes re-encodes stably), seeded
// with values of the format written before grants had generations, which
// the decoders of accounts, timelines and the default plan's grants still
// read, and with values that mix the two.
func FuzzStateDecodeEarlierFormat(f *testing.F) {
	acct := newEnc(32)
	acct.count(2)
	acct.str("a")
	acct.int(800)
	acct.int(math.MinInt64) // paid, no version seen (the earlier build)
	acct.str("b")
	acct.int(0)
	acct.int(99)
	acct.count(1)
	acct.int(0)
	acct.int(3)
	acct.count(1)
	acct.str("m")
	acct.int(4)
	f.Add(acct.bytes())
	tl := newEnc(64)
	tl.count(1)
	tl.int(5)
	tl.bool(true)
	tl.str("p")
	tl.bool(false)
	tl.count(0)
	tl.count(2)
	tl.str("z")
	tl.int(10)
	tl.int(0)
	tl.int(0)
	tl.int(50)
	tl.str("a")
	tl.int(10)
	tl.int(1)
	tl.int(0)
	tl.int(0)
	tl.bool(false)
	tl.int(0)
	f.Add(tl.bytes())
	dg := newEnc(16)
	dg.count(2)
	dg.str("a")
	dg.int(9)
	dg.str("b")
	dg.int(math.MaxInt64)
	f.Add(dg.bytes())
	// A timeline of the later format whose grants are out of draw order
	// (their generations must follow them).
	tg := newEncFormat(64, stateFormatGen)
	tg.count(1)
	tg.int(5)
	tg.bool(true)
	tg.str("p")
	tg.bool(false)
	tg.count(0)
	tg.count(2)
	tg.str("z")
	tg.int(10)
	tg.int(0)
	tg.int(0)
	tg.int(50)
	tg.int(111) // z's generation
	tg.str("a")
	tg.int(10)
	tg.int(1)
	tg.int(0)
	tg.int(0)
	tg.int(222) // a's generation
	tg.bool(false)
	tg.int(0)
	f.Add(tg.bytes())
	f.Fuzz(func(t *testing.T, b []byte) {
		tl := checkStateDecode(t, b)
		if tl == nil {
			return
		}
		// Each grant keeps its generation through a re-encoding.
		again, _ := tl.MarshalBinary()
		var tl2 Timeline
		if err := tl2.UnmarshalBinary(again); err != nil {
			t.Fatalf("timeline re-encoded: %v", err)
		}
		for i, v := range tl.Versions() {
			w := tl2.Versions()[i]
			if (v.Plan == nil) != (w.Plan == nil) {
				t.Fatalf("version %d: plan %v, re-encoded %v", i, v.Plan, w.Plan)
			}
			if v.Plan == nil {
				continue
			}
			for j, g := range v.Plan.Grants {
				if w.Plan.Grants[j].ID != g.ID || w.Plan.gen(j) != v.Plan.gen(j) {
					t.Fatalf("version %d grant %s: generation %d, re-encoded %s %d", i, g.ID, v.Plan.gen(j), w.Plan.Grants[j].ID, w.Plan.gen(j))
				}
			}
		}
	})
}
