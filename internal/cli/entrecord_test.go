package cli

import (
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/meterline/meterline/entitlements"
	"github.com/meterline/meterline/internal/testenv"
)

// TestEntitlementsDeleteRefusesNoRecord: delete of a customer that has no
// record (a misspelt customer_id) writes nothing and exits 1, naming the
// customer and --force; with --force it writes the delete. A customer with
// a record, in effect or only scheduled, is deleted as before; deleted
// again (a retried script), it writes nothing and exits 0 with a note.
func TestEntitlementsDeleteRefusesNoRecord(t *testing.T) {
	onKafkas(t, testEntitlementsDeleteRefusesNoRecord)
}

func testEntitlementsDeleteRefusesNoRecord(t *testing.T, brokers []string) {
	names, ent, must := entCommands(t, brokers, "entdel")
	file := tempFiles(t)
	count := func() int { return len(testenv.ReadAll(t, brokers, names.EntitlementsTopic())) }
	refused := func(customer, want string) {
		t.Helper()
		before := count()
		code, out, errOut := ent("", "delete", customer)
		if code != 1 || !strings.Contains(errOut, want) || !strings.Contains(errOut, "--force") || !strings.Contains(errOut, "nothing was written") {
			t.Errorf("delete %s: exit %d, stdout %q, stderr %q; want exit 1, %q and --force", customer, code, out, errOut, want)
		}
		if n := count(); n != before {
			t.Errorf("delete %s was refused, but the topic went from %d records to %d", customer, before, n)
		}
	}
	must("", "set", "acme", "-f", file("acme.yaml", "plan: pro\ncaps: {api_calls: {limit: 1000}}\n"))
	must("", "set", "globex", "-f", file("later.yaml", "plan: big\neffective_from: \"2099-01-01T00:00:00Z\"\n"))

	refused("acmee", "acmee has no entitlements record")
	must("", "delete", "acme")
	before := count()
	if code, out, errOut := ent("", "delete", "acme"); code != 0 || !strings.Contains(errOut, "the entitlements of acme were deleted already, at ") || count() != before {
		t.Errorf("delete acme again: exit %d, stdout %q, stderr %q, %d records after %d; want exit 0, a note and nothing written", code, out, errOut, count(), before)
	}
	must("", "delete", "globex") // only scheduled: it would apply from 2099

	before = count()
	must("", "delete", "acmee", "--force")
	if n := count(); n != before+1 {
		t.Fatalf("delete --force of a customer without a record: the topic went from %d records to %d, want one more", before, n)
	}
	for _, c := range []string{"acme", "acmee", "globex"} {
		if code, _, errOut := ent("", "get", c); code != 1 || !strings.Contains(errOut, "deleted") {
			t.Errorf("get %s after its delete: exit %d, stderr %q", c, code, errOut)
		}
	}
}

// TestEntitlementsGetAppliesFrom: get and list print applies_from, the
// time a record applies from as the aggregator takes it (its
// effective_from, or its broker time when that is later: docs/
// entitlements.md, The ordering rule: broker time), so that a past
// effective_from is not read as the start of the record; stderr says so.
// The printed document is accepted by set as it is.
func TestEntitlementsGetAppliesFrom(t *testing.T) {
	onKafkas(t, testEntitlementsGetAppliesFrom)
}

func testEntitlementsGetAppliesFrom(t *testing.T, brokers []string) {
	_, ent, must := entCommands(t, brokers, "entfrom")
	file := tempFiles(t)
	get := func(args ...string) (*entitlements.Document, string, string) {
		t.Helper()
		code, out, errOut := ent("", append([]string{"get"}, args...)...)
		var d entitlements.Document
		if err := yaml.Unmarshal([]byte(out), &d); code != 0 || err != nil {
			t.Fatalf("get %v: exit %d, %v\n%s\n%s", args, code, err, out, errOut)
		}
		return &d, out, errOut
	}
	const past, later = "2020-01-01T00:00:00.000Z", "2099-01-01T00:00:00.000Z"
	must("", "set", "acme", "-f", file("past.yaml", "plan: pro\neffective_from: \""+past+"\"\ncaps: {api_calls: {limit: 1000}}\n"))
	must("", "set", "globex", "-f", file("later.yaml", "plan: big\neffective_from: \""+later+"\"\n"))
	must("", "set", "initech", "-f", file("now.yaml", "plan: small\n"))
	must("", "set-default", "-f", file("default.yaml", "plan: free\neffective_from: \""+past+"\"\n"))

	d, out, errOut := get("acme")
	if d.EffectiveFrom != past || d.WrittenAt == "" || d.AppliesFrom != d.WrittenAt {
		t.Errorf("get of a record with a past effective_from: applies_from %q, want its written_at %q\n%s", d.AppliesFrom, d.WrittenAt, out)
	}
	if want := "effective_from " + past + " is earlier than the record's broker time: the record applies from " + d.WrittenAt; !strings.Contains(errOut, want) {
		t.Errorf("get acme: stderr does not say %q:\n%s", want, errOut)
	}
	if d, out, _ := get("globex"); d.AppliesFrom != later {
		t.Errorf("get of a scheduled record: applies_from %q, want its effective_from %s\n%s", d.AppliesFrom, later, out)
	}
	if d, out, errOut := get("initech"); d.AppliesFrom == "" || d.AppliesFrom != d.WrittenAt || strings.Contains(errOut, "earlier than") {
		t.Errorf("get of a record without effective_from: applies_from %q, want its written_at %q, no note\n%s\n%s", d.AppliesFrom, d.WrittenAt, out, errOut)
	}
	if d, out, errOut := get("--default"); d.AppliesFrom == "" || d.AppliesFrom != d.WrittenAt || !strings.Contains(errOut, "earlier than") {
		t.Errorf("get --default with a past effective_from: applies_from %q, want its written_at %q, and the note\n%s\n%s", d.AppliesFrom, d.WrittenAt, out, errOut)
	}
	code, listed, errOut := ent("", "list")
	if code != 0 || strings.Count(listed, "applies_from: ") != 3 || !strings.Contains(errOut, "note: acme: effective_from "+past) {
		t.Errorf("list: exit %d, want applies_from on every record and acme's note\n%s\n%s", code, listed, errOut)
	}

	// The YAML round trip: set takes get's document as it is.
	must(out, "set", "-f", "-")
	again, _, _ := get("acme")
	if again.AppliesFrom < d.AppliesFrom || again.Plan != "pro" || again.EffectiveFrom != past {
		t.Errorf("get | set: then applies_from %q (was %q), plan %q, effective_from %q", again.AppliesFrom, d.AppliesFrom, again.Plan, again.EffectiveFrom)
	}
}
