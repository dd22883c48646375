package producer

import (
	"errors"
	"testing"
)

// TestParseJSONNullProperty: a property whose value is null is refused
// naming it, as one whose value is a number is. encoding/json leaves a
// null map value at the zero string: the event was sent with the
// property "" its producer did not write, and grouped and counted by it.
func TestParseJSONNullProperty(t *testing.T) {
	for line, field := range map[string]string{
		`{"event_id":"e","customer_id":"c","meter":"m","quantity":1,"event_time":1795003200250,"properties":{"region":null}}`:              "properties.region",
		`{"event_id":"e","customer_id":"c","meter":"m","quantity":1,"event_time":1795003200250,"properties":{"a":"x","re\u0067ion":null}}`: "properties.region",
		`{"event_id":"e","customer_id":"c","meter":"m","quantity":1,"event_time":1795003200250,"properties":{"region": null }}`:            "properties.region",
	} {
		e, err := ParseJSON([]byte(line))
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != field || fe.Reason != "must be a string, not a JSON null" {
			t.Errorf("ParseJSON(%s) = %+v, %v; want an error naming %s", line, e.Properties, err, field)
		}
	}
	// Where null is the same as absent: the optional source and properties.
	for _, line := range []string{
		`{"event_id":"e","customer_id":"c","meter":"m","quantity":1,"event_time":1795003200250,"properties":null}`,
		`{"event_id":"e","customer_id":"c","meter":"m","quantity":1,"event_time":1795003200250,"source":null}`,
		`{"event_id":"e","customer_id":"c","meter":"m","quantity":1,"event_time":1795003200250,"properties":{"n":"null"}}`,
	} {
		if _, err := ParseJSON([]byte(line)); err != nil {
			t.Errorf("ParseJSON(%s) = %v", line, err)
		}
	}
}
