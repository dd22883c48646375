package entitlements

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"reflect"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

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

// FuzzParseDocument: no document crashes the parser or the validation;
// what a document that validates makes, the stage accepts as it is
// written (ParseRecord of its encoding gives the same record), and the
// document printed back (`entitlements get`, YAML and JSON) makes the
// same record again (`entitlements set`).
func FuzzParseDocument(f *testing.F) {
	f.Add([]byte("plan: free\ncaps: {api_calls: {limit: 1000}}\ngrants: {p: {amount: 5, expires_at: \"2027-01-01T00:00:00Z\"}}\n"))
	f.Add([]byte("versions: [{effective_from: \"2026-12-01T00:00:00Z\", rates: {a: 15/1000}}]\n"))
	f.Add([]byte("caps: {x: {limit: \"1\"}}"))
	f.Add([]byte("customer: c\neffective_from: \"2026-12-01T00:00:00.5Z\"\nunmetered: true\ncaps: {a: {limit: 1, on_limit: Allow}}\n" +
		"grants: {g: {amount: 9, priority: 3, effective_from: \"2026-12-01T00:00:00Z\"}}\noverdraft: {policy: DENY}\n"))
	f.Add([]byte(`{"versions":[{"effective_from":"2026-12-01T00:00:00Z","rates":{"a":"0.015","b":7}},{"effective_from":"2027-01-01T00:00:00Z","rates":{}}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		if d, err := ParseDocument(b); err == nil {
			if e, err := d.Record("c", nil); err == nil {
				if _, err := NewPlan(e); err != nil {
					t.Fatalf("a document that validates makes an invalid plan: %v", err)
				}
				r, err := ParseRecord(schemas.CustomerKey("c"), schemas.MustEncode(e), 1)
				if err != nil {
					t.Fatalf("the stage refuses the record of a document that validates: %v", err)
				}
				if !reflect.DeepEqual(r.Entitlements, e) {
					t.Fatalf("the stage reads\n%#v\nfor the record\n%#v", r.Entitlements, e)
				}
				for _, out := range printed(t, DocumentOf(e, 1)) {
					d2, err := ParseDocument(out)
					if err != nil {
						t.Fatalf("the printed document %s does not parse: %v", out, err)
					}
					e2, err := d2.Record("c", nil)
					if err != nil || !reflect.DeepEqual(e2, e) {
						t.Fatalf("the printed document %s makes\n%#v (%v), not\n%#v", out, e2, err, e)
					}
				}
			}
		}
		if d, err := ParseRatesDocument(b); err == nil {
			if c, err := d.Card(nil); err == nil {
				var h RateHistory
				if err := h.Set(1, c); err != nil {
					t.Fatalf("a card that validates is refused: %v", err)
				}
				if _, err := ParseRecord([]byte(schemas.RateCardKey), schemas.MustEncode(c), 1); err != nil {
					t.Fatalf("the stage refuses the rate card of a document that validates: %v", err)
				}
				for _, out := range printed(t, RatesDocumentOf(c, 1)) {
					d2, err := ParseRatesDocument(out)
					if err != nil {
						t.Fatalf("the printed rates %s do not parse: %v", out, err)
					}
					c2, err := d2.Card(nil)
					if err != nil || !reflect.DeepEqual(c2, c) {
						t.Fatalf("the printed rates %s make\n%#v (%v), not\n%#v", out, c2, err, c)
					}
				}
			}
		}
	})
}

// printed is a document as `entitlements get` prints it, in YAML and in
// JSON.
func printed(t *testing.T, doc any) [][]byte {
	y, err := yaml.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	j, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	return [][]byte{y, j}
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
