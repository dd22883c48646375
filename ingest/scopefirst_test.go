package ingest

import (
	"strings"
	"testing"
)

// TestOutOfScopeNamedBeforeUnknownMeter: with strict meters, an event of
// Meterline's format for a customer outside the key's scope and of a meter
// the meters file does not declare is answered 403 out_of_scope, as one of
// a declared meter is: the scope is the request's first fault.
func TestOutOfScopeNamedBeforeUnknownMeter(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.StrictMeters = true })
	status, _, body := e.post("/v1/events", "application/x-ndjson", e.token,
		[]byte(`{"event_id":"n1","customer_id":"globex-1","meter":"nosuch","quantity":1,"event_time":"2026-11-29T12:00:00Z"}`+"\n"))
	if status != 403 || !strings.Contains(string(body), `"field":"customer_id","code":"out_of_scope"`) {
		t.Fatalf("got %d %s, want 403 naming customer_id out_of_scope", status, body)
	}
}
