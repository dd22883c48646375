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

// A CloudEvent whose time is the empty string has no time, as in
// OpenMeter (the CloudEvents Go SDK it decodes with reads "" as absent,
// and OpenMeter then gives the event the time it was received): it gets
// the time the request was received, on the single-event and the batch
// paths alike; a server that requires a time refuses it as missing.
func TestCloudEventEmptyTime(t *testing.T) {
	received := time.Date(2026, 12, 1, 8, 30, 0, 0, time.UTC)
	e := newEnv(t, func(c *Config) { c.Clock = func() time.Time { return received } })
	ev := func(id, time string) string {
		return `{"specversion":"1.0","id":"` + id + `","source":"s","type":"job","subject":"acme-1"` + time + `,"data":{"seconds":2}}`
	}
	for _, c := range []struct{ ct, body string }{
		{"application/cloudevents+json", ev("r1", `,"time":""`)},
		{"application/cloudevents-batch+json", "[" + ev("r2", `,"time":""`) + "," + ev("r3", `,"time":null`) + "," + ev("r4", "") + "]"},
		{"application/json", "[" + ev("r5", `,"time":""`) + "]"},
	} {
		if status, _, b := e.post("/api/v1/events", c.ct, e.token, []byte(c.body)); status != http.StatusNoContent {
			t.Fatalf("%s %s: %d %s, want 204", c.ct, c.body, status, b)
		}
	}
	recs := e.records()
	if len(recs) != 5 {
		t.Fatalf("%d records, want 5", len(recs))
	}
	for _, r := range recs {
		if r.EventTime != received.UnixMilli() || r.Quantity != 2000 {
			t.Errorf("record %+v: want time %d (received), quantity 2000", r, received.UnixMilli())
		}
	}

	strict := newEnv(t, func(c *Config) { c.RequireTime = true })
	status, _, b := strict.post("/api/v1/events", "application/cloudevents+json", strict.token, []byte(ev("r1", `,"time":""`)))
	if p := problem(t, b); status != http.StatusBadRequest || len(p.Errors) != 1 || p.Errors[0].Field != "time" ||
		!strings.HasPrefix(p.Errors[0].Reason, "is missing") {
		t.Fatalf("with RequireTime: %d %s, want 400 time is missing", status, b)
	}
	// A time that is not empty is still RFC 3339 or refused.
	status, _, b = e.post("/api/v1/events", "application/cloudevents+json", e.token, []byte(ev("r6", `,"time":" "`)))
	if p := problem(t, b); status != http.StatusBadRequest || len(p.Errors) != 1 || p.Errors[0].Field != "time" {
		t.Fatalf(`time " ": %d %s, want 400 naming time`, status, b)
	}
}

// compatMeters: "call" feeds only a COUNT meter (with a group), "prompt"
// a SUM meter and a COUNT meter, "list" a meter whose value is the first
// element of an array.
const compatMeters = `meters:
  - name: calls
    aggregation: COUNT
    event_type: call
    group_by: {route: $.route}
  - name: tokens
    event_type: prompt
    value_property: $.tokens
  - name: prompts
    aggregation: COUNT
    event_type: prompt
  - name: firsts
    event_type: list
    value_property: $[0]
`

// OpenMeter takes any JSON value as data: a string, a number, a boolean,
// an array or null. A COUNT meter counts such an event (OpenMeter counts
// rows, whatever their data), and its groups are empty; a meter that
// reads a value property takes it where the JSONPath finds it (in an
// array, by index), and OpenMeter's meter processing cannot use an event
// where it finds nothing, which the ingest refuses: 400 naming the index,
// the field and why, and nothing of the request is sent, on the batch
// and the single-event paths.
func TestCloudEventDataNotObject(t *testing.T) {
	cat, err := aggregator.ParseMeters([]byte(compatMeters))
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, func(c *Config) { c.Meters = cat })
	ev := func(id, typ, data string) string {
		return `{"specversion":"1.0","id":"` + id + `","source":"s","type":"` + typ + `","subject":"acme-1","time":"2026-11-29T12:00:00Z","data":` + data + `}`
	}
	// Accepted: every data a COUNT-only type may carry, and an array for
	// an index path.
	good := []string{
		ev("c1", "call", `"x"`), ev("c2", "call", `5`), ev("c3", "call", `[1,{"route":"r"}]`),
		ev("c4", "call", `true`), ev("c5", "call", `null`), ev("c6", "call", `"{\"route\":\"r\"}"`),
		ev("l1", "list", `[7,"a"]`), ev("l2", "list", ` ["8"] `),
	}
	if status, _, b := e.post("/api/v1/events", "application/cloudevents-batch+json", e.token, []byte("["+strings.Join(good, ",")+"]")); status != http.StatusNoContent {
		t.Fatalf("batch of non-object data: %d %s, want 204", status, b)
	}
	if status, _, b := e.post("/api/v1/events", "application/cloudevents+json", e.token, []byte(ev("c7", "call", `"x"`))); status != http.StatusNoContent {
		t.Fatalf("single event of string data: %d %s, want 204", status, b)
	}
	var got []string
	for _, r := range e.records() {
		got = append(got, fmt.Sprintf("%s q=%d props=%v", r.Meter, r.Quantity, r.Properties))
	}
	sort.Strings(got)
	want := []string{"calls q=1 props=[]", "calls q=1 props=[]", "calls q=1 props=[]", "calls q=1 props=[]",
		"calls q=1 props=[]", "calls q=1 props=[]", "calls q=1 props=[]", "firsts q=7 props=[]", "firsts q=8 props=[]"}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("records:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	// Refused: a value the meter cannot find. Each request also holds a
	// good event, which must not be sent either.
	for _, c := range []struct {
		ct, body string
		errs     string
	}{
		{"application/cloudevents-batch+json",
			"[" + ev("ok", "call", `"x"`) + "," + ev("p1", "prompt", `"x"`) + "," + ev("p2", "prompt", `[{"tokens":1}]`) + "," +
				ev("p3", "prompt", `12`) + "," + ev("p4", "prompt", `null`) + "," + ev("p5", "prompt", `"{\"tokens\":3}"`) + "," + ev("l3", "list", `{"0":1}`) + "]",
			`1 data.tokens is missing: data is a JSON string, not an object; meter tokens reads its value from $.tokens|` +
				`2 data.tokens is missing: data is a JSON array, not an object; meter tokens reads its value from $.tokens|` +
				`3 data.tokens is missing: data is a JSON number, not an object; meter tokens reads its value from $.tokens|` +
				`4 data.tokens is missing: the event has no data; meter tokens reads its value from $.tokens|` +
				`5 data.tokens is missing: data is a JSON string, not an object; meter tokens reads its value from $.tokens|` +
				`6 data[0] is missing: meter firsts reads its value from $[0]`},
		{"application/json", // the slow path (an id of the wrong type fails the batch's decoding): each event decoded on its own
			"[" + ev("ok", "call", `"x"`) + "," + ev("p6", "prompt", `false`) + "," + strings.Replace(ev("x", "call", `1`), `"x"`, `7`, 1) + "]",
			`1 data.tokens is missing: data is a JSON boolean, not an object; meter tokens reads its value from $.tokens|` +
				`2 id must be a string, not a JSON number`},
		{"application/cloudevents+json", ev("p7", "prompt", `"x"`),
			`0 data.tokens is missing: data is a JSON string, not an object; meter tokens reads its value from $.tokens`},
	} {
		status, _, b := e.post("/api/v1/events", c.ct, e.token, []byte(c.body))
		p := problem(t, b)
		var errs []string
		for _, fe := range p.Errors {
			errs = append(errs, fmt.Sprintf("%d %s %s", fe.Index, fe.Field, fe.Reason))
		}
		if status != http.StatusBadRequest || strings.Join(errs, "|") != c.errs {
			t.Errorf("%s: %d %s\nwant 400 with\n%s", c.ct, status, strings.Join(errs, "|"), c.errs)
		}
	}
	if n := len(e.records()); n != len(want) {
		t.Errorf("%d records after the refused requests, want %d: a refused request sent events", n, len(want))
	}
}
