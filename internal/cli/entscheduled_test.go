package cli

import (
	"strings"
	"testing"
)

// TestEntitlementsGetScheduled: a record scheduled for later (an
// effective_from in the future) is what get and list print, but the
// aggregator applies the record before it until then: get says which one
// applies now (the customer's earlier record, or the default plan when
// there is none or it was deleted), on stderr, so that the cap in effect
// is not mistaken.
func TestEntitlementsGetScheduled(t *testing.T) {
	onKafkas(t, testEntitlementsGetScheduled)
}

func testEntitlementsGetScheduled(t *testing.T, brokers []string) {
	_, ent, must := entCommands(t, brokers, "entsched")
	file := tempFiles(t)
	must("", "set", "acme", "-f", file("now.yaml", "plan: small\ncaps: {api_calls: {limit: 1000}}\n"))
	later := file("later.yaml", "plan: big\neffective_from: \"2099-01-01T00:00:00Z\"\ncaps: {api_calls: {limit: 2000}}\n")
	must("", "set", "acme", "-f", later)
	must("", "set", "globex", "-f", later)
	must("", "set", "initech", "-f", file("gone.yaml", "plan: gone\n"))
	must("", "delete", "initech")
	must("", "set", "initech", "-f", later)
	must("", "set-default", "-f", file("free.yaml", "plan: free\n"))
	must("", "set-default", "-f", later)

	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"get", "acme"}, `until then, the record written at `},
		{[]string{"get", "acme"}, `(plan "small") applies`},
		{[]string{"get", "globex"}, "until then, the default plan applies"},
		{[]string{"get", "initech"}, "until then, the default plan applies"},
		{[]string{"get", "--default"}, `(plan "free") applies`},
		{[]string{"list"}, `acme: scheduled from 2099-01-01T00:00:00.000Z: until then, the record written at `},
	} {
		code, out, errOut := ent("", c.args...)
		if code != 0 || !strings.Contains(out, "2099-01-01") {
			t.Fatalf("%v: %d\n%s\n%s", c.args, code, out, errOut)
		}
		if !strings.Contains(errOut, "scheduled from 2099-01-01T00:00:00.000Z") || !strings.Contains(errOut, c.want) {
			t.Errorf("%v: stderr does not say %q:\n%s", c.args, c.want, errOut)
		}
	}
}
