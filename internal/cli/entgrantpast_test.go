package cli

import (
	"strings"
	"testing"
)

// TestEntitlementsNoteGrantExpired: a customer's record or a default plan
// with a grant whose expires_at is already past says so on stderr (a
// mistyped year, most likely): the grant pays only for late events, whose
// event_time is before its expiry. A grant that expires later, or never,
// gets no note.
func TestEntitlementsNoteGrantExpired(t *testing.T) {
	for _, c := range []struct {
		cmd  []string
		doc  string
		note string // "": none
	}{
		{[]string{"set"}, "customer: acme\noverdraft: {policy: deny}\ngrants: {old: {amount: 5, expires_at: \"2020-02-01T00:00:00Z\"}, new: {amount: 5, expires_at: \"2999-01-01T00:00:00Z\"}}\n",
			"note: grant old expires at 2020-02-01T00:00:00.000Z, in the past:"},
		{[]string{"set-default"}, "plan: free\noverdraft: {policy: deny}\ngrants: {old: {amount: 5, expires_at: \"2020-02-01T00:00:00Z\"}}\n",
			"note: grant old expires at 2020-02-01T00:00:00.000Z, in the past:"},
		{[]string{"set"}, "customer: acme\noverdraft: {policy: deny}\ngrants: {new: {amount: 5, expires_at: \"2999-01-01T00:00:00Z\"}, ever: {amount: 5}}\n", ""},
	} {
		args := append(append([]string{"entitlements"}, c.cmd...), "--validate")
		code, _, errs := run(t, c.doc, args...)
		if code != 0 || c.note == "" && strings.Contains(errs, "in the past") || c.note != "" && !strings.Contains(errs, c.note) ||
			strings.Contains(errs, "grant new") || strings.Contains(errs, "grant ever") {
			t.Errorf("%v of %q: exit %d, stderr %q; want exit 0, note %q", c.cmd, c.doc, code, errs, c.note)
		}
	}
}
