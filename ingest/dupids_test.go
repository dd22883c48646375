package ingest

import (
	"net/http"
	"strings"
	"testing"
)

// TestConflictingCopyInOneRequest: two events of one request with the
// same identity (the same source, id and subject of a CloudEvent; the
// same event_id, customer_id and meter on /v1/events) but other content
// would be written both, and dedup would count the first and file the
// other in usage.duplicates as a conflicting copy: the client, answered
// with success, would never learn that one of its usages is not billed.
// Such a request is refused naming the later event, and nothing is sent.
// An exact copy within a request is a copy as a retry is, and passes; so
// does the same (source, id) for another subject (another customer's
// event).
func TestConflictingCopyInOneRequest(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.RefusalRate = -1 })
	ce := func(id, subject string, tokens int, time string) string {
		return `{"specversion":"1.0","id":"` + id + `","source":"s","type":"prompt","subject":"` + subject + `","time":"` + time +
			`","data":{"tokens":{"input":` + strings.Repeat("1", tokens) + `},"model":"m","user":"u"}}`
	}
	const t0, t1 = "2026-11-29T12:00:00Z", "2026-11-29T12:00:01Z"
	ml := func(id string, q string) string {
		return `{"event_id":"` + id + `","customer_id":"acme-1","meter":"api_calls","quantity":` + q + `,"event_time":"` + t0 + `"}`
	}
	for _, c := range []struct {
		name, path, ct, body string
		index                int
		field                string
	}{
		{"other data", "/api/v1/events", "application/cloudevents-batch+json",
			"[" + ce("a", "acme-1", 1, t0) + "," + ce("b", "acme-1", 1, t0) + "," + ce("a", "acme-1", 2, t0) + "]", 2, "id"},
		{"other time", "/api/v1/events", "application/json",
			"[" + ce("a", "acme-1", 1, t0) + "," + ce("a", "acme-1", 1, t1) + "]", 1, "id"},
		{"meterline format", "/v1/events", "application/x-ndjson", ml("a", "1") + "\n" + ml("a", "2") + "\n", 1, "event_id"},
	} {
		code, _, b := e.post(c.path, c.ct, e.token, []byte(c.body))
		if code != http.StatusBadRequest {
			t.Fatalf("%s: %d %s; want 400", c.name, code, b)
		}
		p := problem(t, b)
		if len(p.Errors) != 1 || p.Errors[0].Index != c.index || p.Errors[0].Field != c.field || p.Errors[0].Code != "invalid" ||
			!strings.Contains(p.Errors[0].Reason, "event 0 of this request") {
			t.Errorf("%s: errors %+v; want event %d named by %s, as a copy of event 0 with other content", c.name, p.Errors, c.index, c.field)
		}
	}
	if n := len(e.records()); n != 0 {
		t.Fatalf("%d records written by refused requests; want none", n)
	}
	for _, c := range []struct{ name, path, ct, body string }{
		{"exact copy", "/api/v1/events", "application/cloudevents-batch+json", "[" + ce("c", "acme-1", 1, t0) + "," + ce("c", "acme-1", 1, t0) + "]"},
		{"another subject", "/api/v1/events", "application/cloudevents-batch+json", "[" + ce("d", "acme-1", 1, t0) + "," + ce("d", "acme-2", 2, t0) + "]"},
		{"exact copy, meterline format", "/v1/events", "application/json", "[" + ml("e", "1") + "," + ml("e", "1") + "]"},
	} {
		if code, _, b := e.post(c.path, c.ct, e.token, []byte(c.body)); code >= 300 {
			t.Errorf("%s: %d %s; want success", c.name, code, b)
		}
	}
}
