package ingest

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/aggregator"
	"github.com/meterline/meterline/schemas"
)

var update = flag.Bool("update", false, "rewrite testdata/requests.golden")

// goldenMeters exercise every way a CloudEvent becomes usage: nested,
// bracketed and indexed paths, a UNIQUE_COUNT property that is also a
// group name, a scale.
const goldenMeters = `meters:
  - name: input_tokens
    event_type: prompt
    value_property: $.tokens.input
    group_by: {model: $.model, region: "$['geo']['region']"}
  - name: prompts
    aggregation: COUNT
    event_type: prompt
  - name: users
    aggregation: UNIQUE_COUNT
    property: user
    event_type: prompt
    value_property: $.user
    group_by: {user: $.model, tier: "$[\"tier\"]"}
  - name: first
    aggregation: MAX
    event_type: prompt
    value_property: $.list[0]
  - name: gpu_ms
    event_type: job
    value_property: $.seconds
    scale: 3
  - name: api_calls
`

// recorder keeps every record the server buffers for Kafka.
type recorder struct {
	mu   sync.Mutex
	recs []*kgo.Record
}

// OnProduceRecordBuffered keeps a copy: the ingest reuses its records once
// Kafka acknowledged them.
func (r *recorder) OnProduceRecordBuffered(rec *kgo.Record) {
	cp := &kgo.Record{Topic: rec.Topic, Key: bytes.Clone(rec.Key), Value: bytes.Clone(rec.Value)}
	r.mu.Lock()
	r.recs = append(r.recs, cp)
	r.mu.Unlock()
}

func (r *recorder) take() []*kgo.Record {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.recs
	r.recs = nil
	return out
}

// TestRequestsGolden posts a few hundred requests, most of them odd on
// purpose (escaped, duplicated and case-folded attribute names, every JSON
// type where a value is expected, nulls, nested data, extension
// attributes, bad times), one at a time and in batches, and compares each
// answer and the records it wrote with testdata/requests.golden. The
// golden file was written by the ingest before its fast paths (one-pass
// batch scanning, lookups in data's text without decoding it, the
// hand-written encoder): they must not change one byte of any answer or
// record. Run with -update to rewrite it.
func TestRequestsGolden(t *testing.T) {
	rec := &recorder{}
	received := time.Date(2026, 11, 29, 12, 30, 0, 0, time.UTC)
	cat, err := aggregator.ParseMeters([]byte(goldenMeters))
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, func(c *Config) {
		c.Meters = cat
		c.StrictMeters = true
		c.Clock = func() time.Time { return received }
		c.ClientOptions = append(c.ClientOptions, kgo.WithHooks(rec))
	})
	var out bytes.Buffer
	for i, c := range goldenRequests() {
		status, _, body := e.post(c.path, c.ct, e.token, []byte(c.body))
		var compact bytes.Buffer
		if len(body) > 0 {
			if err := json.Compact(&compact, body); err != nil {
				t.Fatalf("case %d: body is not JSON: %s", i, body)
			}
		}
		fmt.Fprintf(&out, "## %d %s %s\n%s\n=> %d %s\n", i, c.path, c.ct, c.body, status, compact.String())
		var lines []string
		for _, r := range rec.take() {
			var ue schemas.UsageEvent
			if err := schemas.DecodeInto(r.Value, &ue); err != nil {
				t.Fatalf("case %d: record %q: %v", i, r.Key, err)
			}
			lines = append(lines, fmt.Sprintf("   %q q=%d t=%d src=%q props=%q", r.Key, ue.Quantity, ue.EventTime, ue.Source, ue.Properties))
		}
		slices.Sort(lines)
		for _, l := range lines {
			out.WriteString(l + "\n")
		}
	}
	path := filepath.Join("testdata", "requests.golden")
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, out.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(out.Bytes(), want) {
		got, wantLines := strings.Split(out.String(), "\n"), strings.Split(string(want), "\n")
		for i := range min(len(got), len(wantLines)) {
			if got[i] != wantLines[i] {
				// Show the case the first difference is in.
				start := i
				for start > 0 && !strings.HasPrefix(got[start], "## ") {
					start--
				}
				t.Fatalf("answers differ from %s at line %d:\n got: %s\nwant: %s\n(case: %s)", path, i+1, got[i], wantLines[i], got[start])
			}
		}
		t.Fatalf("answers differ from %s: %d lines, want %d", path, len(got), len(wantLines))
	}
}

type goldenRequest struct{ path, ct, body string }

// goldenRequests are the requests of TestRequestsGolden: hand-picked
// cases, then random CloudEvents alone and in batches, and Meterline
// JSON events.
func goldenRequests() []goldenRequest {
	const single, batch = "application/cloudevents+json", "application/cloudevents-batch+json"
	good := `{"specversion":"1.0","id":"g1","source":"s","type":"prompt","subject":"acme-1","time":"2026-11-29T12:00:00Z","data":{"tokens":{"input":3},"model":"m1","user":"u","list":[5]}}`
	var out []goldenRequest
	for _, b := range []string{
		good,
		`[` + good + `]`,
		` [ ` + good + ` , ` + strings.Replace(good, `"g1"`, `"g2"`, 1) + ` ] `,
		`[]`, `[null]`, `[1]`, `[` + good + `,null]`, `[` + good + `,[]]`, `[` + good + `]x`, `[` + good + `,]`, "\u00a0[" + good + "]",
		"\ufeff[" + good + "]", `{}`, `[{}]`, `null`, `"x"`,
	} {
		out = append(out, goldenRequest{"/api/v1/events", batch, b}, goldenRequest{"/api/v1/events", "application/json", b})
	}
	rng := rand.New(rand.NewPCG(15, 11))
	for i := range 260 {
		out = append(out, goldenRequest{"/api/v1/events", single, randCloudEvent(rng, i)})
	}
	for i := range 120 {
		n := 1 + rng.IntN(4)
		evs := make([]string, n)
		for k := range evs {
			evs[k] = randCloudEvent(rng, 1000+10*i+k)
			if rng.IntN(3) > 0 {
				evs[k] = plainCloudEvent(rng, 1000+10*i+k) // most of a batch is plain
			}
		}
		ct := batch
		if i%4 == 0 {
			ct = "application/json"
		}
		out = append(out, goldenRequest{"/api/v1/events", ct, "[" + strings.Join(evs, ",") + "]"})
	}
	for i := range 30 {
		props := []string{``, `,"properties":{"model":"m1"}`, `,"properties":{"b":"1","a":"2","c":"\u00e9"}`, `,"properties":{"x":1}`}[i%4]
		q := []string{`1`, `0`, `"2"`, `-1`, `1.5`, `9223372036854775807`}[i%6]
		meter := []string{"api_calls", "prompts", "nope"}[i%3]
		out = append(out, goldenRequest{"/v1/events", "application/json", fmt.Sprintf(
			`{"event_id":"m%d","customer_id":"acme-%d","meter":%q,"quantity":%s,"event_time":"2026-11-29T12:00:00Z","source":"gw"%s}`, i, i%3, meter, q, props)})
	}
	return out
}

// plainCloudEvent is an ordinary prompt or job event, as SDKs send them.
func plainCloudEvent(rng *rand.Rand, i int) string {
	if rng.IntN(4) == 0 {
		return fmt.Sprintf(`{"specversion":"1.0","id":"p%d","source":"svc","type":"job","subject":"acme-%d","time":"2026-11-29T12:%02d:00Z","data":{"seconds":%s}}`,
			i, i%7, i%60, []string{`1.5`, `"2"`, `0.001`, `12`}[rng.IntN(4)])
	}
	return fmt.Sprintf(`{"specversion":"1.0","id":"p%d","source":"svc","type":"prompt","subject":"acme-%d","time":"2026-11-29T12:%02d:00.%03dZ","data":{"tokens":{"input":%d},"model":"m%d","user":"u%d","list":[%d]}}`,
		i, i%7, i%60, i%1000, rng.IntN(1000), rng.IntN(3), rng.IntN(9), rng.IntN(50))
}

// randCloudEvent is a CloudEvent's JSON text with random oddities: its
// attributes, their names and values, and its data are each drawn from
// ordinary and odd choices.
func randCloudEvent(rng *rand.Rand, i int) string {
	pick := func(vs ...string) string { return vs[rng.IntN(len(vs))] }
	maybe := func(p int, odd, ordinary string) string {
		if rng.IntN(100) < p {
			return odd
		}
		return ordinary
	}
	var attrs []string
	attrs = append(attrs, maybe(8, pick(`"specversion":"0.3"`, `"SpecVersion":"1.0"`, `"specversion":1`, `"specversion":null`, ``), `"specversion":"1.0"`))
	attrs = append(attrs, maybe(12, pick(`"ID":"x`+fmt.Sprint(i)+`"`, `"id":7`, `"id":null`, `"id":""`, `"i\u0064":"e`+fmt.Sprint(i)+`"`, `"id":"a\"b`+fmt.Sprint(i)+`"`, `"id":"d`+fmt.Sprint(i)+`","id":"dup"`, ``),
		`"id":"r`+fmt.Sprint(i)+`"`))
	attrs = append(attrs, maybe(8, pick(`"source":"s\u00e9"`, `"Source":"S"`, `"source":""`, `"source":["a"]`, "\"\u017fource\":\"long-s\"", ``), `"source":"chat"`))
	attrs = append(attrs, maybe(10, pick(`"type":"promt"`, `"type":"job"`, `"TYPE":"prompt"`, `"type":"prom\u0070t"`, `"type":{}`), `"type":"prompt"`))
	attrs = append(attrs, maybe(8, pick(`"subject":"globex-1"`, `"subject":"acme-\u0031"`, `"subject":"acme-\n"`, `"subject":"acme-`+strings.Repeat("x", 1100)+`"`, `"Subject":"acme-2"`, `"subject":""`, ``),
		`"subject":"acme-`+fmt.Sprint(i%5)+`"`))
	attrs = append(attrs, maybe(12, pick(`"time":"2026-11-29T12:00:00.250+01:00"`, `"time":"2026-11-29 12:00:00"`, `"time":null`, `"time":"2999-01-01T00:00:00Z"`, `"time":"1999-01-01T00:00:00Z"`, `"time":"2026-11-29T13:30:00.000999Z"`, `"time":1`, ``),
		`"time":"2026-11-29T12:00:00Z"`))
	if rng.IntN(10) == 0 {
		attrs = append(attrs, pick(`"datacontenttype":"application/json"`, `"datacontenttype":"text/plain"`, `"data_base64":"eA=="`, `"data_base64":null`, `"dataschema":"x"`, `"DataContentType":"text/plain"`))
	}
	if rng.IntN(8) == 0 {
		attrs = append(attrs, pick(`"ext":"{\"a\":[1,2.5e3,{\"b\":null}],\"c\":\"\\u12\"}"`, `"traceparent":"00-x"`, `"n":-0.0e-0`, `"e":-2147483648e0`, `"Ext":true`, `"u":"\ud83d\ude00"`))
	}
	attrs = append(attrs, maybe(92, `"data":`+randData(rng, 0), pick(`"data":null`, `"data":[1]`, `"data":"x"`, ``)))
	rng.Shuffle(len(attrs), func(a, b int) { attrs[a], attrs[b] = attrs[b], attrs[a] })
	var kept []string
	for _, a := range attrs {
		if a != "" {
			kept = append(kept, a)
		}
	}
	sep := pick(",", " , ", ",\n\t", ",")
	return pick("{", "{ ", "{\n") + strings.Join(kept, sep) + pick("}", " }", "\n}")
}

// randData is a data object: the members the meters read, sometimes
// escaped, duplicated or case-changed, with values of every JSON type.
func randData(rng *rand.Rand, depth int) string {
	pick := func(vs ...string) string { return vs[rng.IntN(len(vs))] }
	names := []string{`"tokens"`, `"model"`, `"user"`, `"geo"`, `"tier"`, `"list"`, `"seconds"`, `"Tokens"`, `"tok\u0065ns"`, `"x"`, `"m\u006fdel"`, `"us\ud800er"`}
	n := rng.IntN(4)
	var ms []string
	if depth == 0 && rng.IntN(4) > 0 {
		// What every prompt meter needs, so that most events pass and the
		// odd members after it (later duplicates win) are what decides.
		ms = append(ms, fmt.Sprintf(`"tokens":{"input":%d}`, rng.IntN(100)), fmt.Sprintf(`"list":[%d]`, rng.IntN(100)), `"seconds":2`, `"user":"u1"`)
	}
	for range n {
		name := names[rng.IntN(len(names))]
		var v string
		switch {
		case strings.Contains(name, "ok") || name == `"Tokens"`:
			v = pick(`{"input":`+randScalar(rng)+`}`, `{"input":`+randScalar(rng)+`,"input":`+randScalar(rng)+`}`, `{"Input":3}`, `{"in\u0070ut":4}`, randScalar(rng), `{}`)
		case name == `"geo"`:
			v = pick(`{"region":`+randScalar(rng)+`}`, `{"region":"eu"}`, `[]`, `{"region":{"x":1}}`)
		case name == `"list"`:
			v = pick(`[`+randScalar(rng)+`]`, `[]`, `[1,2]`, `{"0":1}`, `[[1]]`)
		case depth < 2 && rng.IntN(6) == 0:
			v = randData(rng, depth+1)
		default:
			v = randScalar(rng)
		}
		ms = append(ms, name+pick(":", " : ")+v)
	}
	if rng.IntN(3) == 0 && depth == 0 {
		ms = append(ms, `"tokens":{"input":`+randScalar(rng)+`}`, `"model":`+randScalar(rng))
	}
	return "{" + strings.Join(ms, pick(",", ", ")) + "}"
}

func randScalar(rng *rand.Rand) string {
	return []string{`0`, `7`, `-1`, `1.5`, `1e3`, `12.000`, `9223372036854775808`, `1E2`, `0.001`, `-0`, `2.50e1`,
		`"12"`, `"m1"`, `"a\"b"`, `"\u00e9t\u00e9"`, `"2.5"`, `""`, `"\ud800"`, `" 1"`, `"1e3"`,
		`true`, `false`, `null`, `{}`, `[]`, `{"a":1}`, `[null]`, `123456789012345678901234567890`}[rng.IntN(28)]
}
