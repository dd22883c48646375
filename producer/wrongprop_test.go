package producer

import (
	"errors"
	"strings"
	"testing"
)

// TestParseJSONPropertyOfWrongType: a property whose value is not a
// string (a number, a boolean, an object, an array) is refused naming the
// property, properties.<name> with its escapes decoded, as a null one is:
// encoding/json's type error names only "properties", and a producer with
// a dozen properties could not tell which one is wrong. The first such
// property of the line is named. Properties that are not an object are
// refused as "properties", in English.
func TestParseJSONPropertyOfWrongType(t *testing.T) {
	const head = `{"event_id":"e","customer_id":"c","meter":"m","quantity":1,"event_time":1795003200250,"properties":`
	long := strings.Repeat("p", 80)
	for _, c := range []struct{ props, field, reason string }{
		{`{"region":"eu","model":5}`, "properties.model", "must be a string, not a JSON number"},
		{`{"model": -1.5e3 }`, "properties.model", "must be a string, not a JSON number"},
		{`{"region":"eu","model":true}`, "properties.model", "must be a string, not a JSON bool"},
		{`{"model":false}`, "properties.model", "must be a string, not a JSON bool"},
		{`{"model":"m","tier":{"x":"1"}}`, "properties.tier", "must be a string, not a JSON object"},
		{`{"tier":{"x":null}}`, "properties.tier", "must be a string, not a JSON object"},
		{`{"tier":["a"],"model":7}`, "properties.tier", "must be a string, not a JSON array"},
		{`{"tier":[]}`, "properties.tier", "must be a string, not a JSON array"},
		{`{"mo\u0064el":1.5}`, "properties.model", "must be a string, not a JSON number"},
		{`{"a.b":false}`, "properties.a.b", "must be a string, not a JSON bool"},
		{`{"` + long + `":1}`, "properties." + long[:64-len("properties.")] + "…", "must be a string, not a JSON number"},
		{`5`, "properties", "must be an object of strings, not a JSON number"},
		{`"eu"`, "properties", "must be an object of strings, not a JSON string"},
	} {
		line := head + c.props + `}`
		e, err := ParseJSON([]byte(line))
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != c.field || fe.Reason != c.reason {
			t.Errorf("ParseJSON(%s) = %+v, %v; want %s: %s", line, e.Properties, err, c.field, c.reason)
		}
	}
	// Not a property's value: the scan leaves it to the decoder.
	for line, want := range map[string]string{
		head + `{"model":5x}}`:                  "malformed JSON",
		head + `{"model":"m"},"extra":{"n":5}}`: "is not a known field",
	} {
		if _, err := ParseJSON([]byte(line)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseJSON(%s) = %v; want an error containing %q", line, err, want)
		}
	}
}
