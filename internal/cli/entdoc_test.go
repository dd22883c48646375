package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestEntitlementsDocumentTooLarge: a document larger than the commands
// read is refused, from standard input as from a file, never cut to its
// first 16 MiB and read as a shorter document (here: without its cap).
func TestEntitlementsDocumentTooLarge(t *testing.T) {
	doc := "customer: acme\n#" + strings.Repeat("x", maxDocumentBytes) + "\ncaps: {api_calls: {limit: 10}}\n"
	f := filepath.Join(t.TempDir(), "acme.yaml")
	if err := os.WriteFile(f, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ stdin, file string }{{doc, "-"}, {"", f}} {
		code, out, errs := run(t, c.stdin, "entitlements", "set", "-f", c.file, "--validate")
		if code == 0 || !strings.Contains(errs, "larger than") {
			t.Errorf("-f %s: exit %d, stdout %q, stderr %.300q; want refused as too large", c.file, code, out, errs)
		}
	}
}

// TestEntitlementsEmptyDocumentRefused: set-default and set-rates refuse
// an empty document (an empty file, a pipe that carried nothing) with
// exit 1, rather than write a default plan that caps nothing or a rate
// card that prices nothing for every customer.
func TestEntitlementsEmptyDocumentRefused(t *testing.T) {
	f := filepath.Join(t.TempDir(), "empty.yaml")
	if err := os.WriteFile(f, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, cmd := range [][]string{{"set-default"}, {"set-rates"}, {"set", "acme"}} {
		for _, src := range []string{f, "-"} {
			args := append(append([]string{"entitlements"}, cmd...), "-f", src, "--validate")
			code, out, errs := run(t, "", args...)
			if code != 1 || !strings.Contains(errs, "the document is empty") {
				t.Errorf("%v: exit %d, stdout %q, stderr %q; want exit 1, refused as empty", args, code, out, errs)
			}
		}
	}
}

// TestEntitlementsDeleteInvalidCustomer: delete refuses, before it
// connects, a customer_id that no record can have (set refuses it too),
// rather than write a delete the aggregator refuses.
func TestEntitlementsDeleteInvalidCustomer(t *testing.T) {
	for _, c := range []string{"ac\x1bme", "a\u202eb", strings.Repeat("x", 1025)} {
		code, out, errs := run(t, "", "entitlements", "delete", c, "--brokers", "127.0.0.1:1", "--timeout", "2s")
		if code != 1 || !strings.Contains(errs, "is not a valid customer_id") {
			t.Errorf("delete %.40q: exit %d, stdout %q, stderr %.300q; want exit 1, not a valid customer_id", c, code, out, errs)
		}
	}
}

// TestEntitlementsDocumentNamesItsSource: a document that is refused is
// named by where it was read from, and one of the write commands given no
// -f (a file name given as the customer argument, say) says that standard
// input carried nothing and how to give the document.
func TestEntitlementsDocumentNamesItsSource(t *testing.T) {
	f := filepath.Join(t.TempDir(), "acme.yaml")
	if err := os.WriteFile(f, []byte("customer: acme\ncredits: 5\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, _, errs := run(t, "", "entitlements", "set", "acme.yaml", "--validate")
	if code != 1 || !strings.Contains(errs, "the document on standard input is not valid") || !strings.Contains(errs, "-f FILE") {
		t.Errorf("set acme.yaml (no -f): exit %d, stderr %q; want exit 1, naming standard input and -f FILE", code, errs)
	}
	code, _, errs = run(t, "", "entitlements", "set", "-f", f, "--validate")
	if code != 1 || !strings.Contains(errs, "the document in "+f+" is not valid") || strings.Contains(errs, "-f FILE") {
		t.Errorf("set -f %s: exit %d, stderr %q; want exit 1, naming the file", f, code, errs)
	}
}

// TestEntitlementsUnreachableSaysNothingWritten: a write that cannot
// reach the brokers before it has sent its record exits 1 and says that
// nothing was written, naming the brokers it tried.
func TestEntitlementsUnreachableSaysNothingWritten(t *testing.T) {
	f := filepath.Join(t.TempDir(), "acme.yaml")
	if err := os.WriteFile(f, []byte("customer: acme\ncaps: {api_calls: {limit: 10}}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, _, errs := run(t, "", "entitlements", "set", "-f", f, "--brokers", "127.0.0.1:1", "--timeout", "2s")
	if code != 1 || !strings.Contains(errs, "nothing was written") || !strings.Contains(errs, "127.0.0.1:1") {
		t.Errorf("set with no broker: exit %d, stderr %q; want exit 1, nothing was written, naming the brokers", code, errs)
	}
}

// TestEntitlementsNoteDefaultOverdraft: a customer's record or a default
// plan written without an overdraft (or with an empty one) says on stderr that the default,
// overdraft allowed without limit, applies (a plan of caps alone is
// charged for priced meters); one that gives it, or an unmetered one,
// does not.
func TestEntitlementsNoteDefaultOverdraft(t *testing.T) {
	for _, c := range []struct {
		cmd  []string
		doc  string
		note bool
	}{
		{[]string{"set"}, "customer: acme\ncaps: {api_calls: {limit: 3}}\n", true},
		{[]string{"set-default"}, "plan: free\ncaps: {api_calls: {limit: 3}}\n", true},
		{[]string{"set"}, "customer: acme\ncaps: {api_calls: {limit: 3}}\noverdraft: {policy: allow}\n", false},
		{[]string{"set-default"}, "plan: free\noverdraft: {policy: deny}\n", false},
		{[]string{"set"}, "customer: acme\nunmetered: true\n", false},
		// An empty overdraft gives no policy and no limit: the default.
		{[]string{"set"}, "customer: acme\ncaps: {api_calls: {limit: 3}}\noverdraft: {}\n", true},
		{[]string{"set-default"}, "plan: free\noverdraft: {}\n", true},
		{[]string{"set"}, "customer: acme\noverdraft: {limit: 5}\n", false},
	} {
		args := append(append([]string{"entitlements"}, c.cmd...), "--validate")
		code, _, errs := run(t, c.doc, args...)
		if code != 0 || strings.Contains(errs, "no overdraft given") != c.note {
			t.Errorf("%v of %q: exit %d, stderr %q; want exit 0, note of the default overdraft %v", c.cmd, c.doc, code, errs, c.note)
		}
	}
}
