package entitlements

import (
	"encoding/json"
	"fmt"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/meterline/meterline/schemas"
)

// TestDocumentReadAsWritten: a document is read as the operator wrote it.
// A key given twice, a field in another case, or a second document is
// refused, never resolved silently to one of the values; names keep their
// text (YAML 1.1 read `on` as true and `010` as 8); a number is read from
// its digits, never through a float.
func TestDocumentReadAsWritten(t *testing.T) {
	for _, c := range []struct{ name, doc, want string }{
		{"cap given twice", "customer: acme\ncaps:\n  api_calls: {limit: 10}\n  api_calls: {limit: 1000000}\n", `caps.api_calls: given twice (lines 3 and 4)`},
		{"field given twice", "customer: acme\nplan: free\nplan: pro\n", `plan: given twice (lines 2 and 3)`},
		{"JSON key given twice", `{"customer": "acme", "grants": {"g": {"amount": 1, "amount": 5000000}}}`, `grants.g.amount: given twice`},
		{"field in another case", "customer: acme\ncaps: {a: {limit: 5, Limit: 7}}\n", `caps.a: unknown field "Limit"`},
		{"field in another case alone", "Customer: globex\n", `unknown field "Customer"`},
		{"second document", "customer: acme\n---\ncustomer: globex\n", `more than one document`},
		{"merge key", "customer: acme\ngrants:\n  g:\n    amount: 5\n    <<: {amount: 7}\n", `grants.g: merge keys (<<) are not supported`},
		{"yes for true", "customer: acme\nunmetered: yes\n", `unmetered: must be true or false (got "yes")`},
	} {
		_, err := ParseDocument([]byte(c.doc))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: ParseDocument(%q) = %v, want an error saying %q", c.name, c.doc, err, c.want)
		}
	}
	if _, err := ParseRatesDocument([]byte("versions:\n- effective_from: \"2026-01-01T00:00:00Z\"\n  rates: {a: 1, a: 2}\n")); err == nil ||
		!strings.Contains(err.Error(), "versions[0].rates.a: given twice") {
		t.Errorf("a rate given twice: %v", err)
	}

	d, err := ParseDocument([]byte("customer: acme\nplan: 2026\ncaps:\n  on: {limit: 10}\n  \"007\": {limit: 5}\n  0x10: {limit: 5}\n" +
		"grants:\n  '010': {amount: 9007199254740993.0}\n  y: {amount: 010}\n  big: {amount: 5e6}\n"))
	if err != nil {
		t.Fatal(err)
	}
	e, err := d.Record("acme", nil)
	if err != nil {
		t.Fatal(err)
	}
	wantCaps := []schemas.Cap{{Meter: "007", Limit: 5, OnLimit: schemas.OnLimitReject}, {Meter: "0x10", Limit: 5, OnLimit: schemas.OnLimitReject},
		{Meter: "on", Limit: 10, OnLimit: schemas.OnLimitReject}}
	wantGrants := []schemas.Grant{{ID: "010", Amount: 9007199254740993}, {ID: "big", Amount: 5000000}, {ID: "y", Amount: 10}}
	if e.Plan != "2026" || !reflect.DeepEqual(e.Caps, wantCaps) || !reflect.DeepEqual(e.Grants, wantGrants) {
		t.Errorf("got plan %q caps %+v grants %+v\nwant plan 2026 caps %+v grants %+v", e.Plan, e.Caps, e.Grants, wantCaps, wantGrants)
	}

	// A decimal rate with more digits than a float keeps is refused (it
	// was rounded to 12345678901234568/10^17), one a float would print
	// with an exponent is read as written.
	rd, err := ParseRatesDocument([]byte("versions:\n- effective_from: \"2026-01-01T00:00:00Z\"\n  rates: {a: 0.12345678901234567891, b: 0.0000015}\n"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = rd.Card(nil)
	if err == nil || !strings.Contains(err.Error(), `versions[0].rates.a: "0.12345678901234567891" has too many digits`) {
		t.Errorf("a rate of 20 decimals: %v", err)
	}
	if len(rd.Versions) != 1 || rd.Versions[0].Rates["b"] != "0.0000015" {
		t.Errorf("rate b read as %q, want 0.0000015", rd.Versions[0].Rates["b"])
	}
}

// TestDocumentErrorsAreBounded: an error repeats at most a bounded prefix
// of a value or name the document gave, however long.
func TestDocumentErrorsAreBounded(t *testing.T) {
	long := strings.Repeat("x", 100_000)
	for _, doc := range []string{
		"customer: acme\ngrants: {g: {amount: " + long + "}}\n",
		"customer: acme\ngrants: {g: {amount: 1, expires_at: " + long + "}}\n",
		"customer: acme\ncaps: {m: {limit: 1, on_limit: " + long + "}}\n",
		"customer: acme\noverdraft: {policy: " + long + "}\n",
		"customer: " + long + "\n",
		"customer: acme\ncaps: {" + long + ": {limit: 0}}\n",
		"customer: acme\nunmetered: " + long + "\n",
		"customer: acme\ncaps: {m: {limit: 1, " + long + ": 1}}\n",
	} {
		var err error
		if d, perr := ParseDocument([]byte(doc)); perr != nil {
			err = perr
		} else {
			_, err = d.Record("acme", nil)
		}
		if err == nil {
			t.Errorf("accepted %.80q", doc)
		} else if len(err.Error()) > 2000 {
			t.Errorf("an error of %d bytes: %.200q", len(err.Error()), err.Error())
		}
	}
	rd, err := ParseRatesDocument([]byte("versions:\n- effective_from: " + long + "\n  rates: {a: " + long + "}\n"))
	if err == nil {
		_, err = rd.Card(nil)
	}
	if err == nil || len(err.Error()) > 2000 {
		t.Errorf("rate card error of %d bytes", len(err.Error()))
	}
}

// TestDocumentAliasesAreBounded: a scalar named by many aliases is refused
// once the text the document expands to passes maxDocText, rather than
// converted: 64 KiB named 1,000 times, a 70 KB document within the node
// budget, allocated 250 to 400 MiB (5 GiB at 10,000 aliases).
func TestDocumentAliasesAreBounded(t *testing.T) {
	big := strings.Repeat("z", 64<<10)
	var rates, grants strings.Builder
	rates.WriteString("versions: [&v {effective_from: \"" + big + "\", rates: {}}")
	grants.WriteString("customer: acme\ngrants: {g: &g {amount: 1, expires_at: \"" + big + "\"}")
	for i := range 1000 {
		rates.WriteString(", *v")
		fmt.Fprintf(&grants, ", g%d: *g", i)
	}
	rates.WriteString("]\n")
	grants.WriteString("}\n")
	for _, c := range []struct {
		name  string
		parse func([]byte) error
		doc   string
	}{
		{"rates", func(b []byte) error { _, err := ParseRatesDocument(b); return err }, rates.String()},
		{"grants", func(b []byte) error { _, err := ParseDocument(b); return err }, grants.String()},
	} {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		err := c.parse([]byte(c.doc))
		runtime.ReadMemStats(&after)
		if err == nil || !strings.Contains(err.Error(), "expands to more than 16 MiB of text") {
			t.Errorf("%s: a document of %d bytes expanding to %d MiB: %v, want it refused", c.name, len(c.doc), 1000*len(big)>>20, err)
		}
		if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 32<<20 {
			t.Errorf("%s: a document of %d bytes allocated %d MiB", c.name, len(c.doc), alloc>>20)
		}
	}
}

// TestParseRateLongText: a rate of a million digits is refused at once
// (math/big took seconds to read it, minutes for the 16 MiB set-rates
// reads).
func TestParseRateLongText(t *testing.T) {
	s := "0." + strings.Repeat("3", 1<<20)
	start := time.Now()
	_, _, err := ParseRate(s)
	if took := time.Since(start); err == nil || took > time.Second {
		t.Errorf("ParseRate of %d digits: %v after %s, want an error at once", len(s), err, took)
	}
}

// TestDocumentRoundTripNames: names that YAML would read as something
// else unquoted (on, 010, null, 1e3, ...) come back from what get prints,
// in YAML and JSON, as they were. (A name << does not through this YAML
// printer, which writes it unquoted, a merge key then, refused; get's
// printer quotes it: TestEntitlementsGetOddNames in internal/cli.)
func TestDocumentRoundTripNames(t *testing.T) {
	names := []string{"on", "010", "y", "n", "1e3", "null", "~", "2026-01-01", "-", "a: b", "#x", "0x1F", "1_000", ".inf", "=", "true", "NO", "0o17", "+1", "1:20", "!tag", "&a", "*a", "'q'", "\"d\"", "[x]", "{y}", "|", ">", "%", "@", "`"}
	e := &schemas.Entitlements{CustomerID: "acme", Plan: "010", Caps: []schemas.Cap{}, Grants: []schemas.Grant{}, Overdraft: schemas.Overdraft{Policy: schemas.OverdraftAllow}}
	for _, n := range names {
		e.Caps = append(e.Caps, schemas.Cap{Meter: n, Limit: 1, OnLimit: schemas.OnLimitReject})
		e.Grants = append(e.Grants, schemas.Grant{ID: n, Amount: 1})
	}
	e2, _ := NewPlan(e)
	e = e2.Record("acme", 0)
	checkRoundTrip(t, yaml.Marshal, e, 0)
	checkRoundTrip(t, json.Marshal, e, 0)
}

// TestDocumentJSONLongNames: what `get -o json` prints of a record whose
// meter and grant id are as long as a name may be reads back (a YAML
// parser refuses a quoted key of more than 1,024 characters, and a
// JSON key is quoted), keys given twice still refused by line.
func TestDocumentJSONLongNames(t *testing.T) {
	n := strings.Repeat("m", MaxNameBytes)
	e := &schemas.Entitlements{CustomerID: "acme", Caps: []schemas.Cap{{Meter: n, Limit: 5, OnLimit: schemas.OnLimitReject}},
		Grants: []schemas.Grant{{ID: n, Amount: 7}}, Overdraft: schemas.Overdraft{Policy: schemas.OverdraftAllow}}
	checkRoundTrip(t, json.Marshal, e, 0)
	checkRoundTrip(t, func(v any) ([]byte, error) { return json.MarshalIndent(v, "", "  ") }, e, 0)
	c := &schemas.RateCard{Versions: []schemas.RateVersion{{EffectiveFrom: 946684800000, Rates: []schemas.Rate{{Meter: n, MicroCredits: 15, PerUnits: 1000}}}}}
	b, err := json.Marshal(RatesDocumentOf(c, 0))
	if err != nil {
		t.Fatal(err)
	}
	d, err := ParseRatesDocument(b)
	if err != nil {
		t.Fatalf("rate card: %v", err)
	}
	if c2, err := d.Card(nil); err != nil || !reflect.DeepEqual(c, c2) {
		t.Errorf("rate card: %v, %+v", err, c2)
	}
	_, err = ParseDocument([]byte("{\"caps\": {\"a\": {\"limit\": 1},\n \"a\": {\"limit\": 2}}}"))
	if err == nil || !strings.Contains(err.Error(), "caps.a: given twice (lines 1 and 2)") {
		t.Errorf("a JSON key given twice: %v", err)
	}
}

// TestDocumentBadNamePaths: a cap, grant or rate whose name no record
// can hold (empty, a control character) is named by its key in the
// document, as every other problem is, not by its index among the sorted
// keys, which the document does not show.
func TestDocumentBadNamePaths(t *testing.T) {
	d, err := ParseDocument([]byte("caps: {\"a\\tb\": {limit: 0}, ok: {limit: 1}}\ngrants: {\"\": {amount: 1}, \"z\\u0007\": {amount: 2}}\n"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = d.Record("acme", nil)
	rd, err2 := ParseRatesDocument([]byte("versions:\n  - effective_from: \"2026-01-01T00:00:00Z\"\n    rates: {ok: 1, \"a\\tb\": 2}\n"))
	if err2 != nil {
		t.Fatal(err2)
	}
	_, err2 = rd.Card(nil)
	got := fmt.Sprint(err, "\n", err2)
	for _, want := range []string{
		`caps."a\tb": holds the control character U+0009`, `caps."a\tb".limit: must be positive (got 0)`,
		`grants."": must not be empty`, `grants."z\a": holds the control character U+0007`,
		`versions[0].rates."a\tb": holds the control character U+0009`,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("no %q in:\n%s", want, got)
		}
	}
	if strings.Contains(got, "caps[") || strings.Contains(got, "grants[") || strings.Contains(got, "rates[") {
		t.Errorf("an index the document does not show:\n%s", got)
	}
}

// TestDocumentBadNameBadNumber: a cap with a bad name and a limit that is
// not an integer is named once for the limit, by its key.
func TestDocumentBadNameBadNumber(t *testing.T) {
	d, err := ParseDocument([]byte("caps: {\"a\\tb\": {limit: x}}\n"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = d.Record("acme", nil)
	if got := fmt.Sprint(err); strings.Count(got, "limit") != 1 || !strings.Contains(got, `caps."a\tb".limit: not a 64-bit integer`) {
		t.Errorf("got:\n%s", got)
	}
}
