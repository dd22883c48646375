package ingest

import (
	"context"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	cloudevents "github.com/cloudevents/sdk-go/v2"
	cehttp "github.com/cloudevents/sdk-go/v2/protocol/http"

	"github.com/meterline/meterline/producer"
)

// One CloudEvent feeds every meter of its type; a batch is all of its
// events; identity is (subject, meter, EventID(source, id)).
func TestCloudEventsSingleAndBatch(t *testing.T) {
	e := newEnv(t, nil)
	one := prompt(t, "req-1", "acme-1", map[string]any{"tokens": map[string]any{"input": 120}, "model": "m1", "user": "u7"})
	status, _, body := e.post("/api/v1/events", "application/cloudevents+json", e.token, mustJSON(t, one))
	if status != http.StatusNoContent || len(body) != 0 {
		t.Fatalf("single: %d %s, want 204 and no body", status, body)
	}
	batch := []cloudevents.Event{
		prompt(t, "req-2", "acme-1", map[string]any{"tokens": map[string]any{"input": "7"}, "user": 42}),
		prompt(t, "req-3", "acme-2", map[string]any{"tokens": map[string]any{"input": 1e3}, "model": "m2", "user": "u8"}),
	}
	status, _, body = e.post("/api/v1/events", "application/cloudevents-batch+json", e.token, mustJSON(t, batch))
	if status != http.StatusNoContent {
		t.Fatalf("batch: %d %s", status, body)
	}
	// application/json with an array, and with one object.
	more := prompt(t, "req-4", "acme-3", map[string]any{"tokens": map[string]any{"input": 1}, "user": "u9"})
	if status, _, body = e.post("/api/v1/events", "application/json", e.token, mustJSON(t, []cloudevents.Event{more})); status != http.StatusNoContent {
		t.Fatalf("application/json array: %d %s", status, body)
	}
	if status, _, body = e.post("/api/v1/events", "application/json; charset=utf-8", e.token, mustJSON(t, more)); status != http.StatusNoContent {
		t.Fatalf("application/json object: %d %s", status, body)
	}

	var got []string
	for _, ue := range e.records() {
		got = append(got, fmt.Sprintf("%s/%s/%s q=%d t=%d src=%s props=%v", ue.CustomerID, ue.Meter, ue.EventID, ue.Quantity, ue.EventTime, ue.Source, ue.Properties))
	}
	sort.Strings(got)
	id := func(s string) string { return producer.EventID("chat-api", s) }
	ms := time.Date(2026, 11, 29, 12, 0, 0, 250e6, time.UTC).UnixMilli()
	want := []string{
		fmt.Sprintf("acme-1/input_tokens/%s q=120 t=%d src=chat-api props=[{model m1}]", id("req-1"), ms),
		fmt.Sprintf("acme-1/input_tokens/%s q=7 t=%d src=chat-api props=[]", id("req-2"), ms),
		fmt.Sprintf("acme-1/prompts/%s q=1 t=%d src=chat-api props=[]", id("req-1"), ms),
		fmt.Sprintf("acme-1/prompts/%s q=1 t=%d src=chat-api props=[]", id("req-2"), ms),
		fmt.Sprintf("acme-1/users/%s q=1 t=%d src=chat-api props=[{user 42}]", id("req-2"), ms),
		fmt.Sprintf("acme-1/users/%s q=1 t=%d src=chat-api props=[{user u7}]", id("req-1"), ms),
		fmt.Sprintf("acme-2/input_tokens/%s q=1000 t=%d src=chat-api props=[{model m2}]", id("req-3"), ms),
		fmt.Sprintf("acme-2/prompts/%s q=1 t=%d src=chat-api props=[]", id("req-3"), ms),
		fmt.Sprintf("acme-2/users/%s q=1 t=%d src=chat-api props=[{user u8}]", id("req-3"), ms),
	}
	for _, c := range []string{"acme-3", "acme-3"} { // req-4 sent twice: two copies, same identity
		want = append(want,
			fmt.Sprintf("%s/input_tokens/%s q=1 t=%d src=chat-api props=[]", c, id("req-4"), ms),
			fmt.Sprintf("%s/prompts/%s q=1 t=%d src=chat-api props=[]", c, id("req-4"), ms),
			fmt.Sprintf("%s/users/%s q=1 t=%d src=chat-api props=[{user u9}]", c, id("req-4"), ms))
	}
	sort.Strings(want)
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("records:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// An empty batch of application/cloudevents-batch+json is a request of no
// events, answered 204 as OpenMeter answers it: both OpenMeter SDKs send
// one for an empty list. OpenMeter refuses an empty application/json
// array ("no events found"), and so does the ingest.
func TestCloudEventsEmptyBatch(t *testing.T) {
	e := newEnv(t, nil)
	for _, body := range []string{"[]", " [ ]\n"} {
		if status, _, b := e.post("/api/v1/events", "application/cloudevents-batch+json", e.token, []byte(body)); status != http.StatusNoContent || len(b) != 0 {
			t.Errorf("batch %q: %d %s, want 204 and no body", body, status, b)
		}
	}
	for _, ct := range []string{"application/json", "application/cloudevents+json"} {
		status, _, b := e.post("/api/v1/events", ct, e.token, []byte("[]"))
		if p := problem(t, b); status != http.StatusBadRequest || p.Type != problemTypePrefix+"malformed" {
			t.Errorf("%s []: %d %s, want 400 malformed", ct, status, b)
		}
	}
	if status, _, b := e.post("/v1/events", "application/json", e.token, []byte("[]")); status != http.StatusBadRequest {
		t.Errorf("/v1/events []: %d %s, want 400", status, b)
	}
	if recs := e.records(); len(recs) != 0 {
		t.Errorf("%d records written, want none", len(recs))
	}
}

// A CloudEvent without time gets the time the request was received (as
// OpenMeter does), unless the server requires a time.
func TestCloudEventWithoutTime(t *testing.T) {
	received := time.Date(2026, 12, 1, 8, 30, 0, 0, time.UTC)
	e := newEnv(t, func(c *Config) { c.Clock = func() time.Time { return received } })
	body := `{"specversion":"1.0","id":"r1","source":"s","type":"job","subject":"acme-1","data":{"seconds":"1.5"}}`
	if status, _, b := e.post("/api/v1/events", "application/cloudevents+json", e.token, []byte(body)); status != http.StatusNoContent {
		t.Fatalf("%d %s", status, b)
	}
	recs := e.records()
	if len(recs) != 1 || recs[0].EventTime != received.UnixMilli() || recs[0].Quantity != 1500 || recs[0].Meter != "gpu_ms" {
		t.Fatalf("records %+v, want one gpu_ms of 1500 at %d", recs, received.UnixMilli())
	}

	strict := newEnv(t, func(c *Config) { c.RequireTime = true })
	status, _, b := strict.post("/api/v1/events", "application/cloudevents+json", strict.token, []byte(body))
	p := problem(t, b)
	if status != http.StatusBadRequest || len(p.Errors) != 1 || p.Errors[0].Field != "time" {
		t.Fatalf("with RequireTime: %d %s", status, b)
	}
}

// A CloudEvent in binary content mode (its attributes in ce- headers, its
// data as the body: what the CloudEvents Go SDK's HTTP client sends unless
// told otherwise) is refused as OpenMeter refuses it, 400, and the answer
// says why: the body's "id is missing" alone sends its producer looking
// at an event that has one. Structured mode is taken, with or without
// the headers beside it (the HTTP binding allows them).
func TestCloudEventBinaryMode(t *testing.T) {
	e := newEnv(t, nil)
	c, err := cloudevents.NewClientHTTP(cehttp.WithHeader("Authorization", "Bearer "+e.token))
	if err != nil {
		t.Fatal(err)
	}
	ctx := cloudevents.ContextWithTarget(context.Background(), e.srv.URL()+"/api/v1/events")
	ev := prompt(t, "bin-1", "acme-1", map[string]any{"tokens": map[string]any{"input": 3}, "user": "u1"})
	res := c.Send(ctx, ev)
	var hr *cehttp.Result
	if !cloudevents.ResultAs(res, &hr) || hr.StatusCode != http.StatusBadRequest || !strings.Contains(res.Error(), "binary content mode") {
		t.Fatalf("binary mode: %v, want 400 naming binary content mode", res)
	}
	if recs := e.records(); len(recs) != 0 {
		t.Fatalf("binary mode sent %d records", len(recs))
	}
	binary := http.Header{"Ce-Specversion": {"1.0"}}
	// Any other media type than the CloudEvents ones, with a ce-specversion
	// header, is such a request too.
	if status, b := e.postWith("/api/v1/events", "text/plain", []byte("3"), binary); status != http.StatusUnsupportedMediaType || !strings.Contains(problem(t, b).Detail, "binary content mode") {
		t.Fatalf("binary mode, text/plain: %d %s", status, b)
	}

	if res := c.Send(cloudevents.WithEncodingStructured(ctx), ev); !cloudevents.IsACK(res) {
		t.Fatalf("structured mode: %v", res)
	}
	bin2 := prompt(t, "bin-2", "acme-1", map[string]any{"tokens": map[string]any{"input": 4}, "user": "u1"})
	if status, b := e.postWith("/api/v1/events", "application/cloudevents+json", mustJSON(t, bin2), binary); status != http.StatusNoContent {
		t.Fatalf("structured mode with ce- headers: %d %s", status, b)
	}
	if recs := e.records(); len(recs) != 6 { // a prompt feeds 3 meters
		t.Fatalf("structured mode: %d records, want 6", len(recs))
	}
}

// Meterline's own JSON format on /v1/events: one object, an array, NDJSON.
func TestMeterlineFormat(t *testing.T) {
	e := newEnv(t, nil)
	ev := func(id, c string, q int) string {
		return fmt.Sprintf(`{"event_id":%q,"customer_id":%q,"meter":"api_calls","quantity":%d,"event_time":"2026-11-29T12:00:00Z","source":"gw"}`, id, c, q)
	}
	for _, c := range []struct{ ct, body string }{
		{"application/json", ev("a", "acme-1", 1)},
		{"application/json", "[" + ev("b", "acme-1", 2) + "," + ev("c", "acme-2", 3) + "]"},
		{"application/x-ndjson", ev("d", "acme-1", 4) + "\n\n" + ev("e", "acme-2", 5) + "\n"},
	} {
		status, _, b := e.post("/v1/events", c.ct, e.token, []byte(c.body))
		if status != http.StatusAccepted || !strings.HasPrefix(string(b), `{"events":`) {
			t.Fatalf("%s: %d %s", c.ct, status, b)
		}
	}
	var sum int64
	for _, ue := range e.records() {
		sum += ue.Quantity
	}
	if sum != 15 {
		t.Errorf("quantities sum to %d, want 15", sum)
	}
}

func TestDecimalQuantity(t *testing.T) {
	for _, c := range []struct {
		s     string
		scale int
		want  int64
		why   string
	}{
		{"0", 0, 0, ""}, {"12", 0, 12, ""}, {"9223372036854775807", 0, 9223372036854775807, ""},
		{"1e3", 0, 1000, ""}, {"1.5e1", 0, 15, ""}, {"12.000", 0, 12, ""}, {"-0", 0, 0, ""}, {"0.0", 0, 0, ""},
		{"1.25", 2, 125, ""}, {"1.2", 2, 120, ""}, {"3", 3, 3000, ""}, {"1000e-3", 0, 1, ""}, {"1500e-3", 0, 0, "is not an integer"},
		{"1.5", 0, 0, "is not an integer"}, {"1.255", 2, 0, "more than 2 decimal places"},
		{"-1", 0, 0, "negative"}, {"9223372036854775808", 0, 0, "64-bit"}, {"1e19", 0, 0, "64-bit"},
		{"1e999999999", 0, 0, "64-bit"}, {"1e-999999999", 0, 0, "is not an integer"},
		// JSON allows leading zeros in an exponent: they do not make it large.
		{"1E+0000000", 0, 1, ""}, {"1e0000002", 0, 100, ""}, {"10e-0000001", 0, 1, ""}, {"25e-00000000000000000001", 1, 25, ""},
		{"1e00000000000000000019", 0, 0, "64-bit"}, {"1e-00000000000000000001", 0, 0, "is not an integer"},
		{"", 0, 0, "not a decimal"}, {" 1", 0, 0, "not a decimal"}, {"01", 0, 0, "not a decimal"}, {"1.", 0, 0, "not a decimal"},
		{"0x10", 0, 0, "not a decimal"}, {"NaN", 0, 0, "not a decimal"}, {"+1", 0, 0, "not a decimal"}, {"1e", 0, 0, "not a decimal"},
	} {
		got, why := decimalQuantity(c.s, c.scale)
		if got != c.want || (c.why == "") != (why == "") || !strings.Contains(why, c.why) {
			t.Errorf("decimalQuantity(%q, %d) = %d, %q; want %d, %q", c.s, c.scale, got, why, c.want, c.why)
		}
	}
}

// TestConcurrentRequestsKeepTheirRecords: many requests at once, each
// with events of its own, write exactly their records: a request's
// records, and the buffer their bytes are in, are reused by a later
// request only once Kafka has acknowledged them (request.release), so no
// record in Kafka holds another request's bytes.
func TestConcurrentRequestsKeepTheirRecords(t *testing.T) {
	e := newEnv(t, nil)
	const clients, requests, perRequest = 12, 15, 20
	var want []string
	bodies := make([][]byte, clients*requests)
	for r := range bodies {
		evs := make([]cloudevents.Event, perRequest)
		for k := range evs {
			i := r*perRequest + k
			// Subjects and IDs of different lengths, so that a record
			// written over by another request's bytes does not decode as
			// its own.
			subject, id := fmt.Sprintf("acme-%d", i%97), fmt.Sprintf("req-%d-%s", i, strings.Repeat("x", i%13))
			evs[k] = prompt(t, id, subject, map[string]any{"tokens": map[string]any{"input": i}, "model": fmt.Sprintf("m%d", i%5), "user": fmt.Sprintf("u%d", i)})
			eid := producer.EventID("chat-api", id)
			want = append(want, fmt.Sprintf("%s/input_tokens/%s q=%d props=[{model m%d}]", subject, eid, i, i%5),
				fmt.Sprintf("%s/prompts/%s q=1 props=[]", subject, eid),
				fmt.Sprintf("%s/users/%s q=1 props=[{user u%d}]", subject, eid, i))
		}
		bodies[r] = mustJSON(t, evs)
	}
	var wg sync.WaitGroup
	errs := make(chan string, clients)
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1}}
			defer hc.CloseIdleConnections()
			for r := c; r < len(bodies); r += clients {
				if status, _, body := post(t, hc, e.srv.URL()+"/api/v1/events", "application/cloudevents-batch+json", e.token, bodies[r]); status != http.StatusNoContent {
					errs <- fmt.Sprintf("request %d: %d %s", r, status, body)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	var got []string
	for _, ue := range e.records() { // each record's key is checked against its value
		got = append(got, fmt.Sprintf("%s/%s/%s q=%d props=%v", ue.CustomerID, ue.Meter, ue.EventID, ue.Quantity, ue.Properties))
	}
	sort.Strings(got)
	sort.Strings(want)
	if len(got) != len(want) {
		t.Fatalf("%d records, want %d", len(got), len(want))
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("record %q, want %q (the first difference)", got[i], want[i])
		}
	}
}
