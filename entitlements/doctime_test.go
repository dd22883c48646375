package entitlements

import (
	"encoding/json"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// TestDocumentTimesPrintBack: every time a document is accepted with is
// one get prints back in a form set accepts (times print in UTC, RFC
// 3339 has four-digit years). "9999-12-31T23:59:59-05:00", an operator's
// "never" written in local time, is 10000-01-01 in UTC: it was accepted,
// and get printed 10000-01-01T04:59:59.000Z, which set then refused. Such
// a time is refused, naming the latest; the last millisecond of 9999 in
// UTC is accepted and prints back.
func TestDocumentTimesPrintBack(t *testing.T) {
	doc := func(expires string) string {
		return "customer: acme\nplan: pro\neffective_from: " + expires + "\ngrants:\n  forever: {amount: 5, expires_at: " + expires + "}\n"
	}
	for _, c := range []struct {
		at  string
		bad bool
	}{{`"9999-12-31T23:59:59.999Z"`, false}, {`"9999-12-31T23:59:59-05:00"`, true}, {`"9999-12-31T23:59:59.999-00:01"`, true}} {
		d, err := ParseDocument([]byte(doc(c.at)))
		if err != nil {
			t.Fatal(err)
		}
		e, err := d.Record("acme", nil)
		if c.bad {
			if err == nil || !strings.Contains(err.Error(), "grants.forever.expires_at: ") || !strings.Contains(err.Error(), "effective_from: ") ||
				!strings.Contains(err.Error(), "9999-12-31T23:59:59.999Z") {
				t.Errorf("%s: %v; want effective_from and expires_at refused, naming the latest time", c.at, err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", c.at, err)
		}
		checkRoundTrip(t, yaml.Marshal, e, 0)
		checkRoundTrip(t, json.Marshal, e, 0)
	}
	rd, err := ParseRatesDocument([]byte("versions:\n  - effective_from: \"9999-12-31T23:00:00-02:00\"\n    rates: {tokens: 1}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rd.Card(nil); err == nil || !strings.Contains(err.Error(), "versions[0].effective_from: ") {
		t.Errorf("a rate version from 10000-01-01 in UTC: %v; want refused", err)
	}
}
