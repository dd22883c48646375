package cli

import (
	"strings"
	"testing"
)

// TestEntitlementsUndeclaredMeter: with --meters, a cap or a rate on a
// meter the file does not declare (a misspelt name: the cap would never
// meet an event of the meter meant) is written, for an undeclared meter
// counts as SUM, but named on stderr.
func TestEntitlementsUndeclaredMeter(t *testing.T) {
	file := tempFiles(t)
	meters := file("meters.yaml", "meters:\n  - name: api_calls\n  - name: tokens\n")
	for _, c := range []struct {
		args []string
		doc  string
	}{
		{[]string{"set", "acme"}, "caps: {api_call: {limit: 10}, tokens: {limit: 5}}\n"},
		{[]string{"set-default"}, "caps: {api_call: {limit: 10}}\n"},
		{[]string{"set-rates"}, "versions:\n- effective_from: \"2026-01-01T00:00:00Z\"\n  rates: {api_call: 1, tokens: 2}\n"},
	} {
		args := append(append([]string{"entitlements"}, c.args...), "-f", file("doc.yaml", c.doc), "--meters", meters, "--validate")
		code, out, errOut := run(t, "", args...)
		if code != 0 || !strings.Contains(out, "valid") {
			t.Fatalf("%v: %d\n%s\n%s", c.args, code, out, errOut)
		}
		if !strings.Contains(errOut, "does not declare api_call") || strings.Contains(errOut, "tokens") {
			t.Errorf("%v: stderr does not name api_call (only) as undeclared:\n%s", c.args, errOut)
		}
	}
}
