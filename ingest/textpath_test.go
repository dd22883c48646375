package ingest

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
)

// TestBadTextNamesItsPath: text that is not valid UTF-8, or escapes half
// of a surrogate pair, is refused naming the member that holds it, as
// the request names it (data.model, data.items[1].name, subject,
// properties.model), not "event", on both endpoints, alone or in a
// batch (with its index), the detail naming the same field.
func TestBadTextNamesItsPath(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.RefusalRate = -1 })
	ce := func(id, subject, data string) string {
		return `{"specversion":"1.0","id":"` + id + `","source":"s","type":"prompt","subject":"` + subject +
			`","time":"2026-11-29T12:00:00Z","data":` + data + `}`
	}
	ml := func(id, customer, props string) string {
		return `{"event_id":"` + id + `","customer_id":"` + customer + `","meter":"api_calls","quantity":1,` +
			`"event_time":"2026-11-29T12:00:00Z","properties":` + props + `}`
	}
	goodData := `{"tokens":{"input":1},"model":"m","user":"u"}`
	for _, c := range []struct{ path, ct, good, bad, field, reason string }{
		{"/api/v1/events", "application/cloudevents-batch+json", ce("g", "acme-1", goodData),
			ce("b", "acme-1", `{"tokens":{"input":1},"model":"m`+"\xff"+`","user":"u"}`), "data.model", "UTF-8"},
		{"/api/v1/events", "application/cloudevents-batch+json", ce("g", "acme-1", goodData),
			ce("b", "acme-1", `{"tokens":{"input":1},"model":"m","user":"u","items":[{},{"name":"\ud800"}]}`), "data.items[1].name", "surrogate"},
		{"/api/v1/events", "application/cloudevents-batch+json", ce("g", "acme-1", goodData),
			ce("b", "acme-\xc3", goodData), "subject", "UTF-8"},
		{"/v1/events", "application/json", ml("g", "acme-1", `{}`),
			ml("b", "acme-1", `{"region":"eu","model":"`+"\xfe"+`"}`), "properties.model", "UTF-8"},
		{"/v1/events", "application/json", ml("g", "acme-1", `{}`),
			ml("b", "acme-1\xff", `{}`), "customer_id", "UTF-8"},
	} {
		for _, batch := range []bool{false, true} {
			body, index := c.bad, 0
			if batch {
				body, index = "["+c.good+","+c.bad+"]", 1
			} else if c.path == "/api/v1/events" {
				body = "[" + c.bad + "]"
			}
			code, _, b := e.post(c.path, c.ct, e.token, []byte(body))
			if code != http.StatusBadRequest {
				t.Fatalf("%s %q: %d %s; want 400", c.path, c.bad, code, b)
			}
			p := problem(t, b)
			if len(p.Errors) != 1 {
				t.Fatalf("%s %q: errors %+v; want one", c.path, c.bad, p.Errors)
			}
			got := p.Errors[0]
			if got.Index != index || got.Field != c.field || got.Code != "invalid" || !strings.Contains(got.Reason, c.reason) {
				t.Errorf("%s %q (batch %v): error %+v; want index %d, field %s, a reason naming %s", c.path, c.bad, batch, got, index, c.field, c.reason)
			}
			if want := fmt.Sprintf("Event %d, %s: ", index, c.field); !strings.Contains(p.Detail, want) {
				t.Errorf("%s (batch %v): detail %q does not name %q", c.path, batch, p.Detail, want)
			}
		}
	}
	if n := len(e.records()); n != 0 {
		t.Errorf("%d records written; want none", n)
	}
}

// FuzzFieldAt: fieldAt names a field for any text and offset, valid JSON
// or not, without a panic; within an object's member value it names
// that member.
func FuzzFieldAt(f *testing.F) {
	f.Add([]byte(`{"data":{"items":[{},{"name":"x"}]}}`), 26)
	f.Add([]byte(`{"a":"\ud800","b":[1,{"c":"`+"\xff"+`"}]}`), 27)
	f.Add([]byte(`{"a`), 2)
	f.Fuzz(func(t *testing.T, raw []byte, off int) {
		if off < 0 || off >= len(raw) {
			return
		}
		if got := fieldAt(raw, off); got == "" {
			t.Fatalf("fieldAt(%q, %d) is empty", raw, off)
		}
		// A member "k" whose value holds the offset is named.
		doc := append([]byte(`{"k":"`), raw...)
		doc = append(doc, `"}`...)
		if !strings.ContainsAny(string(raw), "\"\\\x00\x01\x02\x03\x04\x05\x06\x07\x08\t\n\v\f\r\x0e\x0f\x10\x11\x12\x13\x14\x15\x16\x17\x18\x19\x1a\x1b\x1c\x1d\x1e\x1f") {
			if got := fieldAt(doc, 6+off); got != "k" {
				t.Fatalf("fieldAt(%q, %d) = %q, want k", doc, 6+off, got)
			}
		}
	})
}
