package producer

import (
	"errors"
	"testing"
)

// TestParseJSONTrailingText: a line with anything but blanks after its
// event is refused as malformed, whatever the text begins with. The
// decoder's More says no more values before a closing bracket or brace,
// so "{…}]{…}" and "{…}}{…}" were read as their first event, the second
// lost without a word (on POST /v1/events as NDJSON too, answered 202).
func TestParseJSONTrailingText(t *testing.T) {
	a := `{"event_id":"a","customer_id":"c","meter":"m","quantity":1,"event_time":1795003200250}`
	b := `{"event_id":"b","customer_id":"c","meter":"m","quantity":1,"event_time":1795003200250}`
	for _, tail := range []string{"}", "]", "]" + b, "}" + b, " ] " + b, "\t}\t", "," + b, " x"} {
		if e, err := ParseJSON([]byte(a + tail)); !errors.Is(err, ErrMalformedJSON) {
			t.Errorf("ParseJSON(%s) = %+v, %v; want ErrMalformedJSON", a+tail, e, err)
		}
	}
	for _, tail := range []string{"", " ", "\t\r\n "} {
		if _, err := ParseJSON([]byte(a + tail)); err != nil {
			t.Errorf("ParseJSON(%q) = %v", a+tail, err)
		}
	}
}
