package entitlements

import (
	"strings"
	"testing"
)

// TestOverdraftLimitZeroRefused: `overdraft: {policy: allow, limit: 0}`
// reads as "overdraw nothing", but a limit of 0 is the record's "no
// limit": the document validated and the customer could overdraw without
// bound. It is refused, naming the two ways to say either; a document
// without a limit still means none.
func TestOverdraftLimitZeroRefused(t *testing.T) {
	for _, doc := range []string{
		"overdraft: {policy: allow, limit: 0}\n",
		"overdraft: {limit: 0}\n",
		"overdraft: {policy: allow, limit: \"0\"}\n",
		"overdraft: {policy: allow, limit: 0e3}\n",
	} {
		d, err := ParseDocument([]byte(doc))
		if err != nil {
			t.Fatalf("%q: %v", doc, err)
		}
		e, err := d.Record("acme", nil)
		if err == nil {
			t.Errorf("%q: accepted as %+v (a limit of 0 is no limit); want it refused", doc, e.Overdraft)
			continue
		}
		if !strings.Contains(err.Error(), "overdraft.limit: ") || !strings.Contains(err.Error(), "policy: deny") {
			t.Errorf("%q: %v; want overdraft.limit refused, pointing to policy: deny", doc, err)
		}
	}
	for doc, want := range map[string]int64{
		"overdraft: {policy: allow}\n":             0,
		"overdraft: {policy: allow, limit: 5}\n":   5,
		"overdraft: {policy: deny}\n":              0,
		"plan: free\n":                             0,
		"overdraft: {policy: allow, limit: 1e3}\n": 1000,
	} {
		d, err := ParseDocument([]byte(doc))
		if err != nil {
			t.Fatalf("%q: %v", doc, err)
		}
		e, err := d.Record("acme", nil)
		if err != nil || e.Overdraft.Limit != want {
			t.Errorf("%q: %+v, %v; want limit %d", doc, e, err, want)
		}
		// What get prints, set accepts.
		if _, err := DocumentOf(e, 0).Record("acme", nil); err != nil {
			t.Errorf("%q printed back: %v", doc, err)
		}
	}
}

// TestSubMillisecondTimeRefused: times are kept to the millisecond; a
// time written more precisely was cut to the millisecond before it, so a
// grant written to expire at 23:59:59.9995 stopped paying for events of
// 23:59:59.999, and get printed another time than the one written. Such
// a time is refused, naming the field.

func TestSubMillisecondTimeRefused(t *testing.T) {
	doc := "effective_from: \"2026-12-01T00:00:00.0005Z\"\n" +
		"grants:\n  promo: {amount: 5, effective_from: \"2026-12-01T00:00:00.000001Z\", expires_at: \"2026-12-31T23:59:59.9995+00:00\"}\n"
	d, err := ParseDocument([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	e, err := d.Record("acme", nil)
	if err == nil {
		t.Fatalf("accepted: effective_from %s, grant %s to %s", FormatTime(e.EffectiveFrom),
			FormatTime(e.Grants[0].EffectiveFrom), FormatTime(e.Grants[0].ExpiresAt))
	}
	for _, f := range []string{"effective_from: ", "grants.promo.effective_from: ", "grants.promo.expires_at: "} {
		if !strings.Contains(err.Error(), f) || !strings.Contains(err.Error(), "millisecond") {
			t.Errorf("%v; want %s refused as more precise than a millisecond", err, f)
		}
	}
	rd, err := ParseRatesDocument([]byte("versions:\n  - effective_from: \"2026-12-01T00:00:00.0001Z\"\n    rates: {tokens: 1}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rd.Card(nil); err == nil || !strings.Contains(err.Error(), "versions[0].effective_from: ") {
		t.Errorf("a rate version from a sub-millisecond time: %v; want refused", err)
	}
	// Trailing zeros are the millisecond itself.
	for _, s := range []string{"2026-12-01T00:00:00.500000Z", "2026-12-01T00:00:00.5Z", "2026-12-01T01:00:00.123000000+01:00", "2026-12-01T00:00:00Z"} {
		if _, err := ParseTime(s); err != nil {
			t.Errorf("ParseTime(%s): %v", s, err)
		}
	}
}
