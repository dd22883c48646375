package docscheck

import (
	"fmt"
	"slices"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/meterline/meterline/aggregator"
	"github.com/meterline/meterline/entitlements"
	"github.com/meterline/meterline/ingest"
	"github.com/meterline/meterline/internal/cli"
	"github.com/meterline/meterline/producer"
)

// yamlKinds are the YAML documents the docs give, told apart by their
// top-level keys (the first kind that has one wins), each with what reads
// it as the commands do: what `entitlements balance` prints (every field
// one it has), a meters file (`--meters`), a rate card (`entitlements
// set-rates`), an entitlements document (`entitlements set`,
// `set-default`), or a fragment of a Kubernetes manifest, which no command
// reads.
var yamlKinds = []struct {
	kind string
	keys []string
	read func([]byte) error
}{
	{"a balance as `entitlements balance` prints it", []string{"as_of", "credits_remaining"}, func(b []byte) error {
		var d entitlements.BalanceDocument
		return yaml.UnmarshalStrict(b, &d)
	}},
	{"a meters file", []string{"meters"}, func(b []byte) error {
		_, err := aggregator.ParseMeters(b)
		return err
	}},
	{"a rate card", []string{"versions"}, func(b []byte) error {
		d, err := entitlements.ParseRatesDocument(b)
		if err == nil {
			_, err = d.Card(nil)
		}
		return err
	}},
	{"an entitlements document", []string{"customer", "plan", "caps", "grants", "overdraft", "unmetered", "effective_from"}, func(b []byte) error {
		d, err := entitlements.ParseDocument(b)
		if err == nil {
			_, err = d.Record(d.Customer, nil)
		}
		return err
	}},
	{"a Kubernetes manifest", []string{"spec", "apiVersion"}, nil},
	{"an answer of the HTTP ingest", []string{"type", "status"}, func(b []byte) error {
		var p ingest.Problem
		return yaml.UnmarshalStrict(b, &p)
	}},
	{"a line of `meterline produce`", []string{"event_id"}, func(b []byte) error {
		_, err := producer.ParseJSON(b)
		return err
	}},
	{"what `meterline lag -o json` prints", []string{"partitions", "totals", "groups_without_offsets"}, func(b []byte) error {
		var r cli.LagReport
		return yaml.UnmarshalStrict(b, &r)
	}},
	{"a meter's definition", []string{"aggregation"}, func(b []byte) error {
		var def map[string]any
		if err := yaml.Unmarshal(b, &def); err != nil {
			return err
		}
		def["name"] = "m"
		file, err := yaml.Marshal(map[string]any{"meters": []any{def}})
		if err == nil {
			_, err = aggregator.ParseMeters(file)
		}
		return err
	}},
}

// yamlProblem reads a YAML block as the kind its top-level keys name and
// says what is wrong with it, or "".
func yamlProblem(text string) string {
	var top map[string]any
	if err := yaml.Unmarshal([]byte(text), &top); err != nil {
		return "not YAML: " + err.Error()
	}
	for _, k := range yamlKinds {
		if !slices.ContainsFunc(k.keys, func(key string) bool { _, ok := top[key]; return ok }) {
			continue
		}
		if k.read == nil {
			return ""
		}
		if err := k.read([]byte(text)); err != nil {
			return fmt.Sprintf("%s that is refused: %v", k.kind, err)
		}
		return ""
	}
	return "no known kind of document (a meters file, a rate card, an entitlements document): add its kind to yamlKinds"
}

// TestDocYAMLDocumentsAccepted: every YAML or JSON block of the docs that
// no test names (the worked examples are run; the full entitlements
// document, the rate card, the meters files, an event line and the
// ingest's answers are not) is read as what takes or writes it reads it,
// and accepted: a field renamed or a rule tightened in the code fails
// here, not for the reader who pastes the block.
func TestDocYAMLDocumentsAccepted(t *testing.T) {
	_, _, blocks := docs(t)
	n := 0
	for _, b := range blocks {
		// CHANGELOG.md may show a document as an older version took it.
		if b.lang != "yaml" && b.lang != "json" || b.ann != nil || b.file == "CHANGELOG.md" {
			continue
		}
		n++
		if p := yamlProblem(b.text); p != "" {
			t.Errorf("%s: %s", b.where(), p)
		}
	}
	if n < 8 {
		t.Fatalf("found %d YAML and JSON blocks in the docs", n)
	}
}

// TestYAMLProblem: a document of each kind is read as its command reads
// it, so that a field the command refuses is found.
func TestYAMLProblem(t *testing.T) {
	for _, c := range []struct {
		text string
		ok   bool
	}{
		{"meters:\n  - {name: api_calls, aggregation: SUM}\n", true},
		{"meters:\n  - {name: api_calls, aggregation: SUMM}\n", false},
		{"versions:\n  - effective_from: \"2026-12-01T00:00:00Z\"\n    rates: {tokens: 15/1000}\n", true},
		{"versions:\n  - effective_from: \"2026-12-01T00:00:00Z\"\n    rates: {tokens: 1.5.0}\n", false},
		{"customer: acme\ncaps:\n  api_calls: {limit: 3}\n", true},
		{"customer: acme\ncaps:\n  api_calls: {limit: 3, on_limt: allow}\n", false},
		{"plan: free\noverdraft: {policy: deny, limit: 10}\n", false},
		{"spec:\n  securityContext: {fsGroup: 10001}\n", true},
		{"as_of: \"2026-12-14T09:30:01.250Z\"\ncredits_remaining: 5\nmeters:\n- {meter: api_calls, usage: 1, limit: 3}\n", true},
		{"as_of: \"2026-12-14T09:30:01.250Z\"\ncredits_left: 5\n", false},
		{`{"type":"urn:meterline:problem:malformed","title":"Malformed","status":400,"detail":"x"}`, true},
		{`{"type":"urn:meterline:problem:malformed","title":"Malformed","status":400,"message":"x"}`, false},
		{`{"event_id":"e","customer_id":"acme","meter":"api_calls","quantity":3,"event_time":"2026-11-29T12:00:00.250Z"}`, true},
		{`{"event_id":"e","customer_id":"acme","meter":"api_calls","quantity":3,"eventtime":"2026-11-29T12:00:00.250Z"}`, false},
		{`{"aggregation":"UNIQUE_COUNT","property":"user_id"}`, true},
		{`{"aggregation":"UNIQUE_COUNT","propery":"user_id"}`, false},
		{"balance: 3\n", false},
	} {
		if p := yamlProblem(c.text); (p == "") != c.ok {
			t.Errorf("%q: problem %q, want ok %v", c.text, p, c.ok)
		}
	}
}
