package producer

import (
	"bytes"
	"errors"
	"maps"
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzParseJSON feeds arbitrary lines to the public JSON event parser (the
// decoder of `meterline produce` and of NDJSON ingest). It must never
// panic; it fails only with a *FieldError or ErrMalformedJSON; what it
// accepts is valid UTF-8 throughout, holds U+FFFD only where the line
// wrote one (so no two byte strings become one identity), and survives a
// MarshalJSON round trip unchanged.
func FuzzParseJSON(f *testing.F) {
	for _, s := range []string{
		`{"event_id":"req-42","customer_id":"acme","meter":"api_calls","quantity":3,"event_time":"2026-11-29T12:00:00.250Z","source":"api-gateway","properties":{"model":"m1"}}`,
		`{"event_id":"r","customer_id":"c","meter":"m","quantity":0,"event_time":1795003200250}`,
		"{\"event_id\":\"e\",\"customer_id\":\"acme\xff\",\"meter\":\"m\",\"quantity\":1,\"event_time\":1795003200250}",
		`{"event_id":"e","customer_id":"acme\ud800","meter":"m","quantity":1,"event_time":1795003200250}`,
		`{"event_id":"e","customer_id":"acme\ud83d\ude00","meter":"m","quantity":1,"event_time":1795003200250,"properties":{"a\ufffd":"\\ud800"}}`,
		`{"event_id":`, `[1,2]`, `{} {}`, `"\udc00"`, `{"properties":{"a":{"b":["\ud800"]}}}`,
		`{"event_id":"a","event_id":"b","customer_id":"c","meter":"m","quantity":1,"event_time":1795003200250,"properties":{"r":"eu","\u0072":"us"}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		e, err := ParseJSON(b)
		if err != nil {
			var fe *FieldError
			if !errors.As(err, &fe) && !errors.Is(err, ErrMalformedJSON) {
				t.Fatalf("error of an unexpected class: %v", err)
			}
			return
		}
		if !utf8.Valid(b) {
			t.Fatalf("accepted a line that is not valid UTF-8: %q", b)
		}
		lineHasFFFD := bytes.Contains(b, []byte("\uFFFD")) || bytes.Contains(bytes.ToLower(b), []byte(`\ufffd`))
		texts := []string{e.EventID, e.CustomerID, e.Meter, e.Source}
		for k, v := range e.Properties {
			texts = append(texts, k, v)
		}
		for _, s := range texts {
			if !utf8.ValidString(s) {
				t.Fatalf("decoded text %q is not valid UTF-8", s)
			}
			if strings.ContainsRune(s, utf8.RuneError) && !lineHasFFFD {
				t.Fatalf("decoded text %q holds a U+FFFD the line %q does not", s, b)
			}
		}
		if y := e.EventTime.Year(); y < 1 || y > 9999 {
			return // MarshalJSON's RFC 3339 has four-digit years
		}
		again, err := e.MarshalJSON()
		if err != nil {
			t.Fatalf("MarshalJSON: %v", err)
		}
		back, err := ParseJSON(again)
		if err != nil {
			t.Fatalf("the marshalled event %s does not parse: %v", again, err)
		}
		if back.EventID != e.EventID || back.CustomerID != e.CustomerID || back.Meter != e.Meter ||
			back.Quantity != e.Quantity || back.Source != e.Source ||
			back.EventTime.UnixMilli() != e.EventTime.UnixMilli() ||
			len(back.Properties) != len(e.Properties) || (len(e.Properties) > 0 && !maps.Equal(back.Properties, e.Properties)) {
			t.Fatalf("round trip changed the event:\n%+v\n%+v", e, back)
		}
	})
}
