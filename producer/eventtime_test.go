package producer

import (
	"errors"
	"testing"
	"time"

	"github.com/meterline/meterline/schemas"
)

// TestParseJSONEventTimeDecimalComma: event_time is RFC 3339, whose
// fraction of a second follows a full stop and whose hour has two digits
// (docs/producing.md); Go's time.Parse also takes a comma there, and an
// hour of one digit, which ParseJSON refuses as not RFC 3339, as the HTTP
// ingest refuses a CloudEvent's time with one (docs/ingest.md).
func TestParseJSONEventTimeDecimalComma(t *testing.T) {
	const rest = `{"event_id":"a","customer_id":"c","meter":"m","quantity":1,"event_time":`
	for _, v := range []string{`"2026-11-29T12:00:00,5Z"`, `"2026-11-29T12:00:00,250+01:00"`, `"2026-11-29T12:00:00,Z"`, `"2026-11-29T1:00:00Z"`, `"2026-11-29T1:00:00.5+01:00"`} {
		_, err := ParseJSON([]byte(rest + v + `}`))
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != "event_time" || fe.Code != schemas.ReasonInvalid || fe.Reason != v+" is not RFC 3339 (like 2026-11-29T12:00:00.250Z)" {
			t.Errorf("event_time %s: %v; want an invalid error naming event_time", v, err)
		}
	}
	e, err := ParseJSON([]byte(rest + `"2026-11-29T12:00:00.5Z"}`))
	if err != nil {
		t.Fatal(err)
	}
	if want := time.Date(2026, 11, 29, 12, 0, 0, 5e8, time.UTC); !e.EventTime.Equal(want) {
		t.Errorf("event_time %v, want %v", e.EventTime, want)
	}
}
