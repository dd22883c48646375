package cli

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/schemas"
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

// TestEntitlementsGetSaysWhatSetRefuses: a record written straight to
// usage.entitlements may hold values the aggregator accepts and a
// document cannot: a time after 9999 in UTC (which get prints with a
// five-digit year, not RFC 3339) or before 2000-01-01. get prints the
// record as it is, and says on stderr that set refuses the document as
// printed, naming each such field and why; set does refuse it. A record
// set wrote gets no such note.
func TestEntitlementsGetSaysWhatSetRefuses(t *testing.T) {
	a := newAcmeTopic(t)
	ctx := context.Background()
	year10000 := time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC).UnixMilli()
	acme, err := schemas.Encode(&schemas.Entitlements{CustomerID: "acme", Plan: "direct", Overdraft: schemas.Overdraft{Policy: schemas.OverdraftAllow},
		Caps: []schemas.Cap{}, Grants: []schemas.Grant{{ID: "forever", Amount: 5, ExpiresAt: year10000}, {ID: "old", Amount: 5, EffectiveFrom: 1000}}})
	if err != nil {
		t.Fatal(err)
	}
	card, err := schemas.Encode(&schemas.RateCard{Versions: []schemas.RateVersion{{EffectiveFrom: 0,
		Rates: []schemas.Rate{{Meter: "tokens", MicroCredits: 1, PerUnits: 1}}}}})
	if err != nil {
		t.Fatal(err)
	}
	recs := []*kgo.Record{{Topic: a.topic, Partition: a.canon, Key: a.key, Value: acme}}
	for p := range int32(4) {
		recs = append(recs, &kgo.Record{Topic: a.topic, Partition: p, Key: []byte(schemas.RateCardKey), Value: card})
	}
	if err := a.cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	ent := func(args ...string) (int, string, string) {
		t.Helper()
		return run(t, "", append(append([]string{"entitlements"}, args...), "--brokers", strings.Join(a.brokers, ","), "--topic-prefix", a.prefix)...)
	}
	file := tempFiles(t)
	for _, c := range []struct {
		get, set []string
		fields   []string
	}{
		{[]string{"get", "acme"}, []string{"set"}, []string{"grants.forever.expires_at: 10000-01-01T00:00:00.000Z is after 9999-12-31T23:59:59.999Z", "grants.old.effective_from: "}},
		{[]string{"list"}, []string{"set"}, []string{"acme: ", "grants.forever.expires_at: "}},
		{[]string{"get", "--rates"}, []string{"set-rates"}, []string{"versions[0].effective_from: "}},
	} {
		code, out, errOut := ent(c.get...)
		asIs := c.set[0] == "set-rates" || strings.Contains(out, "expires_at: 10000-01-01T00:00:00.000Z")
		if code != 0 || !asIs || !strings.Contains(errOut, "set refuses this document as printed") {
			t.Errorf("%v: exit %d, want 0, the record printed as it is and a note that set refuses it\n%s\n%s", c.get, code, out, errOut)
		}
		for _, f := range c.fields {
			if !strings.Contains(errOut, f) {
				t.Errorf("%v: the note does not name %q:\n%s", c.get, f, errOut)
			}
		}
		if c.get[0] == "list" {
			continue
		}
		t.Logf("%v:\n%s", c.get, errOut)
		if code, _, setErr := ent(append(c.set, "--validate", "-f", file("doc.yaml", out))...); code == 0 || !strings.Contains(setErr, c.fields[0]) {
			t.Errorf("%v of what %v printed: exit %d, want it refused naming %q\n%s", c.set, c.get, code, c.fields[0], setErr)
		}
	}
	if code, _, errOut := ent("set", "acme", "-f", file("ok.yaml", "plan: pro\ngrants:\n  g: {amount: 5, expires_at: \"9999-12-31T23:59:59.999Z\"}\n")); code != 0 {
		t.Fatalf("set acme: exit %d\n%s", code, errOut)
	}
	if code, out, errOut := ent("get", "acme"); code != 0 || strings.Contains(errOut, "set refuses") {
		t.Errorf("get acme after set: exit %d, want 0 and no note that set refuses it\n%s\n%s", code, out, errOut)
	}
}
