package ingest

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/meterline/meterline/aggregator"
)

// TestOpenMeterParity sends the requests whose answers OpenMeter's own
// request path was seen to give, and wants Meterline's answer of the same
// class: 2xx where OpenMeter accepts, 4xx where it refuses (and where it
// fails with a 500, on data_base64 whose bytes are not JSON or that is not
// a string, a 400 naming data_base64).
//
// How the answers were obtained: OpenMeter's server checks every
// /api/v1/events request against its api/openapi.yaml with oapi-codegen's
// OapiRequestValidator (kin-openapi; options as in
// openmeter/server/server.go) before its handler
// (openmeter/ingest/httpdriver/ingest.go) decodes the events with the
// CloudEvents Go SDK (v2.16.2) and its Kafka serializer reads each
// event's data with DataAs. A rebuild of that path (validator, handler's
// Content-Type switch, serializer) was run on each request below; om is
// its status. The cases are those of that rebuild, in its order; the
// cases after "CT xml" were added to a copy of it and run the same way
// (the SDK's panic on a data_base64 that is not a string taken as a
// 500). The only
// change here: the subject is a customer of the test key (acme-1, for
// "c"), and type t feeds a COUNT meter, so that every event OpenMeter
// takes can be metered.
//
// Where Meterline answers another class, on purpose, meterline is that
// class and the comment says why.
func TestOpenMeterParity(t *testing.T) {
	e := parityEnv(t)
	ev := func(extra string) string {
		return `{"specversion":"1.0","id":"1","source":"s","type":"t","subject":"acme-1"` + extra + `}`
	}
	const ce, batch, js = "application/cloudevents+json", "application/cloudevents-batch+json", "application/json"
	cases := []struct {
		name, ct, body string
		om             int    // OpenMeter's status
		meterline      int    // Meterline's class (200 or 400) where it differs on purpose; 0: OpenMeter's
		field          string // the event field Meterline's 400 names, if any
	}{
		{"time empty", ce, ev(`,"time":"","data":{"a":1}`), 400, 0, "time"},
		{"time null", ce, ev(`,"time":null,"data":{"a":1}`), 204, 0, ""},
		{"time bad", ce, ev(`,"time":"yesterday","data":{"a":1}`), 400, 0, "time"},
		{"data null", ce, ev(`,"data":null`), 204, 0, ""},
		{"plain obj", ce, ev(`,"data":{"a":1}`), 204, 0, ""},
		{"dct application/json", ce, ev(`,"datacontenttype":"application/json","data":{"a":1}`), 204, 0, ""},
		{"dct charset", ce, ev(`,"datacontenttype":"application/json; charset=utf-8","data":{"a":1}`), 400, 0, "datacontenttype"},
		{"dct text/json", ce, ev(`,"datacontenttype":"text/json","data":{"a":1}`), 400, 0, "datacontenttype"},
		{"dct ce+json", ce, ev(`,"datacontenttype":"application/cloudevents+json","data":{"a":1}`), 400, 0, "datacontenttype"},
		{"dct APPLICATION/JSON", ce, ev(`,"datacontenttype":"APPLICATION/JSON","data":{"a":1}`), 400, 0, "datacontenttype"},
		{"dct null", ce, ev(`,"datacontenttype":null,"data":{"a":1}`), 204, 0, ""},
		{"data string", ce, ev(`,"data":"x"`), 400, 0, "data"},
		{"data number", ce, ev(`,"data":5`), 400, 0, "data"},
		{"data array", ce, ev(`,"data":[1]`), 400, 0, "data"},
		{"data_base64 json no dct", ce, ev(`,"data_base64":"eyJhIjoxfQ=="`), 204, 0, ""},
		{"data_base64 json dct json", ce, ev(`,"datacontenttype":"application/json","data_base64":"eyJhIjoxfQ=="`), 204, 0, ""},
		{"data_base64 not json", ce, ev(`,"datacontenttype":"application/json","data_base64":"aGVsbG8="`), 500, 0, "data_base64"},
		{"data_base64 bad b64", ce, ev(`,"data_base64":"!!!"`), 400, 0, "data_base64"},
		{"data_base64 null", ce, ev(`,"data_base64":null`), 400, 0, "data_base64"},
		{"batch dct charset", batch, "[" + ev(`,"datacontenttype":"application/json; charset=utf-8","data":{"a":1}`) + "]", 400, 0, "datacontenttype"},
		{"batch data_base64", batch, "[" + ev(`,"data_base64":"eyJhIjoxfQ=="`) + "]", 204, 0, ""},
		{"json obj data_base64", js, ev(`,"data_base64":"eyJhIjoxfQ=="`), 204, 0, ""},
		{"json arr data string", js, "[" + ev(`,"data":"x"`) + "]", 400, 0, "data"},
		// The request's Content-Type: Meterline reads it as RFC 9110 has
		// it (any case, a charset parameter of utf-8), a superset.
		{"CT batch charset", batch + "; charset=utf-8", "[" + ev(`,"data":{"a":1}`) + "]", 400, 200, ""},
		{"CT json charset", js + "; charset=utf-8", ev(`,"data":{"a":1}`), 400, 200, ""},
		{"CT ce+json charset", ce + "; charset=utf-8", ev(`,"data":{"a":1}`), 400, 200, ""},
		{"CT upper", "Application/JSON", ev(`,"data":{"a":1}`), 400, 200, ""},
		{"CT missing", "", ev(`,"data":{"a":1}`), 400, 0, ""},
		{"CT text/plain", "text/plain", ev(`,"data":{"a":1}`), 400, 0, ""},
		{"CT xml", "application/xml", ev(`,"data":{"a":1}`), 400, 0, ""},
		// Structured-syntax suffixes (RFC 6839) are not JSON enough for
		// either: OpenMeter's spec names its three media types only.
		{"CT vnd+json", "application/vnd.x+json", ev(`,"data":{"a":1}`), 400, 0, ""},
		{"dct vnd+json", ce, ev(`,"datacontenttype":"application/vnd.x+json","data":{"a":1}`), 400, 0, "datacontenttype"},
		{"dct ld+json", ce, ev(`,"datacontenttype":"application/ld+json","data":{"a":1}`), 400, 0, "datacontenttype"},

		{"data true", ce, ev(`,"data":true`), 400, 0, "data"},
		{"data null with data_base64", ce, ev(`,"data":null,"data_base64":"eyJhIjoxfQ=="`), 204, 0, ""},
		{"data_base64 empty", ce, ev(`,"data_base64":""`), 204, 0, ""},
		{"data_base64 of null", ce, ev(`,"data_base64":"bnVsbA=="`), 204, 0, ""},
		{"data_base64 a number", ce, ev(`,"data_base64":5`), 500, 0, "data_base64"}, // the SDK panics
		{"dct empty", ce, ev(`,"datacontenttype":"","data":{"a":1}`), 400, 0, "datacontenttype"},
		{"time space", ce, ev(`,"time":" ","data":{"a":1}`), 400, 0, "time"},
		{"time good", ce, ev(`,"time":"2026-11-29T12:00:00Z","data":{"a":1}`), 204, 0, ""},
		// OpenMeter takes both (the data of data_base64); an event
		// carries one of them, and which one was meant is a guess.
		{"data with data_base64 null", ce, ev(`,"data":{"a":1},"data_base64":null`), 400, 0, "data_base64"},
		// OpenMeter takes both (the data of data_base64, even none); an
		// event carries one of them, and which one was meant is a guess.
		{"data with data_base64", ce, ev(`,"data":{"a":1},"data_base64":"eyJhIjoxfQ=="`), 204, 400, "data_base64"},
		{"data with data_base64 empty", ce, ev(`,"data":{"a":1},"data_base64":""`), 204, 400, "data_base64"},
		// OpenMeter takes base64 of any JSON, past its schema, which
		// wants data an object: data_base64 is held to that rule too.
		{"data_base64 of an array", ce, ev(`,"data_base64":"WzFd"`), 204, 400, "data_base64"},
		{"data_base64 of a string", ce, ev(`,"data_base64":"IngiCg=="`), 204, 400, "data_base64"},
		// An attribute named twice: OpenMeter's validator decodes the body
		// last-wins, and the CloudEvents SDK keeps the last id, source,
		// type, subject and time, as encoding/json does here; it refuses a
		// second specversion, and a second datacontenttype after the
		// specversion, as Meterline does (checkNames; a second
		// datacontenttype before it too, which the SDK reads last-wins).
		{"id twice", ce, ev(`,"id":"2"`), 204, 0, ""},
		{"source twice", ce, ev(`,"source":"s2"`), 204, 0, ""},
		{"type twice", ce, `{"specversion":"1.0","id":"1","source":"s","type":"u","subject":"acme-1","type":"t"}`, 204, 0, ""},
		{"subject twice", ce, `{"specversion":"1.0","id":"1","source":"s","type":"t","subject":"globex-1","subject":"acme-1"}`, 204, 0, ""},
		{"time twice", ce, ev(`,"time":"2026-11-29T12:00:00Z","time":"2026-11-30T12:00:00Z"`), 204, 0, ""},
		{"id twice before specversion", ce, `{"id":"1","id":"2","specversion":"1.0","source":"s","type":"t","subject":"acme-1"}`, 204, 0, ""},
		{"batch id twice", batch, "[" + ev(`,"id":"2"`) + "]", 204, 0, ""},
		{"json subject twice", js, ev(`,"subject":"acme-1"`), 204, 0, ""},
		{"id twice, the second null", ce, ev(`,"id":null`), 400, 0, "id"},
		{"id twice, the second a number", ce, ev(`,"id":7`), 400, 0, "id"},
		{"subject twice, the second empty", ce, ev(`,"subject":""`), 400, 0, "subject"},
		{"specversion twice", ce, ev(`,"specversion":"1.0"`), 400, 0, "specversion"},
		{"datacontenttype twice", ce, ev(`,"datacontenttype":"application/json","datacontenttype":"application/json","data":{"a":1}`), 400, 0, "datacontenttype"},
		{"batch specversion twice", batch, "[" + ev(`,"specversion":"1.0"`) + "," + ev("") + "]", 400, 0, "specversion"},
		{"json array specversion twice", js, "[" + ev(`,"specversion":"1.0"`) + "]", 400, 0, "specversion"},
		{"specversion twice, escaped", ce, ev(`,"spec\u0076ersion":"1.0"`), 400, 0, "specversion"},
		// The SDK reads a datacontenttype repeated before the specversion
		// last-wins; an event carries one, and which was meant is a guess.
		{"datacontenttype twice before specversion", ce, `{"datacontenttype":"application/json","datacontenttype":"application/json","specversion":"1.0","id":"1","source":"s","type":"t","subject":"acme-1","data":{"a":1}}`, 204, 400, "datacontenttype"},
		// Attribute names. These answers were not run on the rebuild: the
		// body was decoded with the CloudEvents SDK v2.16.2
		// (json.Unmarshal into event.Event, as OpenMeter's handler
		// does), and the validator's part read from api/openapi.yaml (its
		// Event schema requires id, source, specversion, type and subject,
		// exactly so named, and allows other members). The SDK matches an
		// attribute's name exactly; any other member is an extension,
		// whose name it checks (a-z, A-Z, 0-9) and lowercases, refusing
		// one that is then an attribute's name ("bad key \"ID\":
		// CloudEvents spec attribute MUST NOT be overwritten by
		// extension"), and whose value must be a string, a boolean or a
		// number (v2/event/eventcontext_v1.go SetExtension,
		// v2/event/extensions.go validateExtensionName).
		{"ID instead of id", ce, `{"specversion":"1.0","ID":"1","source":"s","type":"t","subject":"acme-1"}`, 400, 0, "ID"}, // the validator: id is missing
		{"id and ID", ce, ev(`,"ID":"2"`), 400, 0, "ID"},
		{"ID and id before specversion", ce, `{"ID":"2","id":"1","specversion":"1.0","source":"s","type":"t","subject":"acme-1"}`, 400, 0, "ID"},
		{"Subject and subject", ce, `{"specversion":"1.0","id":"1","source":"s","type":"t","Subject":"globex-1","subject":"acme-1"}`, 400, 0, "Subject"},
		{"batch id and ID", batch, "[" + ev(`,"ID":"2"`) + "]", 400, 0, "ID"},
		{"json Time", js, ev(`,"Time":"2026-11-29T12:00:00Z"`), 400, 0, "Time"},
		{"Data an object", ce, ev(`,"Data":{"a":1}`), 400, 0, "Data"}, // an extension's value may not be an object
		{"Data_Base64", ce, ev(`,"Data_Base64":"eyJhIjoxfQ=="`), 400, 0, "Data_Base64"},
		{"extension with an underscore", ce, ev(`,"my_ext":"x"`), 400, 0, "my_ext"},
		{"extension lowercase", ce, ev(`,"myext":"x","ext2":true`), 204, 0, ""},
		// The SDK takes an extension's value when it is a string, a
		// boolean, null (no extension) or a number within 32 bits, which
		// it truncates (v2/types/value.go Validate: int32); it refuses an
		// object, an array and a number beyond that ("invalid CloudEvents
		// value", "value out of range").
		{"extension values the SDK takes", ce, ev(`,"ext1":"x","ext2":true,"ext3":null,"ext4":2147483647,"ext5":-2147483648,"ext6":1.5,"ext7":2147483647.0`), 204, 0, ""},
		{"extension an object", ce, ev(`,"ext":{"a":1}`), 400, 0, "ext"},
		{"extension an array", ce, ev(`,"ext":[1]`), 400, 0, "ext"},
		{"extension an empty object", ce, ev(`,"ext":{}`), 400, 0, "ext"},
		{"extension beyond 32 bits", ce, ev(`,"seq":2147483648`), 400, 0, "seq"},
		{"extension below 32 bits", ce, ev(`,"seq":-2147483649`), 400, 0, "seq"},
		{"extension 1e400", ce, ev(`,"seq":1e400`), 400, 0, "seq"},
		{"extension an object before specversion", ce, `{"ext":{"a":1},"specversion":"1.0","id":"1","source":"s","type":"t","subject":"acme-1"}`, 400, 0, "ext"},
		{"batch extension an object", batch, "[" + ev("") + "," + ev(`,"ext":{"a":1}`) + "]", 400, 0, ""},
		{"json extension an array", js, ev(`,"Ext":[]`), 400, 0, "Ext"},
		// OpenMeter's schema wants a specversion of minLength 1, and its
		// SDK reads 0.3 by CloudEvents 0.3's rules (data_base64 and
		// dataschema extensions there); Meterline takes 1.0 alone.
		{"specversion 0.3", ce, `{"specversion":"0.3","id":"1","source":"s","type":"t","subject":"acme-1","data":{"a":1}}`, 204, 400, "specversion"},
		// OpenMeter's SDK takes upper case in an extension's name (and
		// lowercases it); extensions are ignored, so Meterline takes it.
		{"extension upper case", ce, ev(`,"Foo":"x"`), 204, 0, ""},
		// The SDK makes "Data" an extension named data; Meterline refuses
		// an attribute's name in another case.
		{"Data a string", ce, ev(`,"Data":"x"`), 204, 400, "Data"},
		// The SDK's reader stops at a member named "" and ignores the
		// rest of the event (a subject after it, say).
		{"extension named empty", ce, ev(`,"":"x"`), 204, 400, ""},
		// Read from the validator's part, not run on the rebuild: the
		// Event schema's time has format date-time, which kin-openapi
		// checks with its RFC 3339 pattern (a full stop before a fraction
		// of a second; time.Parse also takes a comma), and its dataschema
		// minLength 1 (and format uri, which kin-openapi does not check).
		{"time with a decimal comma", ce, ev(`,"time":"2026-11-29T12:00:00,5Z","data":{"a":1}`), 400, 0, "time"},
		{"time with a decimal point", ce, ev(`,"time":"2026-11-29T12:00:00.5Z","data":{"a":1}`), 204, 0, ""},
		{"batch time with a decimal comma", batch, "[" + ev(`,"time":"2026-11-29T12:00:00,5Z"`) + "]", 400, 0, "time"},
		// The same pattern wants two digits in the hour, an upper-case T
		// and Z, and a colon in the offset; time.Parse takes an hour of
		// one digit. A leap second (:60) passes the pattern, and the
		// SDK's time.Parse refuses it.
		{"time with an hour of one digit", ce, ev(`,"time":"2026-11-29T1:00:00Z","data":{"a":1}`), 400, 0, "time"},
		{"batch time with an hour of one digit", batch, "[" + ev(`,"time":"2026-11-29T9:30:00.5+01:00"`) + "]", 400, 0, "time"},
		{"time with a lower-case t", ce, ev(`,"time":"2026-11-29t12:00:00Z"`), 400, 0, "time"},
		{"time with a lower-case z", ce, ev(`,"time":"2026-11-29T12:00:00z"`), 400, 0, "time"},
		{"time with an offset without a colon", ce, ev(`,"time":"2026-11-29T12:00:00+0100"`), 400, 0, "time"},
		{"time with a leap second", ce, ev(`,"time":"2026-11-29T12:00:60Z"`), 400, 0, "time"},
		{"time with an offset", ce, ev(`,"time":"2026-11-29T13:00:00.25+01:00"`), 204, 0, ""},
		{"dataschema empty", ce, ev(`,"dataschema":""`), 400, 0, "dataschema"},
		{"batch dataschema empty", batch, "[" + ev(`,"dataschema":""`) + "]", 400, 0, "dataschema"},
		{"dataschema not a URI", ce, ev(`,"dataschema":"not a uri"`), 204, 0, ""},
		{"dataschema null", ce, ev(`,"dataschema":null`), 204, 0, ""},
		// Read from the validator's part: the schema wants id, source,
		// type and subject of minLength 1, which white space passes, and
		// the handler never calls the SDK's Validate, which reads them
		// trimmed (v2/event/eventcontext_v1.go) and refuses them as
		// missing. Meterline refuses them: a blank id would make one
		// identity of every event that has it.
		{"id blank", ce, `{"specversion":"1.0","id":"   ","source":"s","type":"t","subject":"acme-1"}`, 204, 400, "id"},
		{"id no-break space", ce, "{\"specversion\":\"1.0\",\"id\":\"\u00a0\",\"source\":\"s\",\"type\":\"t\",\"subject\":\"acme-1\"}", 204, 400, "id"},
		{"batch id blank", batch, `[{"specversion":"1.0","id":" ","source":"s","type":"t","subject":"acme-1"}]`, 204, 400, "id"},
		{"json id blank", js, `[{"specversion":"1.0","id":"\t ","source":"s","type":"t","subject":"acme-1"}]`, 204, 400, "id"},
		{"source blank", ce, `{"specversion":"1.0","id":"1","source":" ","type":"t","subject":"acme-1"}`, 204, 400, "source"},
		{"subject blank", ce, `{"specversion":"1.0","id":"1","source":"s","type":"t","subject":"  "}`, 204, 400, "subject"},
		{"id with blanks around", ce, `{"specversion":"1.0","id":" 2 ","source":"s","type":"t","subject":"acme-1"}`, 204, 0, ""},
	}
	class := func(status int) int { return status / 100 * 100 }
	accepted := 0
	for _, c := range cases {
		want := c.meterline
		if want == 0 {
			want = min(class(c.om), 400) // OpenMeter's 500s are its bugs: bad input, 400 here
		}
		status, _, b := e.post("/api/v1/events", c.ct, e.token, []byte(c.body))
		if class(status) != want {
			t.Errorf("%s: %d %s, want %dx (OpenMeter: %d)", c.name, status, b, want/100, c.om)
			continue
		}
		if want == 200 {
			accepted++
			continue
		}
		if c.field != "" {
			p := problem(t, b)
			var fields []string
			for _, fe := range p.Errors {
				fields = append(fields, fmt.Sprintf("%d %s", fe.Index, fe.Field))
			}
			if status != http.StatusBadRequest || strings.Join(fields, ",") != "0 "+c.field {
				t.Errorf("%s: %d %s, want 400 naming %s", c.name, status, b, c.field)
			}
		}
	}
	if n := len(e.records()); n != accepted {
		t.Errorf("%d records, want %d (one per accepted request)", n, accepted)
	}
}

// parityEnv is an ingest whose meter ts counts the events of type t.
func parityEnv(t *testing.T) *env {
	t.Helper()
	cat, err := aggregator.ParseMeters([]byte("meters:\n  - name: ts\n    aggregation: COUNT\n    event_type: t\n"))
	if err != nil {
		t.Fatal(err)
	}
	return newEnv(t, func(c *Config) { c.Meters = cat })
}

// TestTrailingDataRefused: a JSON body with anything but blanks after its
// first value is refused 400 malformed on every JSON endpoint, and nothing
// is sent. OpenMeter differs on purpose here: its handler
// (openmeter/ingest/httpdriver/ingest.go) decodes the body with one
// json.NewDecoder(r.Body).Decode, as its request validator's JSON body
// decoder (kin-openapi's openapi3filter) does, so both read the first
// value and ignore the rest: it takes `{event}{event}` as its first event
// alone, and `{event} garbage` as the event. A body read in part is a
// client's mistake that would otherwise lose events without a word.
// Trailing blanks (a file's last newline) are taken, as by both.
func TestTrailingDataRefused(t *testing.T) {
	e := parityEnv(t)
	ev := func(id string) string {
		return `{"specversion":"1.0","id":"` + id + `","source":"s","type":"t","subject":"acme-1"}`
	}
	ml := func(id string) string { return string(apiCall(id, "acme-1")) }
	const ce, batch, js = "application/cloudevents+json", "application/cloudevents-batch+json", "application/json"
	for _, c := range []struct{ path, ct, body string }{
		{"/api/v1/events", ce, ev("1") + ev("2")},
		{"/api/v1/events", ce, ev("1") + " garbage"},
		{"/api/v1/events", ce, ev("1") + "\n,"},
		{"/api/v1/events", batch, "[" + ev("1") + "][" + ev("2") + "]"},
		{"/api/v1/events", batch, "[" + ev("1") + "] garbage"},
		{"/api/v1/events", js, ev("1") + ev("2")},
		{"/api/v1/events", js, "[" + ev("1") + "]x"},
		{"/v1/events", js, ml("1") + ml("2")},
		{"/v1/events", js, ml("1") + " garbage"},
		{"/v1/events", js, "[" + ml("1") + "][]"},
		{"/v1/events", js, "[" + ml("1") + "]\x00"},
	} {
		code, _, b := e.post(c.path, c.ct, e.token, []byte(c.body))
		if code != http.StatusBadRequest || problem(t, b).Type != "urn:meterline:problem:malformed" {
			t.Errorf("%s %s %q: %d %s; want 400 malformed", c.path, c.ct, c.body, code, b)
		}
	}
	if recs := e.records(); len(recs) != 0 {
		t.Fatalf("%d records sent for refused bodies", len(recs))
	}
	for _, c := range []struct{ path, ct, body string }{
		{"/api/v1/events", ce, ev("b1") + "\n"},
		{"/api/v1/events", batch, "[" + ev("b2") + "] \r\n\t"},
		{"/v1/events", js, ml("b3") + "\n\n"},
	} {
		if code, _, b := e.post(c.path, c.ct, e.token, []byte(c.body)); code/100 != 2 {
			t.Errorf("%s %s %q: %d %s; want it taken", c.path, c.ct, c.body, code, b)
		}
	}
}
