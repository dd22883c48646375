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
