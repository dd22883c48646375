package cli

import (
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/meterline/meterline/entitlements"
	"github.com/meterline/meterline/internal/testenv"
)

// TestEntitlementsSetStaleVersion: two operators get acme's record (the
// same version), each add a top-up grant and set it. The first set is
// written; the second, whose version is stale, is refused with exit
// status 1 and writes nothing, so the first grant survives. A delete with
// a stale version is refused too, one with the current version is
// written, and a document without a version is written unconditionally.
func TestEntitlementsSetStaleVersion(t *testing.T) {
	onKafkas(t, testSetStaleVersion)
}

func testSetStaleVersion(t *testing.T, brokers []string) {
	names, ent, must := entCommands(t, brokers, "entversion")
	file := tempFiles(t)
	count := func() int { return len(testenv.ReadAll(t, brokers, names.EntitlementsTopic())) }
	must("", "set", "-f", file("acme.yaml", "customer: acme\nplan: pro\ngrants:\n  prepaid: {amount: 1000000}\n"))
	_, docA, _ := ent("", "get", "acme")
	_, docB, _ := ent("", "get", "acme")
	version := getVersion(t, docA)
	if version == "" || getVersion(t, docB) != version {
		t.Fatalf("get acme twice: versions %q and %q, want the same one\n%s", version, getVersion(t, docB), docA)
	}
	must("", "set", "-f", file("a.yaml", withGrant(t, docA, "topup-a", 5000000)))
	before := count()
	code, out, errOut := ent("", "set", "-f", file("b.yaml", withGrant(t, docB, "topup-b", 7000000)))
	_, now, _ := ent("", "get", "acme")
	want := "acme changed since you read it (version " + version + ", now " + getVersion(t, now) + "): nothing was written; get it again, re-apply your edit, and set it"
	if code != 1 || !strings.Contains(errOut, want) {
		t.Errorf("set with the stale version %s: exit %d, want 1 and %q\n%s\n%s", version, code, want, out, errOut)
	}
	if n := count(); n != before {
		t.Errorf("set with a stale version wrote %d records, want none", n-before)
	}
	if g := grantsOf(t, now); !g["topup-a"] || g["topup-b"] {
		t.Errorf("get acme after both sets: grants %v, want topup-a and not topup-b\n%s", g, now)
	}

	if _, list, _ := ent("", "list"); !strings.Contains(list, "version: "+getVersion(t, now)+"\n") {
		t.Errorf("list: no version %s\n%s", getVersion(t, now), list)
	}

	// delete: refused with a stale version, written with the current one.
	if code, out, errOut := ent("", "delete", "acme", "--expect-version", version); code != 1 ||
		!strings.Contains(errOut, "acme changed since you read it (version "+version+", now "+getVersion(t, now)+")") || count() != before {
		t.Errorf("delete --expect-version %s (stale): exit %d, want 1, nothing written\n%s\n%s", version, code, out, errOut)
	}
	must("", "delete", "acme", "--expect-version", getVersion(t, now))
	if code, _, errOut := ent("", "set", "-f", file("b.yaml", withGrant(t, now, "topup-b", 7000000))); code != 1 ||
		!strings.Contains(errOut, ", a delete written at ") {
		t.Errorf("set after a delete, with the version before it: exit %d, want 1 naming the delete\n%s", code, errOut)
	}
	// Without a version, set writes as it always did.
	must("", "set", "-f", file("c.yaml", "customer: acme\nplan: pro\n"))
}

// getVersion returns the version of a document get printed.
func getVersion(t *testing.T, doc string) string {
	t.Helper()
	d, err := entitlements.ParseDocument([]byte(doc))
	if err != nil {
		t.Fatalf("%v\n%s", err, doc)
	}
	return d.Version
}

// grantsOf returns the names of the grants of a document get printed.
func grantsOf(t *testing.T, doc string) map[string]bool {
	t.Helper()
	d, err := entitlements.ParseDocument([]byte(doc))
	if err != nil {
		t.Fatalf("%v\n%s", err, doc)
	}
	g := map[string]bool{}
	for id := range d.Grants {
		g[id] = true
	}
	return g
}

// withGrant returns the document get printed with a grant of amount
// added under id, as an operator edits it: the rest, version included,
// as printed.
func withGrant(t *testing.T, doc, id string, amount int64) string {
	t.Helper()
	var m map[string]any
	if err := yaml.Unmarshal([]byte(doc), &m); err != nil {
		t.Fatal(err)
	}
	grants, _ := m["grants"].(map[string]any)
	if grants == nil {
		grants = map[string]any{}
	}
	grants[id] = map[string]any{"amount": amount}
	m["grants"] = grants
	b, err := yaml.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestEntitlementsVersionCheckThenFenced: a writer whose version check
// passed, and that another writer with the same transactional ID then
// overtakes (its InitProducerID, check and commit all between this one's
// check and its record), is fenced: it writes nothing and exits 1, and the
// other writer's grant stays. It holds because the check comes after this
// writer's InitProducerID: before it, this writer would initialise after
// the other's commit and write over it.
func TestEntitlementsVersionCheckThenFenced(t *testing.T) {
	onKafkas(t, testVersionCheckThenFenced)
}

func testVersionCheckThenFenced(t *testing.T, brokers []string) {
	names, ent, must := entCommands(t, brokers, "entfenced")
	file := tempFiles(t)
	must("", "set", "-f", file("acme.yaml", "customer: acme\nplan: pro\n"))
	_, doc, _ := ent("", "get", "acme")
	first, second := file("a.yaml", withGrant(t, doc, "topup-a", 5000000)), file("b.yaml", withGrant(t, doc, "topup-b", 7000000))
	var code2 int
	var errOut2 string
	entBeforeProduce = func() {
		entBeforeProduce = nil // the second writer runs through
		code2, _, errOut2 = ent("", "set", "-f", second)
	}
	t.Cleanup(func() { entBeforeProduce = nil })
	before := len(testenv.ReadAll(t, brokers, names.EntitlementsTopic()))
	code, out, errOut := ent("", "set", "-f", first)
	if code2 != 0 {
		t.Fatalf("the second writer: exit %d, want 0\n%s", code2, errOut2)
	}
	if code != 1 || !strings.Contains(errOut, "nothing was written): a writer with the same transactional ID (meterline-entitlements) started after this one and fenced it") {
		t.Errorf("the first writer, overtaken after its check: exit %d, want 1 and nothing written\n%s\n%s", code, out, errOut)
	}
	if n := len(testenv.ReadAll(t, brokers, names.EntitlementsTopic())) - before; n != 1 {
		t.Errorf("%d records written, want 1 (the second writer's)", n)
	}
	_, now, _ := ent("", "get", "acme")
	if g := grantsOf(t, now); !g["topup-b"] || g["topup-a"] {
		t.Errorf("get acme: grants %v, want topup-b only\n%s", g, now)
	}
}
