package ingest

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// Each kind of bad input gets its exact status and body, and nothing is
// sent: not one record of the request reaches Kafka.
func TestBadInput(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.MaxBodyBytes = 4096; c.MaxEvents = 5 })
	ctx := context.Background()
	revokedKey, revoked, err := e.admin.CreateKey(ctx, KeySpec{Tenant: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.admin.RevokeKey(ctx, revokedKey.ID); err != nil {
		t.Fatal(err)
	}
	_, onlyPrompts, err := e.admin.CreateKey(ctx, KeySpec{Tenant: "acme", Customers: []string{"acme-1"}, Meters: []string{"api_calls"}})
	if err != nil {
		t.Fatal(err)
	}
	waitKeys(t, e.srv, 3)

	good := `{"specversion":"1.0","id":"g1","source":"s","type":"prompt","subject":"acme-1","time":"2026-11-29T12:00:00Z","data":{"tokens":{"input":3},"user":"u"}}`
	ce := func(mod string) string { return strings.Replace(good, `"id":"g1"`, mod, 1) }
	cases := []struct {
		name, path, ct, token string
		body                  string
		status                int
		want                  string // the whole body, compact
	}{
		{"malformed JSON", "/api/v1/events", "application/cloudevents-batch+json", e.token, `[` + good + `,{"id":`, 400,
			`{"type":"urn:meterline:problem:malformed","title":"Malformed body","status":400,"detail":"malformed JSON: unexpected end of JSON input (at byte 158); nothing was sent"}`},
		{"missing field", "/api/v1/events", "application/cloudevents-batch+json", e.token, `[` + good + `,` + strings.Replace(good, `"subject":"acme-1",`, "", 1) + `]`, 400,
			`{"type":"urn:meterline:problem:invalid-events","title":"Invalid events","status":400,"detail":"1 of 2 events are invalid; nothing was sent. Event 1, subject: is missing (CloudEvents requires it; subject is the customer)","errors":[{"index":1,"field":"subject","code":"invalid","reason":"is missing (CloudEvents requires it; subject is the customer)"}]}`},
		// null is no event, not one of no attributes ("id is missing").
		{"null in a batch", "/api/v1/events", "application/cloudevents-batch+json", e.token, `[` + good + `,null]`, 400,
			`{"type":"urn:meterline:problem:invalid-events","title":"Invalid events","status":400,"detail":"1 of 2 events are invalid; nothing was sent. Event 1, event: is not a JSON object","errors":[{"index":1,"field":"event","code":"invalid","reason":"is not a JSON object"}]}`},
		{"null in an application/json array", "/api/v1/events", "application/json", e.token, `[null]`, 400,
			`{"type":"urn:meterline:problem:invalid-events","title":"Invalid events","status":400,"detail":"1 of 1 events are invalid; nothing was sent. Event 0, event: is not a JSON object","errors":[{"index":0,"field":"event","code":"invalid","reason":"is not a JSON object"}]}`},
		{"null on /v1/events", "/v1/events", "application/x-ndjson", e.token, "null\n", 400,
			`{"type":"urn:meterline:problem:invalid-events","title":"Invalid events","status":400,"detail":"1 of 1 events are invalid; nothing was sent. Event 0, event: malformed JSON: an event is a JSON object, not null","errors":[{"index":0,"field":"event","code":"invalid","reason":"malformed JSON: an event is a JSON object, not null"}]}`},
		{"null in an array on /v1/events", "/v1/events", "application/json", e.token, `[null]`, 400,
			`{"type":"urn:meterline:problem:invalid-events","title":"Invalid events","status":400,"detail":"1 of 1 events are invalid; nothing was sent. Event 0, event: malformed JSON: an event is a JSON object, not null","errors":[{"index":0,"field":"event","code":"invalid","reason":"malformed JSON: an event is a JSON object, not null"}]}`},
		{"wrong type", "/api/v1/events", "application/cloudevents+json", e.token, ce(`"id":7`), 400,
			`{"type":"urn:meterline:problem:invalid-events","title":"Invalid events","status":400,"detail":"1 of 1 events are invalid; nothing was sent. Event 0, id: must be a string, not a JSON number","errors":[{"index":0,"field":"id","code":"invalid","reason":"must be a string, not a JSON number"}]}`},
		{"wrong value type", "/api/v1/events", "application/cloudevents+json", e.token, strings.Replace(good, `"input":3`, `"input":true`, 1), 400,
			`{"type":"urn:meterline:problem:invalid-events","title":"Invalid events","status":400,"detail":"1 of 1 events are invalid; nothing was sent. Event 0, data.tokens.input: must be a number or a numeric string (meter input_tokens)","errors":[{"index":0,"field":"data.tokens.input","code":"invalid","reason":"must be a number or a numeric string (meter input_tokens)"}]}`},
		{"invalid UTF-8", "/api/v1/events", "application/cloudevents-batch+json", e.token, `[` + good + `,` + strings.Replace(good, `acme-1`, "acme-\xff", 1) + `]`, 400,
			`{"type":"urn:meterline:problem:invalid-events","title":"Invalid events","status":400,"detail":"1 of 2 events are invalid; nothing was sent. Event 1, subject: is not valid UTF-8 (byte 0xff at offset 76)","errors":[{"index":1,"field":"subject","code":"invalid","reason":"is not valid UTF-8 (byte 0xff at offset 76)"}]}`},
		{"lone surrogate escape", "/api/v1/events", "application/cloudevents+json", e.token, strings.Replace(good, `acme-1`, `acme-\ud800`, 1), 400,
			`{"type":"urn:meterline:problem:invalid-events","title":"Invalid events","status":400,"detail":"1 of 1 events are invalid; nothing was sent. Event 0, subject: is not valid text (\\ud800 at offset 76 is half of a UTF-16 surrogate pair)","errors":[{"index":0,"field":"subject","code":"invalid","reason":"is not valid text (\\ud800 at offset 76 is half of a UTF-16 surrogate pair)"}]}`},
		{"lone surrogate escapes in a batch", "/api/v1/events", "application/cloudevents-batch+json", e.token,
			`[` + strings.Replace(good, `"id":"g1"`, `"id":"g\ud83d\ude00"`, 1) + `,` + strings.Replace(good, `"id":"g1"`, `"id":"g\udfff"`, 1) + `,` +
				strings.Replace(good, `"user":"u"`, `"user":"\\ud800\ud83d"`, 1) + `]`, 400,
			`{"type":"urn:meterline:problem:invalid-events","title":"Invalid events","status":400,"detail":"2 of 3 events are invalid; nothing was sent. Event 1, id: is not valid text (\\udfff at offset 28 is half of a UTF-16 surrogate pair)","errors":[{"index":1,"field":"id","code":"invalid","reason":"is not valid text (\\udfff at offset 28 is half of a UTF-16 surrogate pair)"},{"index":2,"field":"data.user","code":"invalid","reason":"is not valid text (\\ud83d at offset 153 is half of a UTF-16 surrogate pair)"}]}`},
		{"control character in id", "/api/v1/events", "application/cloudevents-batch+json", e.token, `[` + good + `,` + ce(`"id":"g\u0000"`) + `]`, 400,
			`{"type":"urn:meterline:problem:invalid-events","title":"Invalid events","status":400,"detail":"1 of 2 events are invalid; nothing was sent. Event 1, id: holds the control character U+0000 at offset 1 (not allowed in identity fields and source)","errors":[{"index":1,"field":"id","code":"invalid","reason":"holds the control character U+0000 at offset 1 (not allowed in identity fields and source)"}]}`},
		{"body over the limit", "/api/v1/events", "application/cloudevents-batch+json", e.token, `[` + strings.Repeat(good+",", 30) + good + `]`, 413,
			`{"type":"urn:meterline:problem:too-large","title":"Body too large","status":413,"detail":"the body is larger than 4096 bytes: split the batch"}`},
		{"too many events", "/api/v1/events", "application/cloudevents-batch+json", e.token, `[` + strings.Repeat(good+",", 5) + good + `]`, 413,
			`{"type":"urn:meterline:problem:too-large","title":"Too many events","status":413,"detail":"6 events in one request, more than 5: split the batch"}`},
		{"unknown event type", "/api/v1/events", "application/cloudevents+json", e.token, strings.Replace(good, `"type":"prompt"`, `"type":"promt"`, 1), 400,
			`{"type":"urn:meterline:problem:invalid-events","title":"Invalid events","status":400,"detail":"1 of 1 events are invalid; nothing was sent. Event 0, type: \"promt\" feeds no meter (the meters file declares no event_type \"promt\")","errors":[{"index":0,"field":"type","code":"unknown_event_type","reason":"\"promt\" feeds no meter (the meters file declares no event_type \"promt\")"}]}`},
		{"subject outside the key's scope", "/api/v1/events", "application/cloudevents-batch+json", e.token, `[` + good + `,` + strings.Replace(good, `acme-1`, `globex-1`, 1) + `]`, 403,
			`{"type":"urn:meterline:problem:forbidden","title":"Outside the key's scope","status":403,"detail":"1 of 2 events are outside what key KEYID may write; nothing was sent. Event 1, subject: customer \"globex-1\" is not one of tenant acme's customers","errors":[{"index":1,"field":"subject","code":"out_of_scope","reason":"customer \"globex-1\" is not one of tenant acme's customers"}]}`},
		// A 403 names every bad event: those outside the key's scope and
		// the invalid ones, which would otherwise be named only once the
		// first are fixed and the request sent again.
		{"outside the key's scope and invalid", "/api/v1/events", "application/cloudevents-batch+json", e.token,
			`[` + good + `,` + strings.Replace(good, `acme-1`, `globex-1`, 1) + `,` + strings.Replace(good, `"input":3`, `"input":2.5`, 1) + `,` +
				strings.Replace(good, `"time":"2026-11-29T12:00:00Z"`, `"time":"3026-11-29T12:00:00Z"`, 1) + `]`, 403,
			`{"type":"urn:meterline:problem:forbidden","title":"Outside the key's scope","status":403,"detail":"1 of 4 events are outside what key KEYID may write, and 2 are invalid; nothing was sent. Event 1, subject: customer \"globex-1\" is not one of tenant acme's customers","errors":[` +
				`{"index":1,"field":"subject","code":"out_of_scope","reason":"customer \"globex-1\" is not one of tenant acme's customers"},` +
				`{"index":2,"field":"data.tokens.input","code":"invalid","reason":"\"2.5\" is not an integer in the meter's base unit (declare a scale in the meters file to accept decimals) (meter input_tokens)"},` +
				`{"index":3,"field":"time","code":"in_future","reason":"3026-11-29T12:00:00Z is more than 1h0m0s after now"}]}`},
		// An event outside the key's scope is named by its scope's error
		// even when its fields are invalid too.
		{"outside the key's scope with an invalid value", "/api/v1/events", "application/cloudevents+json", e.token,
			strings.Replace(strings.Replace(good, `acme-1`, `globex-1`, 1), `"input":3`, `"input":2.5`, 1), 403,
			`{"type":"urn:meterline:problem:forbidden","title":"Outside the key's scope","status":403,"detail":"1 of 1 events are outside what key KEYID may write; nothing was sent. Event 0, subject: customer \"globex-1\" is not one of tenant acme's customers","errors":[{"index":0,"field":"subject","code":"out_of_scope","reason":"customer \"globex-1\" is not one of tenant acme's customers"}]}`},
		{"meter outside the key's scope", "/api/v1/events", "application/cloudevents+json", onlyPrompts, good, 403,
			`{"type":"urn:meterline:problem:forbidden","title":"Outside the key's scope","status":403,"detail":"1 of 1 events are outside what key KEYID may write; nothing was sent. Event 0, type: meter \"input_tokens\" is outside the key's meters","errors":[{"index":0,"field":"type","code":"out_of_scope","reason":"meter \"input_tokens\" is outside the key's meters"}]}`},
		{"revoked key", "/api/v1/events", "application/cloudevents+json", revoked, good, 401,
			`{"type":"urn:meterline:problem:unauthorized","title":"Unauthorized","status":401,"detail":"the API key is not known or was revoked"}`},
		{"no key", "/api/v1/events", "application/cloudevents+json", "", good, 401,
			`{"type":"urn:meterline:problem:unauthorized","title":"Unauthorized","status":401,"detail":"no API key: send Authorization: Bearer \u003ckey\u003e"}`},
		{"non-integer value", "/api/v1/events", "application/cloudevents+json", e.token, strings.Replace(good, `"input":3`, `"input":"2.5"`, 1), 400,
			`{"type":"urn:meterline:problem:invalid-events","title":"Invalid events","status":400,"detail":"1 of 1 events are invalid; nothing was sent. Event 0, data.tokens.input: \"2.5\" is not an integer in the meter's base unit (declare a scale in the meters file to accept decimals) (meter input_tokens)","errors":[{"index":0,"field":"data.tokens.input","code":"invalid","reason":"\"2.5\" is not an integer in the meter's base unit (declare a scale in the meters file to accept decimals) (meter input_tokens)"}]}`},
		{"content type", "/api/v1/events", "text/plain", e.token, good, 415,
			`{"type":"urn:meterline:problem:unsupported-media-type","title":"Unsupported media type","status":415,"detail":"Content-Type \"text/plain\": want application/cloudevents+json, application/cloudevents-batch+json or application/json"}`},
		{"content type on /v1/events", "/v1/events", "application/cloudevents+json", e.token, `{}`, 415,
			`{"type":"urn:meterline:problem:unsupported-media-type","title":"Unsupported media type","status":415,"detail":"Content-Type \"application/cloudevents+json\": want application/json (an object or an array), or application/x-ndjson, application/ndjson or application/jsonl (one event a line)"}`},
		{"event time in the future", "/api/v1/events", "application/cloudevents+json", e.token, strings.Replace(good, `2026-11-29T12:00:00Z`, `2999-01-01T00:00:00Z`, 1), 400,
			`{"type":"urn:meterline:problem:invalid-events","title":"Invalid events","status":400,"detail":"1 of 1 events are invalid; nothing was sent. Event 0, time: 2999-01-01T00:00:00Z is more than 1h0m0s after now","errors":[{"index":0,"field":"time","code":"in_future","reason":"2999-01-01T00:00:00Z is more than 1h0m0s after now"}]}`},
		// Go's zero time, written out, is a time: refused as any time
		// before 2000 is, not taken for a missing one (which gets the
		// time the request was received), alone or in a batch.
		{"event time of the year 1", "/api/v1/events", "application/cloudevents-batch+json", e.token,
			`[` + good + `,` + strings.Replace(good, `2026-11-29T12:00:00Z`, `0001-01-01T00:00:00Z`, 1) + `,` + strings.Replace(good, `2026-11-29T12:00:00Z`, `0000-12-31T23:00:00-01:00`, 1) + `]`, 400,
			`{"type":"urn:meterline:problem:invalid-events","title":"Invalid events","status":400,"detail":"2 of 3 events are invalid; nothing was sent. Event 1, time: \"0001-01-01T00:00:00Z\" is before 2000-01-01","errors":[{"index":1,"field":"time","code":"invalid","reason":"\"0001-01-01T00:00:00Z\" is before 2000-01-01"},{"index":2,"field":"time","code":"invalid","reason":"\"0000-12-31T23:00:00-01:00\" is before 2000-01-01"}]}`},
		{"event time of the year 1, one event", "/api/v1/events", "application/cloudevents+json", e.token, strings.Replace(good, `2026-11-29T12:00:00Z`, `0001-01-01T00:00:00.000Z`, 1), 400,
			`{"type":"urn:meterline:problem:invalid-events","title":"Invalid events","status":400,"detail":"1 of 1 events are invalid; nothing was sent. Event 0, time: \"0001-01-01T00:00:00.000Z\" is before 2000-01-01","errors":[{"index":0,"field":"time","code":"invalid","reason":"\"0001-01-01T00:00:00.000Z\" is before 2000-01-01"}]}`},
		{"every bad event listed", "/v1/events", "application/x-ndjson", e.token,
			`{"event_id":"a","customer_id":"acme-1","meter":"api_calls","quantity":1,"event_time":"2026-11-29T12:00:00Z"}` + "\n" +
				`{"event_id":"b","customer_id":"acme-1","meter":"api_calls","quantity":-1,"event_time":"2026-11-29T12:00:00Z"}` + "\n" +
				`{"event_id":"c","customer_id":"acme-1","meter":"api_calls","quantity":"x","event_time":"2026-11-29T12:00:00Z"}` + "\n" +
				`{"event_id":"d","customer_id":"acme-1","meter":"api_calls","quantity":1}`, 400,
			`{"type":"urn:meterline:problem:invalid-events","title":"Invalid events","status":400,"detail":"3 of 4 events are invalid; nothing was sent. Event 1, quantity: must not be negative (got -1)","errors":[{"index":1,"field":"quantity","code":"invalid","reason":"must not be negative (got -1)"},{"index":2,"field":"quantity","code":"invalid","reason":"must be an integer (got \"x\")"},{"index":3,"field":"event_time","code":"invalid","reason":"is missing"}]}`},
		// event_time is RFC 3339: a full stop before a fraction of a
		// second, never a comma, which time.Parse takes (as a
		// CloudEvent's time: TestOpenMeterParity).
		{"event_time with a decimal comma", "/v1/events", "application/x-ndjson", e.token,
			`{"event_id":"a","customer_id":"acme-1","meter":"api_calls","quantity":1,"event_time":"2026-11-29T12:00:00.5Z"}` + "\n" +
				`{"event_id":"b","customer_id":"acme-1","meter":"api_calls","quantity":1,"event_time":"2026-11-29T12:00:00,5Z"}`, 400,
			`{"type":"urn:meterline:problem:invalid-events","title":"Invalid events","status":400,"detail":"1 of 2 events are invalid; nothing was sent. Event 1, event_time: \"2026-11-29T12:00:00,5Z\" is not RFC 3339 (like 2026-11-29T12:00:00.250Z)","errors":[{"index":1,"field":"event_time","code":"invalid","reason":"\"2026-11-29T12:00:00,5Z\" is not RFC 3339 (like 2026-11-29T12:00:00.250Z)"}]}`},
		// An identity field of white space only is as good as none
		// (docs/design.md, Event identity and keys).
		{"event_id blank", "/v1/events", "application/json", e.token,
			`[{"event_id":"a","customer_id":"acme-1","meter":"api_calls","quantity":1,"event_time":"2026-11-29T12:00:00Z"},` +
				`{"event_id":"   ","customer_id":"acme-1","meter":"api_calls","quantity":1,"event_time":"2026-11-29T12:00:00Z"}]`, 400,
			`{"type":"urn:meterline:problem:invalid-events","title":"Invalid events","status":400,"detail":"1 of 2 events are invalid; nothing was sent. Event 1, event_id: must not be blank (white space only)","errors":[{"index":1,"field":"event_id","code":"invalid","reason":"must not be blank (white space only)"}]}`},
		{"CloudEvent id blank", "/api/v1/events", "application/cloudevents-batch+json", e.token, `[` + good + `,` + ce(`"id":"   "`) + `]`, 400,
			`{"type":"urn:meterline:problem:invalid-events","title":"Invalid events","status":400,"detail":"1 of 2 events are invalid; nothing was sent. Event 1, id: must not be blank (white space only)","errors":[{"index":1,"field":"id","code":"invalid","reason":"must not be blank (white space only)"}]}`},
		// An element that is no object is named as such, not with the
		// name of the Go type it would have been decoded into.
		{"events that are not objects", "/v1/events", "application/json", e.token, `[1,"x",[],true]`, 400,
			`{"type":"urn:meterline:problem:invalid-events","title":"Invalid events","status":400,"detail":"4 of 4 events are invalid; nothing was sent. Event 0, event: malformed JSON: an event is a JSON object, not a JSON number","errors":[{"index":0,"field":"event","code":"invalid","reason":"malformed JSON: an event is a JSON object, not a JSON number"},{"index":1,"field":"event","code":"invalid","reason":"malformed JSON: an event is a JSON object, not a JSON string"},{"index":2,"field":"event","code":"invalid","reason":"malformed JSON: an event is a JSON object, not a JSON array"},{"index":3,"field":"event","code":"invalid","reason":"malformed JSON: an event is a JSON object, not a JSON bool"}]}`},
		// A repeated member name, of the event or of its properties, is
		// refused naming it (producer.ParseJSON), not read last-wins.
		{"repeated member names", "/v1/events", "application/json", e.token,
			`[{"event_id":"a","customer_id":"acme-1","meter":"api_calls","quantity":1,"event_time":"2026-11-29T12:00:00Z"},` +
				`{"event_id":"b","customer_id":"acme-1","meter":"api_calls","quantity":1,"quantity":100,"event_time":"2026-11-29T12:00:00Z"},` +
				`{"event_id":"c","customer_id":"acme-1","meter":"api_calls","quantity":1,"event_time":"2026-11-29T12:00:00Z","properties":{"region":"eu","region":"us"}}]`, 400,
			`{"type":"urn:meterline:problem:invalid-events","title":"Invalid events","status":400,"detail":"2 of 3 events are invalid; nothing was sent. Event 1, quantity: appears twice","errors":[{"index":1,"field":"quantity","code":"invalid","reason":"appears twice"},{"index":2,"field":"properties.region","code":"invalid","reason":"appears twice"}]}`},
		{"repeated member name in one event", "/v1/events", "application/json", e.token,
			`{"event_id":"a","customer_id":"acme-1","customer_id":"acme-2","meter":"api_calls","quantity":1,"event_time":"2026-11-29T12:00:00Z"}`, 400,
			`{"type":"urn:meterline:problem:invalid-events","title":"Invalid events","status":400,"detail":"1 of 1 events are invalid; nothing was sent. Event 0, customer_id: appears twice","errors":[{"index":0,"field":"customer_id","code":"invalid","reason":"appears twice"}]}`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			status, hdr, b := e.post(c.path, c.ct, c.token, []byte(c.body))
			want := strings.ReplaceAll(c.want, "KEYID", tokenID(c.token))
			var compact bytes.Buffer
			if err := json.Compact(&compact, b); err != nil {
				t.Fatalf("%d: body is not JSON: %s", status, b)
			}
			if status != c.status || compact.String() != want {
				t.Errorf("got %d %s\nwant %d %s", status, compact.String(), c.status, want)
			}
			if ct := hdr.Get("Content-Type"); ct != "application/problem+json" {
				t.Errorf("Content-Type %q", ct)
			}
			if status == http.StatusUnauthorized && hdr.Get("WWW-Authenticate") == "" {
				t.Error("401 without WWW-Authenticate")
			}
		})
	}
	if recs := e.records(); len(recs) != 0 {
		t.Errorf("%d records reached Kafka from refused requests", len(recs))
	}
}

// waitKeys waits until the server knows n keys.
func waitKeys(t *testing.T, srv *Server, n int) {
	t.Helper()
	for i := 0; i < 2000; i++ {
		if ks, _ := srv.Keys().Snapshot(); len(ks) >= n {
			return
		}
		sleepMs(10)
	}
	t.Fatalf("server never saw %d keys", n)
}

// An answer repeats at most a few dozen bytes of each value it quotes: a
// request of long values (a type, a subject out of the key's scope, a
// time) is answered with less than its own size, not several times it
// (a quoted DEL takes five bytes in the answer).
func TestLongValuesClipped(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.RefusalRate = -1 }) // every request is refused: no refusal budget (TestRefusalBudget)
	good := `{"specversion":"1.0","id":"g1","source":"s","type":"prompt","subject":"acme-1","data":{"tokens":{"input":3},"user":"u"}}`
	long := strings.Repeat("\x7f", 900)
	for _, c := range []struct {
		old, new string
		status   int
		reason   string
	}{
		{`"prompt"`, `"` + long + `"`, 400, `"` + strings.Repeat(`\x7f`, maxEcho) + `…" feeds no meter`},
		{`"acme-1"`, `"` + long + `"`, 403, `customer "` + strings.Repeat(`\x7f`, maxEcho) + `…" is not one of tenant acme's customers`},
		{`"id":"g1"`, `"id":"g1","time":"` + long + `"`, 400, `"` + strings.Repeat(`\x7f`, maxEcho) + `…" is not RFC 3339`},
		// Meterline's format, whose errors come from producer.ParseJSON.
		{`"event_time":"2026-11-29T12:00:00Z"`, `"event_time":"` + long + `"`, 400, `"` + strings.Repeat(`\x7f`, (maxReason-1)/4)},
		// A field an error names is a producer's text too: a property's
		// name, whose value is not valid text.
		{`"quantity":1`, `"quantity":1,"properties":{"` + long + `":"\ud800"}`, 400, `is not valid text (\ud800`},
	} {
		path, ct, sep, ev := "/api/v1/events", "application/cloudevents-batch+json", ",", good
		if strings.HasPrefix(c.old, `"event_time"`) || strings.HasPrefix(c.old, `"quantity"`) {
			path, ct, sep, ev = "/v1/events", "application/x-ndjson", "\n", `{"event_id":"a","customer_id":"acme-1","meter":"api_calls","quantity":1,"event_time":"2026-11-29T12:00:00Z"}`
		}
		evs := make([]string, DefaultMaxEvents)
		for i := range evs {
			evs[i] = strings.Replace(ev, c.old, c.new, 1)
		}
		body := strings.Join(evs, sep)
		if sep == "," {
			body = "[" + body + "]"
		}
		status, _, b := e.post(path, ct, e.token, []byte(body))
		if status != c.status || len(b) >= len(body) {
			t.Errorf("%s: %d, an answer of %d bytes to a body of %d", c.old, status, len(b), len(body))
			continue
		}
		if p := problem(t, b); len(p.Errors) != DefaultMaxEvents || !strings.HasPrefix(p.Errors[0].Reason, c.reason) {
			t.Errorf("%s: %d errors, the first %q; want %d, starting %q", c.old, len(p.Errors), p.Errors[0].Reason, DefaultMaxEvents, c.reason)
		} else if f := p.Errors[0].Field; len(f) > maxEcho+len("…") {
			t.Errorf("%s: the field is named in %d bytes: %.80q…", c.old, len(f), f)
		}
	}
}

// gzipped returns b compressed with gzip.
func gzipped(b []byte) []byte {
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	_, _ = zw.Write(b)
	_ = zw.Close()
	return gz.Bytes()
}

// A compressed body is answered 415 naming its Content-Encoding, not
// read as JSON and answered "malformed"; nothing is sent.
func TestCompressedBodyRefused(t *testing.T) {
	e := newEnv(t, nil)
	gz := gzipped(apiCall("gz", "acme-1"))
	req, err := http.NewRequest(http.MethodPost, e.srv.URL()+"/v1/events", bytes.NewReader(gz))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Content-Encoding", "gzip")
	req.Header.Set("Authorization", "Bearer "+e.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	want := `Content-Encoding "gzip" is not supported: send the body uncompressed`
	if p := problem(t, b); resp.StatusCode != http.StatusUnsupportedMediaType || p.Detail != want {
		t.Errorf("%d %s; want 415 %q", resp.StatusCode, b, want)
	}
	if recs := e.records(); len(recs) != 0 {
		t.Errorf("%d records sent", len(recs))
	}
}

// Every coding a request's Content-Encoding names, on any of its header
// lines and in comma-separated lists, must be identity: one that is not
// is answered 415 naming it, even after an identity, and nothing is sent.
// Identity alone, in any case or repeated, is read as no encoding.
func TestCompressedBodyRefusedAfterIdentity(t *testing.T) {
	e := newEnv(t, nil)
	gz := gzipped(apiCall("gz", "acme-1"))
	post := func(body []byte, encodings ...string) (int, []byte) {
		return e.postWith("/v1/events", "application/json", body, http.Header{"Content-Encoding": encodings})
	}
	for _, encs := range [][]string{
		{"identity", "gzip"},
		{"Identity", "identity", "br"},
		{"identity, gzip"},
		{"identity,gzip"},
		{"identity", "identity, deflate"},
		{"gzip, identity"},
	} {
		code, b := post(gz, encs...)
		if p := problem(t, b); code != http.StatusUnsupportedMediaType || !strings.Contains(p.Detail, "is not supported: send the body uncompressed") {
			t.Errorf("Content-Encoding %q: %d %s; want 415", encs, code, b)
		}
	}
	for _, encs := range [][]string{{"identity", "IDENTITY"}, {"identity, identity"}} {
		if code, b := post(apiCall("id-"+strings.Join(encs, ""), "acme-1"), encs...); code != http.StatusAccepted {
			t.Errorf("Content-Encoding %q on a plain body: %d %s; want 202", encs, code, b)
		}
	}
	if recs := e.records(); len(recs) != 2 {
		t.Errorf("%d records sent, want the 2 plain ones", len(recs))
	}
}

// A request's Content-Type is read as RFC 9110 has it: the media type in
// any case, parameters after it. A charset, when given, must be UTF-8 (the
// body is read as UTF-8, as JSON is): another is answered 415 naming it,
// as is a missing or unparsable Content-Type.
func TestContentTypeParameters(t *testing.T) {
	e := newEnv(t, nil)
	batch := `[{"specversion":"1.0","id":"c1","source":"s","type":"prompt","subject":"acme-1","data":{"tokens":{"input":2},"user":"u1"}}]`
	for _, ct := range []string{
		"application/cloudevents-batch+json; charset=utf-8", "Application/CloudEvents-Batch+JSON;Charset=\"UTF-8\"",
		"application/json; charset=utf-8", "APPLICATION/JSON",
	} {
		if status, _, b := e.post("/api/v1/events", ct, e.token, []byte(batch)); status != http.StatusNoContent {
			t.Errorf("%s: %d %s, want 204", ct, status, b)
		}
	}
	for _, c := range []struct{ path, ct, detail string }{
		{"/api/v1/events", "application/cloudevents-batch+json; charset=iso-8859-1",
			`Content-Type "application/cloudevents-batch+json; charset=iso-8859-1": the body must be UTF-8 (charset=utf-8, or none)`},
		{"/v1/events", "application/x-ndjson; charset=latin1",
			`Content-Type "application/x-ndjson; charset=latin1": the body must be UTF-8 (charset=utf-8, or none)`},
		{"/api/v1/events", "",
			`Content-Type "": want application/cloudevents+json, application/cloudevents-batch+json or application/json`},
		{"/api/v1/events", "application/json; charset",
			`Content-Type "application/json; charset": want application/cloudevents+json, application/cloudevents-batch+json or application/json`},
	} {
		status, _, b := e.post(c.path, c.ct, e.token, []byte(batch))
		if p := problem(t, b); status != http.StatusUnsupportedMediaType || p.Detail != c.detail {
			t.Errorf("%s %q: %d %s, want 415 %q", c.path, c.ct, status, b, c.detail)
		}
	}
	if n := len(e.records()); n != 4*3 {
		t.Errorf("%d records, want 12 (4 requests of an event feeding 3 meters)", n)
	}
}

// A 405 quotes the request's method clipped, as every other value an
// answer repeats: a method is any token the client sends, as long as the
// headers' bound lets it be.
func TestLongMethodClipped(t *testing.T) {
	e := newEnv(t, nil)
	method := strings.Repeat("X", 4000)
	conn := slowRequest(t, e.srv.Addr(), method, "/api/v1/events", "", 10) // the whole body: 10 bytes
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Fatalf("%d %s, want 405", resp.StatusCode, b)
	}
	if p := problem(t, b); !strings.HasPrefix(p.Detail, `"`+method[:maxEcho]+`…" is not allowed`) || len(p.Detail) > 200 {
		t.Errorf("detail of %d bytes: %.120q", len(p.Detail), p.Detail)
	}
}
