package cli

import (
	"strings"
	"testing"

	"github.com/meterline/meterline/internal/testenv"
)

// TestEntitlementsDeleteRefusesNoRecord: delete of a customer that has no
// record (a misspelt customer_id), or whose record is deleted already,
// writes nothing and exits 1, naming the customer and --force; with
// --force it writes the delete. A customer with a record, in effect or
// only scheduled, is deleted as before.
func TestEntitlementsDeleteRefusesNoRecord(t *testing.T) {
	onKafkas(t, testEntitlementsDeleteRefusesNoRecord)
}

func testEntitlementsDeleteRefusesNoRecord(t *testing.T, brokers []string) {
	names := testenv.Topics(t, brokers, "entdel", testenv.TopicsOpts{})
	file := tempFiles(t)
	ent := func(args ...string) (int, string, string) {
		t.Helper()
		return run(t, "", append(append([]string{"entitlements"}, args...), "--brokers", strings.Join(brokers, ","), "--topic-prefix", names.Prefix)...)
	}
	count := func() int { return len(testenv.ReadAll(t, brokers, names.EntitlementsTopic())) }
	must := func(args ...string) {
		t.Helper()
		if code, out, errOut := ent(args...); code != 0 {
			t.Fatalf("%v: %d\n%s\n%s", args, code, out, errOut)
		}
	}
	refused := func(customer, want string) {
		t.Helper()
		before := count()
		code, out, errOut := ent("delete", customer)
		if code != 1 || !strings.Contains(errOut, want) || !strings.Contains(errOut, "--force") || !strings.Contains(errOut, "nothing was written") {
			t.Errorf("delete %s: exit %d, stdout %q, stderr %q; want exit 1, %q and --force", customer, code, out, errOut, want)
		}
		if n := count(); n != before {
			t.Errorf("delete %s was refused, but the topic went from %d records to %d", customer, before, n)
		}
	}
	must("set", "acme", "-f", file("acme.yaml", "plan: pro\ncaps: {api_calls: {limit: 1000}}\n"))
	must("set", "globex", "-f", file("later.yaml", "plan: big\neffective_from: \"2099-01-01T00:00:00Z\"\n"))

	refused("acmee", "acmee has no entitlements record")
	must("delete", "acme")
	refused("acme", "the entitlements of acme were deleted already, at ")
	must("delete", "globex") // only scheduled: it would apply from 2099

	before := count()
	must("delete", "acmee", "--force")
	if n := count(); n != before+1 {
		t.Fatalf("delete --force of a customer without a record: the topic went from %d records to %d, want one more", before, n)
	}
	for _, c := range []string{"acme", "acmee", "globex"} {
		if code, _, errOut := ent("get", c); code != 1 || !strings.Contains(errOut, "deleted") {
			t.Errorf("get %s after its delete: exit %d, stderr %q", c, code, errOut)
		}
	}
}
