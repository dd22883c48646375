package entitlements

import (
	"bytes"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/meterline/meterline/schemas"
)

// FuzzStateDecode: state values that do not decode are ErrCorrupt, never a
// panic; what decodes re-encodes to the same bytes.
func FuzzStateDecode(f *testing.F) {
	var tl Timeline
	p, _ := NewPlan(&schemas.Entitlements{Plan: "p", Caps: []schemas.Cap{{Meter: "m", Limit: 3, OnLimit: schemas.OnLimitAllow}},
		Grants: []schemas.Grant{{ID: "g", Amount: 5, ExpiresAt: 9}}, Overdraft: schemas.Overdraft{Policy: schemas.OverdraftDeny}})
	_ = tl.Set(1, 0, p)
	_ = tl.Set(2, 5, nil)
	b, _ := tl.MarshalBinary()
	f.Add(b)
	var h RateHistory
	_ = h.Set(3, &schemas.RateCard{Versions: []schemas.RateVersion{{EffectiveFrom: 1, Rates: []schemas.Rate{{Meter: "a", MicroCredits: 1, PerUnits: 2}}}}})
	b, _ = h.MarshalBinary()
	f.Add(b)
	acct := &Account{uses: []grantUse{{"g", 4, 3, 9}}}
	ap, _ := acct.addPeriod(7)
	ap.add("m", 2)
	b, _ = acct.MarshalBinary()
	f.Add(b)
	f.Add(appendDefaultGrants(nil, []defaultGrant{{id: "a", gen: 4, exp: 9}, {id: "b", gen: 5, exp: math.MaxInt64}}))
	f.Add([]byte{stateFormat})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) { checkStateDecode(t, b) })
}

// checkStateDecode is FuzzStateDecode's property of b, read as each kind
// of state value: what does not decode is ErrCorrupt, never a panic; what
// decodes re-encodes stably. It returns the timeline b decodes to (nil if
// none).
func checkStateDecode(t *testing.T, b []byte) *Timeline {
	t.Helper()
	if es, err := decodeDefaultGrants(b); err != nil {
		if !errors.Is(err, ErrCorrupt) {
			t.Fatalf("grant expiries: %v", err)
		}
	} else {
		again := appendDefaultGrants(nil, es)
		es2, err := decodeDefaultGrants(again)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(again, appendDefaultGrants(nil, es2)) {
			t.Fatal("grant expiries encoding not stable")
		}
	}
	var a Account
	if err := a.UnmarshalBinary(b); err != nil {
		if !errors.Is(err, ErrCorrupt) {
			t.Fatalf("account: %v", err)
		}
	} else {
		// Varints may be written longer than needed; what decoded
		// must re-encode stably.
		again, _ := a.MarshalBinary()
		var a2 Account
		if err := a2.UnmarshalBinary(again); err != nil {
			t.Fatal(err)
		}
		if again2, _ := a2.MarshalBinary(); !bytes.Equal(again, again2) {
			t.Fatal("account encoding not stable")
		}
	}
	tl := new(Timeline)
	if err := tl.UnmarshalBinary(b); err != nil {
		if !errors.Is(err, ErrCorrupt) {
			t.Fatalf("timeline: %v", err)
		}
		tl = nil
	} else if again, _ := tl.MarshalBinary(); !bytes.Equal(again, b) {
		// A plan is re-validated and its grants re-sorted; the
		// encoding of what decoded must be stable from then on.
		var tl2 Timeline
		if err := tl2.UnmarshalBinary(again); err != nil {
			t.Fatal(err)
		}
		if again2, _ := tl2.MarshalBinary(); !bytes.Equal(again, again2) {
			t.Fatal("timeline encoding not stable")
		}
	}
	var h RateHistory
	if err := h.UnmarshalBinary(b); err != nil {
		if !errors.Is(err, ErrCorrupt) {
			t.Fatalf("rates: %v", err)
		}
	} else {
		// Varints may be written longer than needed; what decoded
		// must re-encode to bytes that decode to the same history.
		again, _ := h.MarshalBinary()
		var h2 RateHistory
		if err := h2.UnmarshalBinary(again); err != nil {
			t.Fatal(err)
		}
		if again2, _ := h2.MarshalBinary(); !bytes.Equal(again, again2) {
			t.Fatal("rate history encoding not stable")
		}
	}
	return tl
}

// FuzzParseDocument: no document crashes the parser or the validation.
func FuzzParseDocument(f *testing.F) {
	f.Add([]byte("plan: free\ncaps: {api_calls: {limit: 1000}}\ngrants: {p: {amount: 5, expires_at: \"2027-01-01T00:00:00Z\"}}\n"))
	f.Add([]byte("versions: [{effective_from: \"2026-12-01T00:00:00Z\", rates: {a: 15/1000}}]\n"))
	f.Add([]byte("caps: {x: {limit: \"1\"}}"))
	f.Fuzz(func(t *testing.T, b []byte) {
		if d, err := ParseDocument(b); err == nil {
			if e, err := d.Record("c", nil); err == nil {
				if _, err := NewPlan(e); err != nil {
					t.Fatalf("a document that validates makes an invalid plan: %v", err)
				}
			}
		}
		if d, err := ParseRatesDocument(b); err == nil {
			if c, err := d.Card(nil); err == nil {
				var h RateHistory
				if err := h.Set(1, c); err != nil {
					t.Fatalf("a card that validates is refused: %v", err)
				}
			}
		}
	})
}

// FuzzParseRecord: any key and value of usage.entitlements (any client may
// write them) parses or is refused with a reason code; never a panic.
func FuzzParseRecord(f *testing.F) {
	v, _ := schemas.Encode(&schemas.Entitlements{CustomerID: "acme", Overdraft: schemas.Overdraft{Policy: schemas.OverdraftAllow}})
	f.Add([]byte("4:acme"), v)
	c, _ := schemas.Encode(&schemas.RateCard{})
	f.Add([]byte(schemas.RateCardKey), c)
	f.Fuzz(func(t *testing.T, k, v []byte) {
		r, err := ParseRecord(k, v, 1)
		if err != nil {
			switch Reason(err) {
			case schemas.ReasonInvalid, schemas.ReasonUndecodable, schemas.ReasonUnknownSchema:
			default:
				t.Fatalf("reason %q for %v", Reason(err), err)
			}
			return
		}
		l, _ := New(Config{Prefix: []byte("e"), Period: monthBounds, Window: time.Hour})
		st := newMemStore()
		if err := l.Apply(st, r); err != nil && !errors.Is(err, ErrInvalid) {
			t.Fatal(err)
		}
	})
}
