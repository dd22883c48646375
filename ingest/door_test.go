package ingest

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/meterline/meterline/dedup"
	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/producer"
	"github.com/meterline/meterline/schemas"
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
	want := `{"type":"urn:meterline:problem:invalid-events","title":"Invalid events","status":400,"detail":"1 of 2 events are invalid; nothing was sent. Event 1, time: ` + reason + `","errors":[{"index":1,"field":"time","code":"too_old","reason":"` + reason + `"}]}`
	if status != 400 || got != want {
		t.Errorf("CloudEvents: got %d %s\nwant 400 %s", status, got, want)
	}
	status, got = e.compactProblem("/v1/events", "application/x-ndjson", ml("a", ts(bound))+"\n"+ml("b", old))
	want = strings.ReplaceAll(want, `"field":"time"`, `"field":"event_time"`)
	want = strings.Replace(want, "Event 1, time:", "Event 1, event_time:", 1)
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

// A member named twice in a CloudEvent's data, at any depth, is refused
// naming its path, as /v1/events refuses one in an event or its
// properties: read last-wins, the quantity billed would be whichever
// copy came last. Names are compared with their escapes decoded. The
// batch's fast path and the slow path of one event answer alike.
func TestDataDuplicateMembers(t *testing.T) {
	e := newEnv(t, nil)
	ce := func(id, data string) string {
		return fmt.Sprintf(`{"specversion":"1.0","id":%q,"source":"s","type":"prompt","subject":"acme-1","time":"2026-11-29T12:00:00Z","data":%s}`, id, data)
	}
	ok := `{"tokens":{"input":3},"user":"u","model":"m"}`
	for _, c := range []struct{ name, data, field string }{
		{"value", `{"tokens":{"input":1,"input":5},"user":"u"}`, "data.tokens.input"},
		{"object", `{"tokens":{"input":1},"user":"u","tokens":{"input":5}}`, "data.tokens"},
		{"escaped", `{"tokens":{"input":1},"user":"u","\u0075ser":"v"}`, "data.user"},
		{"in an array", `{"tokens":{"input":1},"user":"u","items":[{"a":1},{"b":[{"c":1,"c":2}]}]}`, "data.items[1].b[0].c"},
		{"unread member", `{"tokens":{"input":1},"user":"u","x":{"y":{"z":1,"z":1}}}`, "data.x.y.z"},
	} {
		t.Run(c.name, func(t *testing.T) {
			want := `{"type":"urn:meterline:problem:invalid-events","title":"Invalid events","status":400,"detail":"1 of 2 events are invalid; nothing was sent. Event 1, ` +
				c.field + `: appears twice","errors":[{"index":1,"field":"` +
				c.field + `","code":"invalid","reason":"appears twice"}]}`
			status, got := e.compactProblem("/api/v1/events", "application/cloudevents-batch+json", "["+ce("a", ok)+","+ce("b", c.data)+"]")
			if status != 400 || got != want {
				t.Errorf("batch: got %d %s\nwant 400 %s", status, got, want)
			}
			// One event per request, and the slow path of a batch (an
			// upper-case extension name sends it to encoding/json).
			one := strings.Replace(want, "1 of 2", "1 of 1", 1)
			one = strings.Replace(one, `"index":1`, `"index":0`, 1)
			one = strings.Replace(one, "Event 1,", "Event 0,", 1)
			status, got = e.compactProblem("/api/v1/events", "application/cloudevents+json", ce("b", c.data))
			if status != 400 || got != one {
				t.Errorf("one event: got %d %s\nwant 400 %s", status, got, one)
			}
			slow := strings.Replace(ce("b", c.data), `"id"`, `"Ext":1,"id"`, 1)
			status, got = e.compactProblem("/api/v1/events", "application/cloudevents-batch+json", "["+ce("a", ok)+","+slow+"]")
			if status != 400 || got != want {
				t.Errorf("slow batch: got %d %s\nwant 400 %s", status, got, want)
			}
		})
	}
	// In data_base64 alike.
	b64 := strings.Replace(ce("b", "null"), `"data":null`, `"data_base64":"`+base64.StdEncoding.EncodeToString([]byte(`{"tokens":{"input":1,"input":2},"user":"u"}`))+`"`, 1)
	status, got := e.compactProblem("/api/v1/events", "application/cloudevents+json", b64)
	if want := `"field":"data.tokens.input","code":"invalid","reason":"appears twice"`; status != 400 || !strings.Contains(got, want) {
		t.Errorf("data_base64: got %d %s, want 400 with %s", status, got, want)
	}
	// The same names in different objects are no duplicates.
	if status, got := e.compactProblem("/api/v1/events", "application/cloudevents+json",
		ce("c", `{"tokens":{"input":1,"user":"x"},"user":"u","l":[{"user":1},{"user":2}]}`)); status != 204 {
		t.Errorf("distinct objects: got %d %s", status, got)
	}
	if n := len(e.records()); n != 3 {
		t.Errorf("%d records, want 3", n)
	}
}

// Identifiers holding DEL, C1 controls, bidirectional controls or
// invisible characters are refused on both endpoints, as the producer
// and dedup refuse them (schemas.CheckText): "acme-\u202e1x" shows as
// "acme-x1" in a table, another customer's look.
func TestIdentityInvisibleCharacters(t *testing.T) {
	e := newEnv(t, nil)
	ce := func(id, source, subject string) string {
		return fmt.Sprintf(`{"specversion":"1.0","id":"%s","source":"%s","type":"prompt","subject":"%s","time":"2026-11-29T12:00:00Z","data":{"tokens":{"input":3},"user":"u"}}`, id, source, subject)
	}
	ml := func(id, customer, meter string) string {
		return fmt.Sprintf(`{"event_id":"%s","customer_id":"%s","meter":"%s","quantity":1,"event_time":"2026-11-29T12:00:00Z"}`, id, customer, meter)
	}
	// The characters are written out, or escaped (a JSON string's text).
	for _, c := range []struct{ name, path, ct, body, field, why string }{
		{"subject RLO", "/api/v1/events", "application/cloudevents+json", ce("a", "s", "acme-\u202e1x"), "subject", "bidirectional control U+202E at offset 5"},
		{"subject DEL", "/api/v1/events", "application/cloudevents+json", ce("a", "s", `acme-1\u007f`), "subject", "control character U+007F at offset 6"},
		{"subject NEL", "/api/v1/events", "application/cloudevents-batch+json", "[" + ce("a", "s", "acme-\u00851") + "]", "subject", "control character U+0085 at offset 5"},
		{"id", "/api/v1/events", "application/cloudevents-batch+json", "[" + ce(`a\u200f`, "s", "acme-1") + "]", "id", "bidirectional control U+200F at offset 1"},
		{"source", "/api/v1/events", "application/cloudevents+json", ce("a", "s\u2066", "acme-1"), "source", "bidirectional control U+2066 at offset 1"},
		{"customer_id", "/v1/events", "application/json", ml("a", "acme-\u202d1", "api_calls"), "customer_id", "bidirectional control U+202D at offset 5"},
		{"meter", "/v1/events", "application/x-ndjson", ml("a", "acme-1", `api_calls\u009f`), "meter", "control character U+009F at offset 9"},
		{"event_id", "/v1/events", "application/x-ndjson", ml("a\u200b", "acme-1", "api_calls"), "event_id", "invisible character U+200B at offset 1"},
	} {
		t.Run(c.name, func(t *testing.T) {
			want := `{"type":"urn:meterline:problem:invalid-events","title":"Invalid events","status":400,"detail":"1 of 1 events are invalid; nothing was sent. Event 0, ` +
				c.field + `: holds the ` + c.why + ` (not allowed in identity fields and source)","errors":[{"index":0,"field":"` +
				c.field + `","code":"invalid","reason":"holds the ` + c.why + ` (not allowed in identity fields and source)"}]}`
			if status, got := e.compactProblem(c.path, c.ct, c.body); status != 400 || got != want {
				t.Errorf("got %d %s\nwant 400 %s", status, got, want)
			}
		})
	}
	if n := len(e.records()); n != 0 {
		t.Errorf("%d records sent", n)
	}
}

// A POST to a path that is not clean (a double slash, a . or ..
// segment) is answered 404 naming the endpoints, never redirected: a
// client that follows a 301 sends its retry as a GET, without the body.
func TestUncleanPathNotRedirected(t *testing.T) {
	e := newEnv(t, nil)
	noFollow := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	body := []byte(`{"specversion":"1.0","id":"a","source":"s","type":"prompt","subject":"acme-1","time":"2026-11-29T12:00:00Z","data":{"tokens":{"input":3},"user":"u"}}`)
	for _, p := range []string{"//api/v1/events", "/api//v1/events", "/api/v1/./events", "/api/v1/x/../events", "//v1/events", "/v1/events/."} {
		for _, method := range []string{http.MethodPost, http.MethodGet} {
			req, err := http.NewRequest(method, e.srv.URL()+p, bytes.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Content-Type", "application/cloudevents+json")
			req.Header.Set("Authorization", "Bearer "+e.token)
			resp, err := noFollow.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusNotFound || resp.Header.Get("Location") != "" || problem(t, b).Type != "urn:meterline:problem:not-found" {
				t.Errorf("%s %s: %d (Location %q) %s; want 404 not-found", method, p, resp.StatusCode, resp.Header.Get("Location"), b)
			}
		}
	}
	if n := len(e.records()); n != 0 {
		t.Errorf("%d records sent", n)
	}
}

// A request with two Content-Type lines, or two Authorization lines, is
// refused (415, 401) before its body is read, not read by the first line
// only: a proxy or gateway in front may act on the last one (RFC 9110
// makes each a singleton field).
func TestRepeatedHeadersRefused(t *testing.T) {
	e := newEnv(t, nil)
	body := `{"specversion":"1.0","id":"a","source":"s","type":"prompt","subject":"acme-1","time":"2026-11-29T12:00:00Z","data":{"tokens":{"input":3},"user":"u"}}`
	_, other, err := e.admin.CreateKey(t.Context(), KeySpec{Tenant: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	waitKeys(t, e.srv, 2)
	for _, c := range []struct {
		name   string
		header http.Header
		status int
		typ    string
	}{
		{"two content types", http.Header{"Content-Type": {"application/cloudevents+json", "application/cloudevents-batch+json"}, "Authorization": {"Bearer " + e.token}},
			http.StatusUnsupportedMediaType, "unsupported-media-type"},
		{"two keys", http.Header{"Content-Type": {"application/cloudevents+json"}, "Authorization": {"Bearer " + e.token, "Bearer " + other}},
			http.StatusUnauthorized, "unauthorized"},
		{"a key twice", http.Header{"Content-Type": {"application/cloudevents+json"}, "Authorization": {"Bearer " + e.token, "Bearer " + e.token}},
			http.StatusUnauthorized, "unauthorized"},
	} {
		req, err := http.NewRequest(http.MethodPost, e.srv.URL()+"/api/v1/events", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header = c.header
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != c.status || problem(t, b).Type != "urn:meterline:problem:"+c.typ {
			t.Errorf("%s: %d %s; want %d %s", c.name, resp.StatusCode, b, c.status, c.typ)
		}
	}
	if n := len(e.records()); n != 0 {
		t.Errorf("%d records sent", n)
	}
}

// On the real broker, whose clock stamps arrival (LogAppendTime), the
// door and dedup agree: an event inside the window is counted; one
// between W and W + the max skew old is sent and rejected by dedup as
// too_old (the door's margin for its clock being ahead of the broker's);
// one older than that is refused at the door and never sent.
func TestRealTooOldAgreesWithDedup(t *testing.T) {
	p := newPipeline(t)
	p.startDedup()
	e := p.server() // MaxAge: the default, W + max skew
	now := time.Now()
	ml := func(id string, age time.Duration) string {
		return fmt.Sprintf(`{"event_id":%q,"customer_id":"acme-1","meter":"api_calls","quantity":1,"event_time":%q}`, id, now.Add(-age).UTC().Format(time.RFC3339Nano))
	}
	w := dedup.DefaultWindow
	if status, _, b := e.post("/v1/events", "application/x-ndjson", p.token, []byte(ml("in", w-10*time.Minute)+"\n"+ml("edge", w+30*time.Minute))); status != 202 {
		t.Fatalf("within W + max skew: %d %s", status, b)
	}
	status, _, b := e.post("/v1/events", "application/x-ndjson", p.token, []byte(ml("old", w+producer.DefaultMaxSkew+10*time.Minute)))
	if p := problem(t, b); status != 400 || len(p.Errors) != 1 || p.Errors[0].Code != "too_old" {
		t.Fatalf("beyond W + max skew: %d %s", status, b)
	}
	ids, _, _ := p.counted()
	if len(ids) != 1 || ids["acme-1/api_calls/in"] != 1 {
		t.Errorf("counted %v, want only acme-1/api_calls/in", ids)
	}
	var rejected []string
	for _, r := range testenv.ReadAll(t, p.brokers, p.names.RejectedTopic()) {
		var rj schemas.Rejected
		if err := schemas.DecodeInto(r.Value, &rj); err != nil {
			t.Fatal(err)
		}
		rejected = append(rejected, rj.EventID+" "+rj.Reason)
	}
	if len(rejected) != 1 || rejected[0] != "edge too_old" {
		t.Errorf("rejected %v, want [edge too_old]", rejected)
	}
}

// TestDataNamedTwiceLastCounts: `data` or `data_base64` named twice in
// an event is read as OpenMeter's CloudEvents SDK reads it, the last
// counts (docs/ingest.md, Meters: from a CloudEvent to usage), in one
// event and in a batch; a last `"data":null` leaves the event no data.
func TestDataNamedTwiceLastCounts(t *testing.T) {
	e := newEnv(t, nil)
	head := `{"specversion":"1.0","source":"s","type":"prompt","subject":"acme-1","time":"2026-11-29T12:00:00Z",`
	b64 := func(n int) string {
		return base64.StdEncoding.EncodeToString(fmt.Appendf(nil, `{"tokens":{"input":%d},"user":"u"}`, n))
	}
	for _, c := range []struct{ id, ct, body string }{
		{"one", "application/cloudevents+json", head + `"id":"one","data":{"tokens":{"input":1},"user":"u"},"data":{"tokens":{"input":7},"user":"u"}}`},
		{"batch", "application/cloudevents-batch+json", "[" + head + `"id":"batch","data":{"tokens":{"input":1},"user":"u"},"data":{"tokens":{"input":7},"user":"u"}}]`},
		{"base64", "application/cloudevents+json", head + `"id":"base64","data_base64":"` + b64(1) + `","data_base64":"` + b64(7) + `"}`},
	} {
		if status, _, b := e.post("/api/v1/events", c.ct, e.token, []byte(c.body)); status != http.StatusNoContent {
			t.Fatalf("%s: %d %s", c.id, status, b)
		}
	}
	got := map[string]int64{}
	for _, r := range e.records() {
		if r.Meter == "input_tokens" {
			got[r.EventID] = r.Quantity
		}
	}
	for _, id := range []string{"one", "batch", "base64"} {
		if q := got[producer.EventID("s", id)]; q != 7 {
			t.Errorf("%s: quantity %d, want the last data's 7", id, q)
		}
	}
	status, got2 := e.compactProblem("/api/v1/events", "application/cloudevents+json", head+`"id":"null","data":{"tokens":{"input":1},"user":"u"},"data":null}`)
	if status != 400 || !strings.Contains(got2, `"field":"data.tokens.input"`) || !strings.Contains(got2, "the event has no data") {
		t.Errorf("data then null: %d %s, want 400: no data", status, got2)
	}
}

// A CloudEvent whose group_by values are over the 8 KiB a usage event
// keeps of its properties is refused naming data, and the reason says
// what was measured: the values the meter keeps, not the whole data, which
// may be larger (a member no meter reads is not kept).
func TestGroupValuesOversized(t *testing.T) {
	e := newEnv(t, nil)
	ce := func(id, data string) string {
		return fmt.Sprintf(`{"specversion":"1.0","id":%q,"source":"s","type":"prompt","subject":"acme-1","time":"2026-11-29T12:00:00Z","data":%s}`, id, data)
	}
	long := strings.Repeat("x", 9000)
	status, got := e.compactProblem("/api/v1/events", "application/cloudevents+json",
		ce("a", `{"tokens":{"input":3},"user":"u","blob":"`+long+`"}`))
	if status != 204 {
		t.Fatalf("data of 9 KB a meter does not read: %d %s, want 204", status, got)
	}
	status, got = e.compactProblem("/api/v1/events", "application/cloudevents+json",
		ce("b", `{"tokens":{"input":3},"user":"u","model":"`+long+`"}`))
	want := `"field":"data","code":"oversized","reason":"the values meter input_tokens keeps of data (its group_by and property): 9005 bytes, more than 8192"`
	if status != 400 || !strings.Contains(got, want) {
		t.Errorf("a group_by value of 9000 bytes: got %d %s\nwant 400 with %s", status, got, want)
	}
}
