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
