package ingest

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
)

// TestPropertyOfWrongTypeNamesItsPath: on /v1/events a property whose
// value is not a string (a number, a boolean, an object, an array) is
// refused naming the property, properties.<name>, as a null one or a
// repeated one is, not "properties" as a whole: a client with a dozen
// properties can tell which one is wrong. The same holds in a batch,
// where the error names the event's index too, and the detail names the
// same field as the error.
func TestPropertyOfWrongTypeNamesItsPath(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.RefusalRate = -1 })
	event := func(id, props string) string {
		return `{"event_id":"` + id + `","customer_id":"acme-1","meter":"api_calls","quantity":1,` +
			`"event_time":"2026-11-29T12:00:00Z","properties":` + props + `}`
	}
	for _, c := range []struct{ props, field, kind string }{
		{`{"region":"eu","model":5}`, "properties.model", "number"},
		{`{"region":"eu","model":true}`, "properties.model", "bool"},
		{`{"model":"m","tier":{"x":"1"}}`, "properties.tier", "object"},
		{`{"tier":["a"],"model":7}`, "properties.tier", "array"},
		{`{"mo\u0064el":1.5}`, "properties.model", "number"},
		{`{"a.b":false}`, "properties.a.b", "bool"},
	} {
		for _, batch := range []bool{false, true} {
			body, index := event("e1", c.props), 0
			if batch {
				body, index = "["+event("e0", `{"model":"m"}`)+","+event("e1", c.props)+"]", 1
			}
			code, _, b := e.post("/v1/events", "application/json", e.token, []byte(body))
			if code != http.StatusBadRequest {
				t.Fatalf("%s (batch %v): %d %s; want 400", c.props, batch, code, b)
			}
			p := problem(t, b)
			if len(p.Errors) != 1 {
				t.Fatalf("%s (batch %v): errors %+v; want one", c.props, batch, p.Errors)
			}
			got := p.Errors[0]
			if got.Index != index || got.Field != c.field || got.Code != "invalid" || !strings.Contains(got.Reason, c.kind) {
				t.Errorf("%s (batch %v): error %+v; want index %d, field %s, code invalid, a reason naming a %s",
					c.props, batch, got, index, c.field, c.kind)
			}
			if want := fmt.Sprintf("Event %d, %s: ", index, c.field); !strings.Contains(p.Detail, want) {
				t.Errorf("%s (batch %v): detail %q does not name %q", c.props, batch, p.Detail, want)
			}
		}
	}
	if n := len(e.records()); n != 0 {
		t.Errorf("%d records written; want none", n)
	}
}
