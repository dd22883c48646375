package ingest

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"sort"
	"strings"
	"testing"

	cloudevents "github.com/cloudevents/sdk-go/v2"
	"github.com/twmb/franz-go/pkg/kgo"
)

// ceWith is a CloudEvent of type prompt for acme-1 with the given id and
// extra attributes (each `"name":value`, comma-separated, no leading comma).
func ceWith(id, attrs string) string {
	return `{"specversion":"1.0","id":"` + id + `","source":"s","type":"prompt","subject":"acme-1","time":"2026-11-29T12:00:00Z",` + attrs + `}`
}

// eventErrors lists a 400's event errors as "index field reason".
func eventErrors(t *testing.T, status int, b []byte) string {
	t.Helper()
	if status != http.StatusBadRequest {
		t.Fatalf("%d %s, want 400", status, b)
	}
	var errs []string
	for _, fe := range problem(t, b).Errors {
		errs = append(errs, fmt.Sprintf("%d %s %s", fe.Index, fe.Field, fe.Reason))
	}
	return strings.Join(errs, "\n")
}

// tokensByID is the input_tokens records' quantities by event, as
// "customer meter quantity model".
func tokenRecords(e *env) []string {
	var got []string
	for _, r := range e.records() {
		if r.Meter != "input_tokens" {
			continue
		}
		got = append(got, fmt.Sprintf("%s q=%d props=%v", r.CustomerID, r.Quantity, r.Properties))
	}
	sort.Strings(got)
	return got
}

// datacontenttype, when present and not null, is exactly
// application/json, the one value of OpenMeter's schema: another type, a
// parameter (the CloudEvents SDK's own "application/json; charset=utf-8"
// included) or another case is refused naming the attribute, and the
// request sends nothing, on the batch and the single-event paths.
func TestCloudEventDataContentType(t *testing.T) {
	e := newEnv(t, nil)
	data := `"data":{"tokens":{"input":3},"model":"m1","user":"u1"}`
	good := []string{ceWith("g0", `"datacontenttype":"application/json",`+data), ceWith("g1", `"datacontenttype":null,`+data)}
	if status, _, b := e.post("/api/v1/events", "application/cloudevents-batch+json", e.token, []byte("["+strings.Join(good, ",")+"]")); status != http.StatusNoContent {
		t.Fatalf("batch: %d %s, want 204", status, b)
	}
	if status, _, b := e.post("/api/v1/events", "application/cloudevents+json", e.token,
		[]byte(ceWith("s1", `"datacontenttype":"application/json",`+data))); status != http.StatusNoContent {
		t.Fatalf("single event: %d %s, want 204", status, b)
	}
	if got := tokenRecords(e); len(got) != 3 || got[0] != "acme-1 q=3 props=[{model m1}]" || got[2] != got[0] {
		t.Fatalf("records: %v, want 3 of 3 tokens for m1", got)
	}

	bad := []string{
		"application/json; charset=utf-8", "application/json;charset=UTF-8", "Application/JSON", "APPLICATION/JSON", " application/json ",
		"text/json", "application/cloudevents+json", "application/cloudevents-batch+json",
		"text/plain", "application/json; charset=iso-8859-1", "application/vnd.acme+json", "", "application/xml",
	}
	batch := []string{ceWith("ok", data)}
	var want []string
	for i, dct := range bad {
		batch = append(batch, ceWith(fmt.Sprint("b", i), `"datacontenttype":"`+dct+`",`+data))
		want = append(want, fmt.Sprintf("%d datacontenttype %q is not supported; data must be JSON (application/json)", i+1, dct))
	}
	for _, ct := range []string{"application/cloudevents-batch+json", "application/json"} {
		status, _, b := e.post("/api/v1/events", ct, e.token, []byte("["+strings.Join(batch, ",")+"]"))
		if got := eventErrors(t, status, b); got != strings.Join(want, "\n") {
			t.Errorf("%s: errors\n%s\nwant\n%s", ct, got, strings.Join(want, "\n"))
		}
	}
	// The SDK's own event, with a charset.
	ev := prompt(t, "sdk1", "acme-1", nil)
	if err := ev.SetData("application/json; charset=utf-8", map[string]any{"tokens": map[string]any{"input": 3}, "model": "m1", "user": "u1"}); err != nil {
		t.Fatal(err)
	}
	for _, body := range [][]byte{mustJSON(t, ev), []byte(ceWith("b", `"datacontenttype":"text/plain",`+data))} {
		status, _, b := e.post("/api/v1/events", "application/cloudevents+json", e.token, body)
		if got := eventErrors(t, status, b); !strings.HasPrefix(got, "0 datacontenttype ") {
			t.Errorf("single event %s: %s, want datacontenttype named", body, got)
		}
	}
	if n := len(tokenRecords(e)); n != 3 {
		t.Errorf("%d records after the refused requests, want 3", n)
	}
}

// data_base64 holding base64 (standard, padded) of a JSON object is that
// object as data, as the CloudEvents SDK OpenMeter decodes with reads it
// (it is what the Go SDK sends for data set as bytes). Empty, or base64 of
// null, it is no data. The decoded bytes are checked as a request's own
// text is (valid UTF-8, no lone surrogate escape, JSON) and as data is (an
// object); null (OpenMeter refuses it too), another JSON type, and an
// event with both data and data_base64 are refused: each bad one is named
// and the request sends nothing.
func TestCloudEventDataBase64(t *testing.T) {
	e := newEnv(t, nil)
	b64 := func(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }
	data := `{"tokens":{"input":5},"model":"m1","user":"a?b"}` // its base64 holds a '/'
	enc := b64(data)
	if !strings.Contains(enc, "/") {
		t.Fatalf("%s: want a '/' in it", enc)
	}
	good := []string{
		ceWith("g0", `"data_base64":"`+enc+`"`),
		ceWith("g1", `"datacontenttype":"application/json","data_base64":"`+enc+`"`),
		ceWith("g2", `"data_base64":"`+strings.ReplaceAll(enc, "/", `\/`)+`"`), // a JSON string is its unescaped value
		ceWith("g3", `"data":null,"data_base64":"`+enc+`"`),
		ceWith("g4", `"data_base64":"`+b64(" \n"+data+"\n")+`"`),
	}
	if status, _, b := e.post("/api/v1/events", "application/cloudevents-batch+json", e.token, []byte("["+strings.Join(good, ",")+"]")); status != http.StatusNoContent {
		t.Fatalf("batch: %d %s, want 204", status, b)
	}
	if status, _, b := e.post("/api/v1/events", "application/json", e.token, []byte(ceWith("s1", `"data_base64":"`+enc+`"`))); status != http.StatusNoContent {
		t.Fatalf("single event: %d %s, want 204", status, b)
	}
	// The Go SDK sends data set as bytes in data_base64.
	ev := prompt(t, "sdk1", "acme-1", nil)
	if err := ev.SetData(cloudevents.ApplicationJSON, []byte(data)); err != nil {
		t.Fatal(err)
	}
	if body := mustJSON(t, ev); !strings.Contains(string(body), `"data_base64"`) {
		t.Fatalf("the SDK sent %s, want data_base64", body)
	}
	if status, _, b := e.post("/api/v1/events", "application/cloudevents+json", e.token, mustJSON(t, ev)); status != http.StatusNoContent {
		t.Fatalf("SDK event: %d %s, want 204", status, b)
	}
	if got := tokenRecords(e); len(got) != 7 || got[0] != "acme-1 q=5 props=[{model m1}]" || got[6] != got[0] {
		t.Fatalf("records: %v, want 7 of 5 tokens for m1", got)
	}
	// No data: a COUNT meter counts the event, a value path finds nothing.
	for _, d := range []string{`""`, `"` + b64("null") + `"`, `"` + b64(" null\n") + `"`} {
		status, _, b := e.post("/api/v1/events", "application/cloudevents+json", e.token, []byte(ceWith("n", `"data_base64":`+d)))
		if got := eventErrors(t, status, b); got != "0 data.tokens.input is missing: the event has no data; meter input_tokens reads its value from $.tokens.input" {
			t.Errorf("data_base64 %s: %s", d, got)
		}
	}

	bad := []struct{ attrs, reason string }{
		{`"data_base64":"!!!"`, "is not base64 (standard, padded): illegal base64 data at input byte 0"},
		{`"data_base64":"` + strings.TrimRight(b64(data+" "), "=") + `"`, "is not base64 (standard, padded): illegal base64 data at input byte 64"},
		{`"data_base64":"eA=="`, "does not hold JSON: invalid character 'x' looking for beginning of value (at byte 1)"},
		{`"data_base64":"` + b64(`{"tokens":{"input":5},"model":"m`+"\xff"+`"}`) + `"`, "does not hold valid UTF-8 (byte 0xff at offset 32)"},
		{`"data_base64":"` + b64(`{"tokens":{"input":5},"model":"\ud800"}`) + `"`, `does not hold valid text (\ud800 at offset 31 is half of a UTF-16 surrogate pair)`},
		{`"data_base64":5`, "must be a string, not a JSON number"},
		{`"data_base64":null`, "must be a string, not a JSON null"},
		{`"data_base64":"` + b64(`[{"tokens":{"input":5}}]`) + `"`, "must hold a JSON object, not a JSON array"},
		{`"data_base64":"` + b64(` "{}" `) + `"`, "must hold a JSON object, not a JSON string"},
		{`"data_base64":"` + b64(`5`) + `"`, "must hold a JSON object, not a JSON number"},
		{`"data_base64":"` + b64(`true`) + `"`, "must hold a JSON object, not a JSON boolean"},
		{`"data":{"tokens":{"input":5}},"data_base64":"` + enc + `"`, "must not be sent with data: an event carries one of them"},
		{`"datacontenttype":"text/plain","data_base64":"` + enc + `"`, ""},
	}
	batch := []string{ceWith("ok", `"data_base64":"`+enc+`"`)}
	var want []string
	for i, c := range bad {
		batch = append(batch, ceWith(fmt.Sprint("b", i), c.attrs))
		if c.reason == "" {
			want = append(want, fmt.Sprintf("%d datacontenttype %q is not supported; data must be JSON (application/json)", i+1, "text/plain"))
			continue
		}
		want = append(want, fmt.Sprintf("%d data_base64 %s", i+1, c.reason))
	}
	for _, ct := range []string{"application/cloudevents-batch+json", "application/json"} {
		status, _, b := e.post("/api/v1/events", ct, e.token, []byte("["+strings.Join(batch, ",")+"]"))
		if got := eventErrors(t, status, b); got != strings.Join(want, "\n") {
			t.Errorf("%s: errors\n%s\nwant\n%s", ct, got, strings.Join(want, "\n"))
		}
	}
	if n := len(tokenRecords(e)); n != 7 {
		t.Errorf("%d records after the refused requests, want 7", n)
	}
}

// FuzzDataBase64 holds data_base64 to data: for any bytes x, an event
// whose data_base64 is base64 of x is answered as the same event with x
// as its data is, and writes the same records; where x is not JSON, or
// not valid text, or not an object (the event with it as data is not a
// request at all, or is refused naming data), it is refused naming
// data_base64.
func FuzzDataBase64(f *testing.F) {
	for _, x := range []string{
		`{"tokens":{"input":3},"model":"m","user":"u"}`, ` {"tokens":{"input":"7"},"user":"u","model":null} `, `null`, `"x"`, `[1]`, `5`,
		`{"tokens":{"input":2.5},"user":"u"}`, `{"tokens":{"input":3},"user":"\ud800"}`, "{\"tokens\":{\"input\":3},\"user\":\"\xff\"}",
		`{"tokens":{"input":3},"user":"u"} x`, `{"tokens":{"input":3},"user":"u\u00e9\ud83d\ude00","model":{"a":1}}`, "{\"user\":\"a\x01\"}", "",
	} {
		f.Add([]byte(x))
	}
	rec := &recorder{}
	e := newEnv(f, func(c *Config) {
		c.ClientOptions = append(c.ClientOptions, kgo.WithHooks(rec))
		c.RefusalRate = -1 // the fuzzer refuses thousands of events a second
	})
	h := e.srv.Handler()
	serve := func(body string) (int, []byte, []string) {
		req := httptest.NewRequest(http.MethodPost, "/api/v1/events", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/cloudevents+json")
		req.Header.Set("Authorization", "Bearer "+e.token)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		var recs []string
		for _, r := range rec.take() {
			recs = append(recs, string(r.Key)+" "+string(r.Value))
		}
		sort.Strings(recs)
		return w.Code, w.Body.Bytes(), recs
	}
	f.Fuzz(func(t *testing.T, x []byte) {
		if len(bytes.TrimSpace(x)) == 0 {
			return // no data at all in data_base64; data: is not JSON
		}
		st1, b1, r1 := serve(ceWith("f", `"data":`+string(x)))
		st2, b2, r2 := serve(ceWith("f", `"data_base64":"`+base64.StdEncoding.EncodeToString(x)+`"`))
		refused := func() bool { // as data_base64, naming it, and nothing sent
			p2 := problem(t, b2)
			return st2 == http.StatusBadRequest && len(p2.Errors) == 1 && p2.Errors[0].Field == "data_base64" && len(r2) == 0
		}
		if !json.Valid(x) {
			// Not JSON: as data, x may make the request malformed, or
			// another event (its text ends data's value early).
			if !refused() {
				t.Fatalf("%q: as data_base64 %d %s, want 400 naming data_base64", x, st2, b2)
			}
			return
		}
		if st1 == http.StatusBadRequest {
			// x is not valid text, or not an object: the request's text
			// (its event, as data) or data is refused for it.
			p1 := problem(t, b1)
			if p1.Type == problemTypePrefix+"malformed" ||
				len(p1.Errors) == 1 && (p1.Errors[0].Field == "data" || strings.HasPrefix(p1.Errors[0].Field, "data.") || strings.HasPrefix(p1.Errors[0].Field, "data[")) &&
					strings.HasPrefix(p1.Errors[0].Reason, "is not valid ") ||
				len(p1.Errors) == 1 && p1.Errors[0].Field == "data" {
				if !refused() {
					t.Fatalf("%q: as data %s, as data_base64 %d %s, want 400 naming data_base64", x, b1, st2, b2)
				}
				return
			}
		}
		if st1 != st2 || !bytes.Equal(b1, b2) || !slices.Equal(r1, r2) {
			t.Fatalf("%q:\nas data        %d %s %q\nas data_base64 %d %s %q", x, st1, b1, r1, st2, b2, r2)
		}
	})
}
