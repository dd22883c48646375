package ingest

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/meterline/meterline/schemas"
)

// fuzzEndpoints are the request kinds FuzzHandler sends a body as.
var fuzzEndpoints = []struct{ path, ct string }{
	{"/api/v1/events", "application/cloudevents+json"},
	{"/api/v1/events", "application/cloudevents-batch+json"},
	{"/api/v1/events", "application/json"},
	{"/v1/events", "application/json"},
	{"/v1/events", "application/x-ndjson"},
}

// FuzzHandler sends arbitrary bodies (what any HTTP client with a key can
// send) through the whole handler, on kfake: parse, mapping, validation,
// encoding and the send. Every answer is one the API documents, with a
// problem body that decodes and names each bad event by its index in
// order, with a stable code; nothing that is not valid UTF-8 is accepted.
// And a batch of CloudEvents is judged event by event: each event sent on
// its own as application/cloudevents+json (the slow path) is accepted
// exactly when the batch (the fast path, when it applies) accepted it or
// named others only, or named it only as a conflicting copy of another
// event of the batch, and refused for the reason the batch gave.
func FuzzHandler(f *testing.F) {
	good := `{"specversion":"1.0","id":"g1","source":"s","type":"prompt","subject":"acme-1","time":"2026-11-29T12:00:00Z","data":{"tokens":{"input":3},"model":"m","user":"u"}}`
	job := `{"specversion":"1.0","id":"j","source":"s","type":"job","subject":"acme-2","data":{"seconds":"1.5"}}`
	ml := `{"event_id":"a","customer_id":"acme-1","meter":"api_calls","quantity":1,"event_time":"2026-11-29T12:00:00Z","source":"gw"}`
	for _, c := range []struct {
		kind uint8
		body string
	}{
		{0, good}, {1, "[" + good + "," + job + "]"}, {2, "[" + good + "]"}, {2, job},
		{1, "[" + good + `,{"id":"x"},` + strings.Replace(good, `"input":3`, `"input":1e0000001`, 1) + "]"},
		{1, "[" + strings.Replace(good, `"g1"`, `"g\u00e9\ud83d\ude00"`, 1) + "," + strings.Replace(job, `"1.5"`, `2.25e1`, 1) + "]"},
		// data that is not an object, and "time": "": refused.
		{1, "[" + strings.Replace(good, `{"tokens":{"input":3},"model":"m","user":"u"}`, `"x"`, 1) + "," + strings.Replace(job, `{"seconds":"1.5"}`, `[1.5]`, 1) + "]"},
		{2, "[" + strings.Replace(good, `"2026-11-29T12:00:00Z","data":{"tokens":{"input":3},"model":"m","user":"u"}`, `"","data":7`, 1) + "," + strings.Replace(job, `{"seconds":"1.5"}`, `null`, 1) + "," + strings.Replace(job, `{"seconds":"1.5"}`, `true`, 1) + "]"},
		{1, "[" + strings.Replace(good, `"data":{"tokens":{"input":3},"model":"m","user":"u"}`, `"data_base64":"eyJ0b2tlbnMiOnsiaW5wdXQiOjN9LCJ1c2VyIjoidSJ9"`, 1) + "," +
			strings.Replace(good, `"data":`, `"datacontenttype":"Application/JSON; charset=utf-8","data":`, 1) + "," +
			strings.Replace(good, `"data":`, `"data_base64":"eA==","data":`, 1) + "]"},
		{3, ml}, {3, "[" + ml + "," + strings.Replace(ml, `"quantity":1`, `"quantity":-1`, 1) + "]"}, {4, ml + "\n\n" + ml + "\n"},
		// Names repeated: the last id counts; a second specversion, and a
		// property named twice, are refused.
		{1, "[" + strings.Replace(good, `"g1"`, `"g1","id":"g2"`, 1) + "," + strings.Replace(job, `"j"`, `"j","specversion":"1.0"`, 1) + "]"},
		{3, strings.Replace(ml, `"gw"`, `"gw","properties":{"r":"eu","\u0072":"us"}`, 1)},
	} {
		f.Add(c.kind, []byte(c.body))
	}
	// No refusal budget: the fuzzer sends far more refused events a
	// second than it allows, and would be answered 429.
	e := newEnv(f, func(c *Config) { c.RefusalRate = -1 })
	h := e.srv.Handler()
	codes := []string{schemas.ReasonInvalid, schemas.ReasonOversized, schemas.ReasonInFuture, schemas.ReasonTooOld, schemas.ReasonUnknownMeter,
		CodeUnknownEventType, CodeOutOfScope}
	serve := func(t *testing.T, kind uint8, body []byte) (int, Problem) {
		ep := fuzzEndpoints[int(kind)%len(fuzzEndpoints)]
		req := httptest.NewRequest(http.MethodPost, ep.path, bytes.NewReader(body))
		req.Header.Set("Content-Type", ep.ct)
		req.Header.Set("Authorization", "Bearer "+e.token)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		switch w.Code {
		case http.StatusAccepted, http.StatusNoContent:
			if !utf8.Valid(body) {
				t.Fatalf("%s %s: %d for a body that is not valid UTF-8: %q", ep.path, ep.ct, w.Code, body)
			}
			return w.Code, Problem{}
		case http.StatusBadRequest, http.StatusForbidden, http.StatusRequestEntityTooLarge:
		default:
			t.Fatalf("%s %s: %d %s for %q", ep.path, ep.ct, w.Code, w.Body, body)
		}
		p := problem(t, w.Body.Bytes())
		if p.Status != w.Code || !strings.HasPrefix(p.Type, problemTypePrefix) || p.Detail == "" {
			t.Fatalf("%s %s: %d with problem %+v", ep.path, ep.ct, w.Code, p)
		}
		if !slices.IsSortedFunc(p.Errors, func(a, b EventError) int { return a.Index - b.Index }) {
			t.Fatalf("%s %s: errors not in order: %+v", ep.path, ep.ct, p.Errors)
		}
		for _, ee := range p.Errors {
			// A field may be named "" only as the name of an unknown
			// member ({"": 1}), or of a CloudEvent member that is no
			// valid extension attribute name ({"": {}}).
			unnamed := ee.Reason == "is not a known field" || strings.HasPrefix(ee.Reason, "is not a valid extension attribute name")
			if ee.Index < 0 || ee.Field == "" && !unnamed || ee.Reason == "" || !slices.Contains(codes, ee.Code) {
				t.Fatalf("%s %s: bad event error %+v for %q", ep.path, ep.ct, ee, body)
			}
		}
		return w.Code, p
	}
	f.Fuzz(func(t *testing.T, kind uint8, body []byte) {
		kind %= uint8(len(fuzzEndpoints))
		status, p := serve(t, kind, body)
		if kind != 1 && kind != 2 || status != http.StatusNoContent && p.Type != problemTypePrefix+"invalid-events" {
			return
		}
		var elems []json.RawMessage
		if json.Unmarshal(body, &elems) != nil {
			return // one object as application/json
		}
		if len(elems) > 16 {
			return
		}
		bad := map[int][]EventError{}
		for _, ee := range p.Errors {
			bad[ee.Index] = append(bad[ee.Index], EventError{Field: ee.Field, Code: ee.Code, Reason: ee.Reason})
		}
		for i, el := range elems {
			st, pi := serve(t, 0, el)
			_, isBad := bad[i]
			switch {
			case !isBad && st != http.StatusNoContent:
				t.Fatalf("event %d of %q: accepted in the batch (%+v), alone %d %+v", i, body, p, st, pi)
			case isBad && st == http.StatusNoContent && !conflictingCopy(bad[i]):
				t.Fatalf("event %d of %q: refused in the batch (%+v), accepted alone", i, body, bad[i])
			case isBad && pi.Type == problemTypePrefix+"invalid-events" && !slices.Equal(pi.Errors, bad[i]):
				t.Fatalf("event %d of %q: refused in the batch for %+v, alone for %+v", i, body, bad[i], pi.Errors)
			}
		}
	})
}

// conflictingCopy reports whether errs, an event's errors in a batch,
// name it only as a copy of an earlier event of the batch with other
// content (conflictingCopies), which it is not when sent alone.
func conflictingCopy(errs []EventError) bool {
	return len(errs) == 1 && strings.HasPrefix(errs[0].Reason, "has the identity of event ")
}
