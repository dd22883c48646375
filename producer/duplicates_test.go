package producer

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/meterline/meterline/schemas"
)

// TestParseJSONDuplicates: a line that repeats a member name, of the event
// or of its properties, is refused naming the member (docs/design.md, Event
// identity and keys: nothing disappears silently). encoding/json kept the
// last of them, so that a producer whose serializer repeated a name was
// billed on a value it may not have meant. A name is the same member as the
// JSON decoder reads it: escapes decoded; names are matched exactly.
func TestParseJSONDuplicates(t *testing.T) {
	const rest = `"customer_id":"c","meter":"m","quantity":1,"event_time":1795003200250`
	for _, c := range []struct{ line, field, reason string }{
		{`{"event_id":"a","event_id":"b",` + rest + `}`, "event_id", "appears twice"},
		{`{"event_id":"a",` + rest + `,"event_id":"a"}`, "event_id", "appears twice"}, // the same value too
		{`{"event_id":"a",` + rest + `,"quantity":2}`, "quantity", "appears twice"},
		{`{"event_id":"a",` + rest + `,"event_time":"2026-11-29T12:00:00Z"}`, "event_time", "appears twice"},
		{`{"event_id":"a",` + rest + `,"customer_id":null}`, "customer_id", "appears twice"},
		{`{"event_id":"a",` + rest + `,"source":"x","source":"y"}`, "source", "appears twice"},
		{`{"event_id":"a",` + rest + `,"properties":{"region":"eu","region":"us"}}`, "properties.region", "appears twice"},
		{`{"event_id":"a",` + rest + `,"properties":{"region":"eu","model":"m1","region":"eu"}}`, "properties.region", "appears twice"},
		{`{"event_id":"a",` + rest + `,"properties":{"region":"eu","re\u0067ion":"us"}}`, "properties.region", "appears twice"},
		{`{"event_id":"a",` + rest + `,"properties":{"a":"1"},"properties":{"b":"2"}}`, "properties", "appears twice"},
		{`{"event_id":"a",` + rest + `,"event\u005fid":"b"}`, "event_id", "appears twice"},
		// A case variant of a field is no field (TestParseJSONExactNames).
		{`{"event_id":"a",` + rest + `,"EVENT_ID":"b"}`, "EVENT_ID", `is not the field "event_id"`},
		{"{\"event_id\":\"a\"," + rest + ",\"\u017fource\":\"x\",\"source\":\"y\"}", "\u017fource", `is not the field "source"`}, // ſ folds to s
	} {
		_, err := ParseJSON([]byte(c.line))
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != c.field || fe.Code != schemas.ReasonInvalid || !strings.HasPrefix(fe.Reason, c.reason) {
			t.Errorf("ParseJSON(%s) = %v; want an invalid error %q: %q", c.line, err, c.field, c.reason)
		}
	}
	// Not duplicates: property names that differ in case are two
	// properties, and a name repeated in another object is another member.
	for _, line := range []string{
		`{"event_id":"a",` + rest + `,"properties":{"region":"eu","Region":"us"}}`,
		`{"event_id":"a",` + rest + `,"properties":{"event_id":"x","source":"y"},"source":"z"}`,
	} {
		if _, err := ParseJSON([]byte(line)); err != nil {
			t.Errorf("ParseJSON(%s) = %v", line, err)
		}
	}
}

// manyProperties is an event line whose properties have n members.
func manyProperties(n int) []byte {
	var b strings.Builder
	b.WriteString(`{"event_id":"a","customer_id":"c","meter":"m","quantity":1,"event_time":1795003200250,"properties":{`)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `"p%d":"v"`, i)
	}
	b.WriteString("}}")
	return []byte(b.String())
}

// TestParseJSONManyPropertiesCostLittle: properties of more members than
// schemas.MaxProperties are refused while the line is scanned, before
// encoding/json builds a map of them: a line of 90,000 properties (1 MB)
// took some 180,000 allocations and 16 MB to be refused by Record.
func TestParseJSONManyPropertiesCostLittle(t *testing.T) {
	line := manyProperties(90_000)
	_, err := ParseJSON(line)
	var fe *FieldError
	want := fmt.Sprintf("90000 properties, more than %d", schemas.MaxProperties)
	if !errors.As(err, &fe) || fe.Field != "properties" || fe.Code != schemas.ReasonOversized || fe.Reason != want {
		t.Fatalf("ParseJSON = %v; want oversized properties: %s", err, want)
	}
	if n := testing.AllocsPerRun(3, func() { _, _ = ParseJSON(line) }); n > 10 {
		t.Errorf("refusing %d bytes of properties took %.0f allocations, want at most 10", len(line), n)
	}
	// At the limit the properties are decoded.
	e, err := ParseJSON(manyProperties(schemas.MaxProperties))
	if err != nil || len(e.Properties) != schemas.MaxProperties {
		t.Fatalf("%d properties: %d decoded, %v", schemas.MaxProperties, len(e.Properties), err)
	}
}

// BenchmarkParseJSONManyProperties: the cost of refusing a line of 90,000
// properties (B/op against the line's size).
func BenchmarkParseJSONManyProperties(b *testing.B) {
	line := manyProperties(90_000)
	b.SetBytes(int64(len(line)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ParseJSON(line); err == nil {
			b.Fatal("accepted")
		}
	}
}

// TestParseJSONExactNames: the event's fields are named exactly, in
// lowercase. encoding/json matches a struct's fields without regard to
// case (Unicode folding included), so a lone "EVENT_ID" was taken for
// event_id, and an event's identity could be spelled several ways; the
// HTTP ingest's CloudEvents refuse such names (checkNames) as the
// CloudEvents SDK does. A case variant is refused naming the member as
// the line spells it, wherever it stands and whether or not the field
// itself is there too.
func TestParseJSONExactNames(t *testing.T) {
	const rest = `"customer_id":"c","meter":"m","quantity":1,"event_time":1795003200250`
	for _, c := range []struct{ line, field, want string }{
		{`{"EVENT_ID":"a",` + rest + `}`, "EVENT_ID", "event_id"},
		{`{"Event_Id":"a",` + rest + `}`, "Event_Id", "event_id"},
		{`{"event_id":"a","Customer_ID":"c","meter":"m","quantity":1,"event_time":1795003200250}`, "Customer_ID", "customer_id"},
		{`{"event_id":"a",` + rest + `,"Source":"gw"}`, "Source", "source"},
		{`{"event_id":"a",` + rest + `,"PROPERTIES":{"a":"b"}}`, "PROPERTIES", "properties"},
		{`{"event_id":"a","customer_id":"c","METER":"m","quantity":1,"event_time":1795003200250}`, "METER", "meter"},
		{`{"\u0045VENT_ID":"a",` + rest + `}`, "EVENT_ID", "event_id"},                        // escapes decoded
		{"{\"\u017fource\":\"gw\",\"event_id\":\"a\"," + rest + "}", "\u017fource", "source"}, // ſ folds to s
	} {
		_, err := ParseJSON([]byte(c.line))
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != c.field || fe.Code != schemas.ReasonInvalid ||
			fe.Reason != fmt.Sprintf("is not the field %q: field names are lowercase, and are matched exactly", c.want) {
			t.Errorf("ParseJSON(%s) = %v; want an invalid error naming %q as not the field %q", c.line, err, c.field, c.want)
		}
	}
	// Property names are the producer's own: any case is a property.
	if e, err := ParseJSON([]byte(`{"event_id":"a",` + rest + `,"properties":{"EVENT_ID":"x","Region":"eu"}}`)); err != nil || e.Properties["EVENT_ID"] != "x" {
		t.Errorf("properties in upper case: %+v, %v", e, err)
	}
}
