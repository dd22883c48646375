package ingest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/meterline/meterline/dedup"
	"github.com/meterline/meterline/producer"
)

// compactProblem posts body and returns the status and the answer,
// compacted.
func (e *env) compactProblem(path, ct, body string) (int, string) {
	e.t.Helper()
	status, _, b := e.post(path, ct, e.token, []byte(body))
	var compact bytes.Buffer
	if len(b) > 0 {
		if err := json.Compact(&compact, b); err != nil {
			e.t.Fatalf("%d: body is not JSON: %s", status, b)
		}
	}
	return status, compact.String()
}

// An event certainly too old for dedup's window is refused at the door,
// too_old, on both endpoints: more than W plus the max skew (the margin
// for the ingest's clock being ahead of the broker's) before the ingest's
// clock. One within that bound is sent: dedup, by the broker's clock,
// decides it.
func TestTooOldRefused(t *testing.T) {
	now := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	e := newEnv(t, func(c *Config) { c.MaxAge = 0; c.Clock = func() time.Time { return now } })
	bound := dedup.DefaultWindow + producer.DefaultMaxSkew
	if e.srv.cfg.MaxAge != bound {
		t.Fatalf("MaxAge %s, want W + S = %s", e.srv.cfg.MaxAge, bound)
	}
	ts := func(d time.Duration) string { return now.Add(-d).Format(time.RFC3339Nano) }
	ce := func(id, tm string) string {
		return fmt.Sprintf(`{"specversion":"1.0","id":%q,"source":"s","type":"prompt","subject":"acme-1","time":%q,"data":{"tokens":{"input":3},"user":"u"}}`, id, tm)
	}
	ml := func(id, tm string) string {
		return fmt.Sprintf(`{"event_id":%q,"customer_id":"acme-1","meter":"api_calls","quantity":1,"event_time":%q}`, id, tm)
	}
	old := ts(bound + time.Millisecond)
	reason := old + ` is more than 841h0m0s before now: dedup would reject it as too old`
	status, got := e.compactProblem("/api/v1/events", "application/cloudevents-batch+json",
		"["+ce("a", ts(bound))+","+ce("b", old)+"]")
	want := `{"type":"urn:meterline:problem:invalid-events","title":"Invalid events","status":400,"detail":"1 of 2 events are invalid; nothing was sent","errors":[{"index":1,"field":"time","code":"too_old","reason":"` + reason + `"}]}`
	if status != 400 || got != want {
		t.Errorf("CloudEvents: got %d %s\nwant 400 %s", status, got, want)
	}
	status, got = e.compactProblem("/v1/events", "application/x-ndjson", ml("a", ts(bound))+"\n"+ml("b", old))
	want = strings.ReplaceAll(want, `"field":"time"`, `"field":"event_time"`)
	if status != 400 || got != want {
		t.Errorf("NDJSON: got %d %s\nwant 400 %s", status, got, want)
	}
	if n := len(e.records()); n != 0 {
		t.Fatalf("%d records sent for refused requests", n)
	}
	// At the bound, and W before now (which dedup rejects only if the
	// broker's clock is not behind the ingest's): sent.
	if status, got := e.compactProblem("/api/v1/events", "application/cloudevents-batch+json",
		"["+ce("c", ts(bound))+","+ce("d", ts(dedup.DefaultWindow))+"]"); status != 204 {
		t.Errorf("CloudEvents within the bound: got %d %s", status, got)
	}
	if status, got := e.compactProblem("/v1/events", "application/json", ml("c", ts(bound))); status != 202 {
		t.Errorf("NDJSON within the bound: got %d %s", status, got)
	}
	if n := len(e.records()); n != 3*2+1 {
		t.Errorf("%d records, want 7", n)
	}
	if v := testutil.ToFloat64(e.srv.metrics.byReason.WithLabelValues("acme", "too_old")); v != 2 {
		t.Errorf("refused too_old: %v, want 2", v)
	}
}

