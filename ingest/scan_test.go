package ingest

import (
	"bytes"
	"encoding/json"
	"math"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

// TestScanBatchTakesPlainBatches checks that the fast path is the path of
// ordinary batches (SDKs' and the benchmark's): a scanner that fell back
// to encoding/json for them would give the same answers, slower, and no
// other test would notice.
func TestScanBatchTakesPlainBatches(t *testing.T) {
	for _, body := range []string{
		string(benchBody(100)),
		"[\n {\"specversion\": \"1.0\", \"id\": \"a\", \"source\": \"s\", \"type\": \"prompt\", \"subject\": \"c\", \"xext1\": 2.5e3, \"xext2\": true, \"xext3\": null, \"xext4\": \"k\", \"data\": null, \"data_base64\": null, \"time\": null}\n]\n",
		`[{"id":"é✓","source":"s","specversion":"1.0","type":"t","subject":"c","data":{"a\"b":"\u00e9"}}]`,
	} {
		as, ok := scanBatch(nil, body, math.MaxInt)
		if !ok {
			t.Fatalf("scanBatch refused a plain batch: %.200s", body)
		}
		if want := wantAttrs(t, body); !slices.Equal(as, want) {
			t.Fatalf("scanBatch read %+v, encoding/json %+v", as, want)
		}
	}
	// And it leaves what it does not take to encoding/json.
	for _, body := range []string{
		`[{"ID":"a"}]`, `[{"id":"a","id":"b"}]`, `[{"id":"a\u0041"}]`, `[{"id":1}]`, `[{"kſnd":1}]`, `[{"x_ext":1}]`, `[{"Ext":1}]`, `[{"":1}]`, `[{"ext":{}}]`, `[{"ext":[1]}]`, `[{"ext":3e9}]`,
		`[{"id":"a"}] x`, `[{"id":"a"},]`, `[]`, `[null]`, `[{"x":` + strings.Repeat("[", maxScanDepth) + strings.Repeat("]", maxScanDepth) + `}]`,
	} {
		if _, ok := scanBatch(nil, body, math.MaxInt); ok {
			t.Errorf("scanBatch took %.80s; it is for encoding/json", body)
		}
	}
}

// wantAttrs decodes a batch as the slow path does.
func wantAttrs(t testing.TB, body string) []ceAttrs {
	var js []ceJSON
	if err := json.Unmarshal([]byte(body), &js); err != nil {
		t.Fatalf("encoding/json refuses %q (%v), which scanBatch took", body, err)
	}
	out := make([]ceAttrs, len(js))
	for i := range js {
		out[i] = js[i].attrs()
	}
	return out
}

// FuzzScanBatch: whatever batch scanBatch takes, encoding/json decodes to
// the same attributes.
func FuzzScanBatch(f *testing.F) {
	f.Add(string(benchBody(2)))
	for _, s := range []string{
		`[{"id":"a","source":"s","specversion":"1.0","type":"t","subject":"c","time":"2026-11-29T12:00:00Z","data":{"a":{"b":[1,"x"]}},"datacontenttype":"application/json"}]`,
		`[{"data":null,"data_base64":"eA==","dataschema":"x","ext":[{}]}, {}]`,
		`[{"id":"\u0061"}]`, `[{"Id":"a"}]`, `[{"id":null}]`, `[{"id":"a","id":null}]`, `[ {"id" : "a" } , { } ]`,
		`[{"data":1e5,"data_base64":-0.5E-3}]`, `[{"x":"\ud800"}]`, "[{\"id\":\"\x7f\"}]",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if !utf8.ValidString(s) {
			return // the handler only scans valid UTF-8
		}
		as, ok := scanBatch(nil, s, math.MaxInt)
		if !ok {
			return
		}
		if want := wantAttrs(t, s); !slices.Equal(as, want) {
			t.Fatalf("%q: scanBatch read %+v, encoding/json %+v", s, as, want)
		}
	})
}

// FuzzDataView: a simple path selects in the data's text what the
// JSONPath evaluation selects in the decoded data.
func FuzzDataView(f *testing.F) {
	for _, s := range []string{
		`{"tokens":{"input":3},"model":"m1","user":"u","list":[5]}`,
		`{"a":1,"a":{"b":"x"},"geo":{"region":"eu","region":null}}`,
		`{"a":{"b":{"c":"\u00e9\n"}},"b":true,"c":false,"d":null,"e":-1.5e3}`,
		`{"a\u0062":"esc","ab":"plain"}`, `{}`, ` { "a" : [ ] } `, `{"a":"x\"y"}`,
		`{"a":{"b":0,"\u0062":"esc","b\u0063":1},"geo":{"\u0072egion":"\ud83d\ude00","d":{"\ud83d\ude00":1}}}`,
		`{"\u0061":{"\/b\n":1,"b":{"c":[]}},"a\ud83d\ude00":2,"\ud800":3,"\ud800\u0061":4}`,
		`{"a":` + strings.Repeat("[", 600) + strings.Repeat("]", 600) + `,"geo":{"region":"x","d":` + strings.Repeat(`{"a":`, 600) + "1" + strings.Repeat("}", 600) + `}}`,
		`{` + strings.Repeat(`"a":1,`, maxIndexed) + `"tokens":{"input":2},"a":{"b":"last"}}`,
		`{"a":[{"b":1},[2,[3]],"x",null,{"b":{"c":4}}],"list":[ ],"geo":{"d":[ 7 , {"a":[8]} ]}}`,
	} {
		for _, p := range []string{`$.a`, `$.a.b`, `$['a']['b']['c']`, `$.geo.region`, `$.tokens.input`, `$`, `$.ab`, `$.a.b.c.d`, `$['a😀']`, `$['\ufffd']`, `$.a.b.c`, `$.geo.d.a.a`,
			`$.a[0]`, `$.a[0].b`, `$.a[1][1][0]`, `$.a[-1].b.c`, `$.a[-5]`, `$.a[-6]`, `$.a[5]`, `$.list[0]`, `$.list[-1]`, `$[0]`, `$.geo.d[1].a[-1]`, `$.a.b[0]`} {
			f.Add(s, p)
		}
	}
	f.Fuzz(func(t *testing.T, data, path string) {
		dp, err := compilePath(path)
		if err != nil || !dp.simple {
			return
		}
		data = trimSpace(data)
		if !utf8.ValidString(data) || !json.Valid([]byte(data)) || len(data) == 0 || data[0] != '{' {
			return // the data of a CloudEvent that passed checkCloudEvent
		}
		var d dataView
		d.reset(data)
		got, ok := d.lookup(dp.steps)
		if !ok {
			t.Fatalf("%q: the view refused valid data", data)
		}
		var decoded any
		dec := json.NewDecoder(bytes.NewReader([]byte(data)))
		dec.UseNumber()
		if err := dec.Decode(&decoded); err != nil {
			t.Fatal(err)
		}
		var want jvalue
		switch nodes := dp.path.Select(decoded); len(nodes) {
		case 0:
		case 1:
			want = anyJValue(nodes[0])
		default:
			t.Fatalf("%s selects %d values", path, len(nodes))
		}
		if got != want {
			t.Fatalf("%s in %q: the view selects %+v, the JSONPath evaluation %+v", path, data, got, want)
		}
	})
}

// TestCEBit: ceBit finds each attribute's name, and no other.
func TestCEBit(t *testing.T) {
	for k, n := range ceNames {
		if got := ceBit(n); got != k {
			t.Errorf("ceBit(%q) = %d, want %d", n, got, k)
		}
	}
	for _, n := range []string{"", "ID", "i", "ids", "data_base", "sourc", "x"} {
		if got := ceBit(n); got != -1 {
			t.Errorf("ceBit(%q) = %d, want -1", n, got)
		}
	}
}

// FuzzCheckEscapes: checkEscapes refuses a JSON string exactly when
// encoding/json would decode one of its escapes to U+FFFD (half of a
// surrogate pair), and never panics.
func FuzzCheckEscapes(f *testing.F) {
	for _, s := range []string{`a`, `\ud800`, `\ud83d\ude00`, `\udfff`, `\\ud800`, `\ud800\u0041`, `\ud800\udc0`, `x\ud83d`, `\u00e9\n`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		raw := []byte(`"` + s + `"`)
		fe := checkEscapes(raw)
		var v string
		if !utf8.ValidString(s) || strings.ContainsRune(s, utf8.RuneError) || strings.Contains(strings.ToLower(s), `\ufffd`) ||
			json.Unmarshal(raw, &v) != nil {
			return // only the replacement characters of a surrogate escape are in question
		}
		if replaced := strings.ContainsRune(v, utf8.RuneError); replaced != (fe != nil) {
			t.Fatalf("%s: decodes to %q, checkEscapes says %v", raw, v, fe)
		}
	})
}

// TestLastMemberAllocates: finding a member by name allocates nothing,
// whatever the names' escapes, so that a data of many members costs a
// lookup no memory (TestLargeDataCostsLittle).
func TestLastMemberAllocates(t *testing.T) {
	obj := `{"\u0061":1,"a\ud83d\ude00\n":2,` + strings.Repeat(`"\u0062":[{"\/":"\\"}],`, 100) + `"b\u0063":{"d":3}}`
	for _, c := range []struct{ name, want string }{{"a", "1"}, {"a😀\n", "2"}, {"bc", `{"d":3}`}, {"b", `[{"\/":"\\"}]`}} {
		var v string
		var found, ok bool
		if n := testing.AllocsPerRun(10, func() { v, found, ok = lastMember(obj, c.name) }); n != 0 || !ok || !found || v != c.want {
			t.Errorf("%q: %v allocations, %q found %t ok %t; want none, %q", c.name, n, v, found, ok, c.want)
		}
	}
}
