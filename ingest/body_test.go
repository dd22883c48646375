package ingest

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/meterline/meterline/schemas"
)

// TestReadAll: readAll reads every byte whatever the size hint (exact,
// too small, too large, unknown), however the reader splits the body and
// whatever buffer it is given to reuse, and passes on a read error.
func TestReadAll(t *testing.T) {
	body := strings.Repeat("0123456789", 1000)
	for _, hint := range []int64{-1, 0, 1, 511, 512, int64(len(body)) - 1, int64(len(body)), int64(len(body)) + 1, 1 << 20} {
		for _, reader := range []func() io.Reader{
			func() io.Reader { return strings.NewReader(body) },
			func() io.Reader { return iotest.OneByteReader(strings.NewReader(body)) },
			func() io.Reader { return iotest.DataErrReader(strings.NewReader(body)) },
		} {
			// Into a new buffer, a small one and a large one holding bytes.
			for _, buf := range [][]byte{nil, []byte("xyz"), append(make([]byte, 0, 1<<16), "stale"...)} {
				got, err := readAll(buf, reader(), hint)
				if err != nil || !bytes.Equal(got, []byte(body)) {
					t.Fatalf("hint %d, buffer of %d: read %d bytes, %v; want %d", hint, cap(buf), len(got), err, len(body))
				}
			}
		}
	}
	boom := errors.New("boom")
	if _, err := readAll(nil, io.MultiReader(strings.NewReader(body), iotest.ErrReader(boom)), int64(len(body))); !errors.Is(err, boom) {
		t.Fatalf("err %v, want boom", err)
	}
}

// TestTooManyTinyEvents: a body within the size limit but of more events
// than a request may carry is answered 413 with their exact number,
// without decoding them: a body of tiny elements would otherwise take
// hundreds of bytes of memory for each byte read (a 1 MiB body of "{},"
// took 250 MB), on every path.
func TestTooManyTinyEvents(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.RefusalRate = -1 }) // every request is refused: no refusal budget (TestRefusalBudget)
	h := e.srv.Handler()
	const n = 90_000
	arr := func(elem string) string { return "[" + strings.Repeat(elem+",", n-1) + elem + "]" }
	for _, c := range []struct{ path, ct, body string }{
		{"/api/v1/events", "application/cloudevents-batch+json", arr("{}")},
		{"/api/v1/events", "application/json", arr(" {} ")},
		{"/api/v1/events", "application/json", arr("1")},
		{"/api/v1/events", "application/json", arr(`{"ID":""}`)}, // not the scanner's plain case
		{"/v1/events", "application/json", arr("{}")},
		{"/v1/events", "application/x-ndjson", strings.Repeat("{}\n", n)},
	} {
		w, alloc := serveMeasured(h, e.token, c.path, c.ct, c.body)
		want := fmt.Sprintf("%d events in one request, more than %d: split the batch", n, DefaultMaxEvents)
		if w.Code != http.StatusRequestEntityTooLarge || problem(t, w.Body.Bytes()).Detail != want {
			t.Errorf("%s %s: %d %s; want 413 %q", c.path, c.ct, w.Code, w.Body, want)
		}
		if most := uint64(4*len(c.body)) + 4<<20; alloc > most {
			t.Errorf("%s %s: a body of %d bytes took %d MB to refuse, more than %d MB", c.path, c.ct, len(c.body), alloc>>20, most>>20)
		}
	}
}

// TestManyPropertiesCostLittle: an event of Meterline's format whose
// properties have more members than an event may carry is refused naming
// properties (oversized) at a cost of about its size in memory, on every
// body shape: its properties are counted while its bytes are scanned,
// before encoding/json makes a map of them (a body of 90,000 properties
// took 19 times its size, some 16 MB, to be refused).
func TestManyPropertiesCostLittle(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.RefusalRate = -1 }) // every request is refused: no refusal budget (TestRefusalBudget)
	h := e.srv.Handler()
	const n = 90_000
	var props strings.Builder
	for i := range n {
		if i > 0 {
			props.WriteByte(',')
		}
		fmt.Fprintf(&props, `"%d":""`, i)
	}
	event := `{"event_id":"a","customer_id":"acme-1","meter":"api_calls","quantity":1,"event_time":"2026-11-29T12:00:00Z","properties":{` + props.String() + `}}`
	for _, c := range []struct{ ct, body string }{
		{"application/json", event},
		{"application/json", "[" + event + "]"},
		{"application/x-ndjson", event + "\n"},
	} {
		w, alloc := serveMeasured(h, e.token, "/v1/events", c.ct, c.body)
		p := problem(t, w.Body.Bytes())
		want := fmt.Sprintf("%d properties, more than %d", n, schemas.MaxProperties)
		if w.Code != http.StatusBadRequest || len(p.Errors) != 1 || p.Errors[0].Field != "properties" || p.Errors[0].Code != schemas.ReasonOversized || p.Errors[0].Reason != want {
			t.Errorf("%s: %d %s; want 400, properties oversized: %s", c.ct, w.Code, w.Body, want)
		}
		if most := uint64(2*len(c.body)) + 1<<20; alloc > most {
			t.Errorf("%s: a body of %d bytes took %d KiB to refuse, more than %d KiB", c.ct, len(c.body), alloc>>10, most>>10)
		} else {
			t.Logf("%s: a body of %d KiB took %d KiB to refuse", c.ct, len(c.body)>>10, alloc>>10)
		}
	}
}

// TestLargeDataCostsLittle: the members a meter's simple paths read are
// found in an event's data without decoding it or indexing every member,
// whatever its shape: a data of a megabyte nested deeper than a scanner's
// recursion, of many members, or of escaped member names, is accepted at
// a cost of a few times its size in memory (they took 35 to 65 times it,
// for a request accepted and costing a key one event).
func TestLargeDataCostsLittle(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.RefusalRate = -1 })
	h := e.srv.Handler()
	event := func(i int, rest string) string {
		return fmt.Sprintf(`{"specversion":"1.0","id":"big-%d","source":"s","type":"prompt","subject":"acme-1","time":"2026-11-29T12:00:00Z",`+
			`"data":{"tokens":{"input":3},"model":"m1","user":"u",%s}}`, i, rest)
	}
	small := strings.TrimSuffix(strings.Repeat("0,", 400_000), ",")
	for i, rest := range []string{
		// An array of small values, and a value nested deeper than
		// maxScanDepth after it.
		`"x":[` + small + `],"deep":` + strings.Repeat("[", 2000) + strings.Repeat("]", 2000),
		// Many members.
		members(90_000, `"k%d":0`),
		// Many escaped member names.
		members(55_000, `"\u0061%d":0`),
	} {
		body := event(i, rest)
		w, alloc := serveMeasured(h, e.token, "/api/v1/events", "application/cloudevents+json", body)
		if w.Code != http.StatusNoContent {
			t.Fatalf("event %d: %d %.300s", i, w.Code, w.Body)
		}
		if most := uint64(4*len(body)) + 4<<20; alloc > most {
			t.Errorf("event %d: a body of %d bytes took %d MB to accept, more than %d MB", i, len(body), alloc>>20, most>>20)
		}
	}
	models := map[string]int{}
	for _, ue := range e.records() {
		if ue.Meter == "input_tokens" {
			if ue.Quantity != 3 {
				t.Errorf("%s: quantity %d, want 3", ue.EventID, ue.Quantity)
			}
			for _, p := range ue.Properties {
				if p.Name == "model" {
					models[p.Value]++
				}
			}
		}
	}
	if want := map[string]int{"m1": 3 * measureReps}; !maps.Equal(models, want) {
		t.Errorf("models %v, want %v", models, want)
	}
	// A name repeated after many members, escaped or not, is found at a
	// cost of a few times the data's size too (duplicateMember).
	for i, rest := range []string{members(90_000, `"k%d":0`) + `,"model":"m2"`, members(55_000, `"\u0061%d":0`) + `,"a7":1`} {
		body := event(i, rest)
		w, alloc := serveMeasured(h, e.token, "/api/v1/events", "application/cloudevents+json", body)
		if p := problem(t, w.Body.Bytes()); w.Code != http.StatusBadRequest || len(p.Errors) != 1 || p.Errors[0].Reason != "appears twice" {
			t.Errorf("repeated name %d: %d %.300s", i, w.Code, w.Body)
		}
		if most := uint64(4*len(body)) + 4<<20; alloc > most {
			t.Errorf("repeated name %d: a body of %d bytes took %d MB to refuse, more than %d MB", i, len(body), alloc>>20, most>>20)
		}
	}
}

// TestDeepDataCostsLittle: a batch whose every event's data nests as deep
// as JSON may (encoding/json's limit, 10,000) is accepted at a cost of a
// few times its size in memory, like one deep event
// (TestLargeDataCostsLittle): the nesting duplicateMember follows in one
// event's data is not paid for again by each event of the batch (a
// megabyte of such events took 90 times its size, some 180 bytes for
// each level of nesting).
func TestDeepDataCostsLittle(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.RefusalRate = -1 })
	h := e.srv.Handler()
	const depth = 9_990
	for _, deep := range []string{
		strings.Repeat("[", depth) + strings.Repeat("]", depth),
		strings.Repeat(`{"a":`, depth) + "0" + strings.Repeat("}", depth),
	} {
		one := `{"specversion":"1.0","id":"deep","source":"s","type":"prompt","subject":"acme-1","time":"2026-11-29T12:00:00Z",` +
			`"data":{"tokens":{"input":3},"model":"m1","user":"u","deep":` + deep + `}}`
		n := (DefaultMaxBodyBytes - 2) / (len(one) + 1)
		body := "[" + strings.Repeat(one+",", n-1) + one + "]"
		w, alloc := serveMeasured(h, e.token, "/api/v1/events", "application/cloudevents-batch+json", body)
		if w.Code != http.StatusNoContent {
			t.Fatalf("%.10s: %d %.300s", deep, w.Code, w.Body)
		}
		if most := uint64(4*len(body)) + 4<<20; alloc > most {
			t.Errorf("%.10s: a body of %d events, %d bytes, took %d MB to accept, more than %d MB", deep, n, len(body), alloc>>20, most>>20)
		}
	}
}

// members is n members of an object, the kth written by format with k.
func members(n int, format string) string {
	var b strings.Builder
	for k := range n {
		if k > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, format, k)
	}
	return b.String()
}

// measureReps is how many times serveMeasured serves a request.
const measureReps = 3

// serveMeasured serves a request of body with the token through h
// measureReps times, and returns the last answer and the fewest bytes
// allocated meanwhile. The count is the process's: the test's broker and
// producer allocate too, the more the longer a request takes on a busy
// machine, and only add to it.
func serveMeasured(h http.Handler, token, path, contentType, body string) (*httptest.ResponseRecorder, uint64) {
	var w *httptest.ResponseRecorder
	least := uint64(math.MaxUint64)
	for range measureReps {
		req := httptest.NewRequest(http.MethodPost, path, strings.NewReader(body))
		req.Header.Set("Content-Type", contentType)
		req.Header.Set("Authorization", "Bearer "+token)
		w = httptest.NewRecorder()
		var m0, m1 runtime.MemStats
		runtime.ReadMemStats(&m0)
		h.ServeHTTP(w, req)
		runtime.ReadMemStats(&m1)
		least = min(least, m1.TotalAlloc-m0.TotalAlloc)
	}
	return w, least
}
