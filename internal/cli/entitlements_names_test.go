package cli

import (
	"strings"
	"testing"

	"github.com/meterline/meterline/entitlements"
	"github.com/meterline/meterline/internal/testenv"
)

// TestEntitlementsGetOddNames: a record whose meter and grant id are
// names that set accepts (a quoted `<<`, one of MaxNameBytes written as
// an explicit key) is printed by get and list, in YAML, as a document
// that set accepts back, naming the same meters and grants.
func TestEntitlementsGetOddNames(t *testing.T) {
	_, brokers := testenv.KFake(t)
	names := testenv.Topics(t, brokers, "entnames", testenv.TopicsOpts{})
	file := tempFiles(t)
	read := func(args ...string) (int, string, string) {
		t.Helper()
		return run(t, "", append(append([]string{"entitlements"}, args...), "--brokers", strings.Join(brokers, ","),
			"--topic-prefix", names.Prefix)...)
	}
	ent := func(args ...string) (int, string, string) {
		t.Helper()
		return read(append(args, "--transactional-id", testenv.Name(t, "ent-writer"))...)
	}
	long := strings.Repeat("m", entitlements.MaxNameBytes)
	doc := "customer: acme\ncaps:\n  \"<<\": {limit: 5, on_limit: reject}\n  ? " + long + "\n  : {limit: 6, on_limit: reject}\n" +
		"grants:\n  \"<<\": {amount: 7}\n  ? " + long + "\n  : {amount: 8}\noverdraft: {policy: deny}\n"
	if code, out, errOut := ent("set", "-f", file("acme.yaml", doc)); code != 0 {
		t.Fatalf("set: %d\n%s\n%s", code, out, errOut)
	}
	want, err := entitlements.ParseDocument([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	for _, cmd := range [][]string{{"get", "acme"}, {"list"}} {
		code, out, errOut := read(cmd...)
		if code != 0 {
			t.Fatalf("%s: %d\n%s\n%s", cmd[0], code, out, errOut)
		}
		d, err := entitlements.ParseDocument([]byte(out))
		if err != nil {
			t.Fatalf("%s prints a document set refuses: %v\n%s", cmd[0], err, out)
		}
		for _, m := range []string{"<<", long} {
			if d.Caps[m] != want.Caps[m] || d.Grants[m] != want.Grants[m] {
				t.Errorf("%s: %.20q: cap %+v, grant %+v; want %+v, %+v", cmd[0], m, d.Caps[m], d.Grants[m], want.Caps[m], want.Grants[m])
			}
		}
		if code, out, errOut := ent("set", "--validate", "-f", file("back.yaml", out)); code != 0 {
			t.Errorf("set --validate of what %s prints: %d\n%s\n%s", cmd[0], code, out, errOut)
		}
	}
}
