package ingest

import (
	"fmt"
	"net/http"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/meterline/meterline/aggregator"
)

// A CloudEvent's time, when present and not null, is RFC 3339: "" is
// refused naming time, as OpenMeter's schema refuses it (format
// date-time), on the single-event path, a batch's fast path and its
// per-event path alike, and the request sends nothing; null is no time,
// as a missing time is: the event gets the time the request was received,
// and a server that requires a time refuses it as missing.
func TestCloudEventTime(t *testing.T) {
	received := time.Date(2026, 12, 1, 8, 30, 0, 0, time.UTC)
	e := newEnv(t, func(c *Config) { c.Clock = func() time.Time { return received } })
	ev := func(id, time string) string {
		return `{"specversion":"1.0","id":"` + id + `","source":"s","type":"job","subject":"acme-1"` + time + `,"data":{"seconds":2}}`
	}
	for _, c := range []struct{ ct, body, errs string }{
		{"application/cloudevents+json", ev("r1", `,"time":""`), `0 time "" is not RFC 3339 (like 2026-11-29T12:00:00.250Z)`},
		{"application/cloudevents-batch+json", "[" + ev("r2", `,"time":null`) + "," + ev("r3", `,"time":""`) + "]",
			`1 time "" is not RFC 3339 (like 2026-11-29T12:00:00.250Z)`},
		{"application/json", // the per-event path (an id of the wrong type fails the batch's decoding)
			"[" + ev("r4", `,"time":""`) + "," + strings.Replace(ev("x", ""), `"x"`, `7`, 1) + "]",
			`0 time "" is not RFC 3339 (like 2026-11-29T12:00:00.250Z)|1 id must be a string, not a JSON number`},
		{"application/cloudevents+json", ev("r5", `,"time":" "`), `0 time " " is not RFC 3339 (like 2026-11-29T12:00:00.250Z)`},
		// A time before 2000, as written, offset included: not as the
		// milliseconds of Meterline's format, nor the epoch as missing.
		{"application/cloudevents-batch+json", "[" + ev("r6", `,"time":"1999-12-31T23:59:59.999Z"`) + "," + ev("r7", `,"time":"2000-01-01T00:30:00+01:00"`) +
			"," + ev("r8", `,"time":"1970-01-01T00:00:00Z"`) + "]",
			`0 time "1999-12-31T23:59:59.999Z" is before 2000-01-01|1 time "2000-01-01T00:30:00+01:00" is before 2000-01-01|2 time "1970-01-01T00:00:00Z" is before 2000-01-01`},
		// An offset out of RFC 3339's range (hour 00-23, minute 00-59),
		// which time.Parse would read as a day, or an hour, off.
		{"application/cloudevents-batch+json", "[" + ev("r9", `,"time":"2026-12-01T08:00:00+24:00"`) + "," + ev("r10", `,"time":"2026-12-01T08:00:00-05:60"`) + "]",
			`0 time "2026-12-01T08:00:00+24:00" is not RFC 3339 (like 2026-11-29T12:00:00.250Z)|1 time "2026-12-01T08:00:00-05:60" is not RFC 3339 (like 2026-11-29T12:00:00.250Z)`},
	} {
		status, _, b := e.post("/api/v1/events", c.ct, e.token, []byte(c.body))
		if got := eventErrors(t, status, b); strings.ReplaceAll(got, "\n", "|") != c.errs {
			t.Errorf("%s %s: %s, want %s", c.ct, c.body, got, c.errs)
		}
	}
	if n := len(e.records()); n != 0 {
		t.Fatalf("%d records sent by refused requests", n)
	}
	for _, c := range []struct{ ct, body string }{
		{"application/cloudevents+json", ev("n1", `,"time":null`)},
		{"application/cloudevents-batch+json", "[" + ev("n2", `,"time":null`) + "," + ev("n3", "") + "]"},
		{"application/json", "[" + ev("n4", `,"time":null`) + "]"},
	} {
		if status, _, b := e.post("/api/v1/events", c.ct, e.token, []byte(c.body)); status != http.StatusNoContent {
			t.Fatalf("%s %s: %d %s, want 204", c.ct, c.body, status, b)
		}
	}
	recs := e.records()
	if len(recs) != 4 {
		t.Fatalf("%d records, want 4", len(recs))
	}
	for _, r := range recs {
		if r.EventTime != received.UnixMilli() || r.Quantity != 2000 {
			t.Errorf("record %+v: want time %d (received), quantity 2000", r, received.UnixMilli())
		}
	}

	strict := newEnv(t, func(c *Config) { c.RequireTime = true })
	status, _, b := strict.post("/api/v1/events", "application/cloudevents+json", strict.token, []byte(ev("r1", `,"time":null`)))
	if p := problem(t, b); status != http.StatusBadRequest || len(p.Errors) != 1 || p.Errors[0].Field != "time" ||
		!strings.HasPrefix(p.Errors[0].Reason, "is missing") {
		t.Fatalf("with RequireTime: %d %s, want 400 time is missing", status, b)
	}
}

// A CloudEvent's data, when present and not null, is a JSON object, as
// OpenMeter's schema has it: a string (JSON text in it included), a
// number, a boolean or an array is refused naming data, on the batch's
// fast and per-event paths and the single-event path, and the request
// sends nothing. Null data is no data: a COUNT meter counts the event,
// and a meter that reads a value finds it missing.
func TestCloudEventDataObject(t *testing.T) {
	cat, err := aggregator.ParseMeters([]byte(testMeters + "  - name: calls\n    aggregation: COUNT\n    event_type: call\n"))
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, func(c *Config) { c.Meters = cat })
	ev := func(id, typ, data string) string {
		return `{"specversion":"1.0","id":"` + id + `","source":"s","type":"` + typ + `","subject":"acme-1","time":"2026-11-29T12:00:00Z","data":` + data + `}`
	}
	const notObject = "must be a JSON object"
	for _, c := range []struct{ ct, body, errs string }{
		{"application/cloudevents-batch+json",
			"[" + ev("ok", "call", `{}`) + "," + ev("p1", "call", `"x"`) + "," + ev("p2", "call", `[{"a":1}]`) + "," +
				ev("p3", "call", `12`) + "," + ev("p4", "call", `true`) + "," + ev("p5", "call", `"{\"tokens\":3}"`) + "," +
				ev("p6", "prompt", `null`) + "]",
			"1 data " + notObject + "|2 data " + notObject + "|3 data " + notObject + "|4 data " + notObject + "|5 data " + notObject +
				"|6 data.tokens.input is missing: the event has no data; meter input_tokens reads its value from $.tokens.input"},
		{"application/json", // the per-event path (an id of the wrong type fails the batch's decoding)
			"[" + ev("ok", "call", `{}`) + "," + ev("p7", "call", ` false `) + "," + strings.Replace(ev("x", "call", `{}`), `"x"`, `7`, 1) + "]",
			"1 data " + notObject + "|2 id must be a string, not a JSON number"},
		{"application/cloudevents+json", ev("p8", "call", `"x"`), "0 data " + notObject},
	} {
		status, _, b := e.post("/api/v1/events", c.ct, e.token, []byte(c.body))
		if got := strings.ReplaceAll(eventErrors(t, status, b), "\n", "|"); got != c.errs {
			t.Errorf("%s: %s\nwant %s", c.ct, got, c.errs)
		}
	}
	if n := len(e.records()); n != 0 {
		t.Fatalf("%d records sent by refused requests", n)
	}
	body := "[" + ev("c1", "call", `null`) + "," + ev("c2", "call", ` { } `) + "]"
	if status, _, b := e.post("/api/v1/events", "application/cloudevents-batch+json", e.token, []byte(body)); status != http.StatusNoContent {
		t.Fatalf("null and empty data: %d %s, want 204", status, b)
	}
	var got []string
	for _, r := range e.records() {
		got = append(got, fmt.Sprintf("%s q=%d", r.Meter, r.Quantity))
	}
	sort.Strings(got)
	if strings.Join(got, ",") != "calls q=1,calls q=1" {
		t.Errorf("records: %v, want 2 of calls", got)
	}
}
