package producer

import (
	"bytes"
	"errors"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/meterline/meterline/schemas"
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

// FuzzRecord: what the producer library accepts, dedup accepts as it was
// given: the value decodes to a UsageEvent that validates, with the
// event's fields, under the canonical key of its identity, within
// MaxEventBytes. What it refuses is a *FieldError naming a field, with a
// reason code a rejected record could carry.
func FuzzRecord(f *testing.F) {
	f.Add("req-42", "acme", "api_calls", "", "model", "m1", "", "", int64(3), int64(-60000))
	f.Add("e", "c\x00", "m", "src", "a", "b", "a\x00", "", int64(-1), int64(0))
	f.Add("e\xff", "c", "m", "", "", "", "", "", int64(0), int64(1<<62))
	f.Add(strings.Repeat("e", 300), "c", "m", "", "k", strings.Repeat("v", 70000), "", "", int64(1), int64(-1))
	p, err := New(WithClock(fixedClock), WithBrokers("127.0.0.1:1"), WithTopic("t1"), WithSource("svc"),
		WithMaxAge(40*24*time.Hour))
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(p.Close)
	codes := []string{schemas.ReasonInvalid, schemas.ReasonOversized, schemas.ReasonInFuture, schemas.ReasonTooOld}
	f.Fuzz(func(t *testing.T, id, customer, meter, source, k1, v1, k2, v2 string, qty, offsetMs int64) {
		e := Event{EventID: id, CustomerID: customer, Meter: meter, Source: source, Quantity: qty,
			EventTime: fixedClock().Add(time.Duration(offsetMs) * time.Millisecond)}
		if k1 != "" || v1 != "" || k2 != "" || v2 != "" {
			e.Properties = map[string]string{k1: v1, k2: v2}
		}
		rec, err := p.Record(e)
		if err != nil {
			var fe *FieldError
			if !errors.As(err, &fe) || fe.Field == "" || fe.Reason == "" || !slices.Contains(codes, fe.Code) {
				t.Fatalf("refused with %T %v", err, err)
			}
			return
		}
		if len(rec.Key)+len(rec.Value) > schemas.MaxEventBytes {
			t.Fatalf("accepted a record of %d bytes", len(rec.Key)+len(rec.Value))
		}
		m, err := schemas.Decode(rec.Value)
		if err != nil {
			t.Fatalf("the accepted record does not decode: %v", err)
		}
		ue, ok := m.(*schemas.UsageEvent)
		if !ok {
			t.Fatalf("the accepted record is a %s", m.Kind())
		}
		if err := ue.Validate(); err != nil {
			t.Fatalf("the accepted record does not validate: %v", err)
		}
		want := source
		if want == "" {
			want = "svc"
		}
		if ue.EventID != id || ue.CustomerID != customer || ue.Meter != meter || ue.Source != want || ue.Quantity != qty ||
			ue.EventTime != e.EventTime.UnixMilli() || !slices.Equal(ue.Properties, schemas.Properties(e.Properties)) {
			t.Fatalf("the accepted record holds %+v for %+v", ue, e)
		}
		if !bytes.Equal(rec.Key, ue.Identity().Key()) || rec.Topic != "t1" {
			t.Fatalf("key %q on %s, want %q on t1", rec.Key, rec.Topic, ue.Identity().Key())
		}
	})
}
