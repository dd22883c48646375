package ingest

import (
	"bytes"
	"encoding/json"
	"net/http"
	"testing"
)

// TestNDJSONTrailingTextRefused: a line of /v1/events' NDJSON with text
// after its event ("{…}]{…}") is refused, 400 naming the line, and
// nothing is sent; it was answered 202 with the first event written and
// the second lost without a word (producer.ParseJSON).
func TestNDJSONTrailingTextRefused(t *testing.T) {
	e := newEnv(t, nil)
	a := `{"event_id":"a","customer_id":"acme-1","meter":"api_calls","quantity":1,"event_time":"2026-11-29T12:00:00Z"}`
	b := `{"event_id":"b","customer_id":"acme-1","meter":"api_calls","quantity":1,"event_time":"2026-11-29T12:00:00Z"}`
	for _, body := range []string{a + "]" + b + "\n", a + "\n" + b + "}\n"} {
		status, _, resp := e.post("/v1/events", "application/x-ndjson", e.token, []byte(body))
		if status != http.StatusBadRequest {
			t.Errorf("%s: %d %s; want 400", body, status, resp)
			continue
		}
		p := problem(t, resp)
		if len(p.Errors) != 1 || p.Errors[0].Field != "event" || p.Errors[0].Code != "invalid" {
			t.Errorf("%s: %+v; want one invalid event", body, p.Errors)
		}
		var compact bytes.Buffer
		_ = json.Compact(&compact, resp)
		t.Logf("%s", compact.String())
	}
	if recs := e.records(); len(recs) != 0 {
		t.Errorf("%d records written from refused requests", len(recs))
	}
}

// TestNonJSONBlanksRefused: JSON's blanks are space, tab, line feed and
// carriage return (RFC 8259); a body, or an NDJSON line, with other white
// space around its value (a no-break space, U+0085, U+2028, a form feed)
// is not JSON, and is refused as such, nothing sent. bytes.TrimSpace,
// which trims any Unicode white space, took it.
func TestNonJSONBlanksRefused(t *testing.T) {
	e := newEnv(t, nil)
	ce := `{"specversion":"1.0","id":"g1","source":"s","type":"prompt","subject":"acme-1","time":"2026-11-29T12:00:00Z","data":{"tokens":{"input":3},"user":"u"}}`
	ev := `{"event_id":"a","customer_id":"acme-1","meter":"api_calls","quantity":1,"event_time":"2026-11-29T12:00:00Z"}`
	for _, blank := range []string{"\u00a0", "\u0085", "\u2028", "\f", "\v"} {
		for _, c := range []struct{ path, ct, body string }{
			{"/api/v1/events", "application/cloudevents+json", blank + ce},
			{"/api/v1/events", "application/json", ce + blank},
			{"/api/v1/events", "application/cloudevents-batch+json", blank + "[" + ce + "]"},
			{"/api/v1/events", "application/json", "[" + ce + "]" + blank},
			{"/v1/events", "application/json", blank + ev},
			{"/v1/events", "application/json", "[" + ev + "]" + blank},
			{"/v1/events", "application/x-ndjson", ev + "\n" + blank + ev + "\n"},
			{"/v1/events", "application/x-ndjson", ev + "\n" + blank + "\n"},
		} {
			status, _, resp := e.post(c.path, c.ct, e.token, []byte(c.body))
			if status != http.StatusBadRequest {
				t.Errorf("%q around %s %s: %d %s; want 400", blank, c.path, c.ct, status, resp)
			}
		}
	}
	if recs := e.records(); len(recs) != 0 {
		t.Errorf("%d records written from refused requests", len(recs))
	}
}
