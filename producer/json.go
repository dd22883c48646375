package producer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/meterline/meterline/internal/clip"
	"github.com/meterline/meterline/internal/rfc3339"
	"github.com/meterline/meterline/schemas"
)

// The public JSON event format, one object per line (NDJSON). The CLI uses
// it now and the HTTP ingest will reuse it:
//
//	{"event_id":"req-42","customer_id":"acme","meter":"api_calls","quantity":3,
//	 "event_time":"2026-11-29T12:00:00.250Z","source":"api-gateway",
//	 "properties":{"model":"m1"}}
//
// event_time is an RFC 3339 string or integer epoch milliseconds. source and
// properties (a string→string object) are optional; every other field is
// required, and unknown fields are an error so typos do not go unnoticed.

// ErrMalformedJSON is wrapped by ParseJSON errors for input that is not a
// JSON object.
var ErrMalformedJSON = errors.New("malformed JSON")

type jsonEvent struct {
	EventID    *string           `json:"event_id"`
	CustomerID *string           `json:"customer_id"`
	Meter      *string           `json:"meter"`
	Quantity   json.RawMessage   `json:"quantity"`
	EventTime  json.RawMessage   `json:"event_time"`
	Source     string            `json:"source"`
	Properties map[string]string `json:"properties"`
}

// ParseJSON parses one event in the public JSON format. It checks the
// format only (required fields present, types right); Producer.Record
// checks the values. Errors are *FieldError naming the field, or wrap
// ErrMalformedJSON. A value an error quotes, and a field it names by the
// line's own member names, is clipped to its first 64 bytes (cut at the
// start of a character, then "…").
//
// The line's raw bytes are scanned before it is decoded (scanLine), for
// what encoding/json would hide (docs/design.md, Bad input):
//   - text: it would turn invalid UTF-8, and an unpaired UTF-16 surrogate
//     escape such as \ud800, into U+FFFD, so that "acme\xff" and
//     "acme\xfe" became one customer and the second event a copy of the
//     first. Such a string is an error naming its field.
//   - a repeated member name, of the event or of its properties: it would
//     keep the last one, and the producer be billed on a value it may not
//     have meant. The error names the member ("properties.region: appears
//     twice"). Names are compared with their escapes decoded.
//   - a member named as one of the event's fields in another case
//     ("EVENT_ID"): encoding/json matches names without regard to case
//     and would decode it into the field. Fields are named exactly, as
//     the HTTP ingest matches CloudEvent attributes; the error names the
//     member as the line spells it ("EVENT_ID: is not the field
//     \"event_id\"").
//   - properties of more than schemas.MaxProperties members are refused
//     (oversized, as Producer.Record would) before they are decoded, so
//     that refusing a line costs about its size in memory, not a map of
//     every member.
//   - a property whose value is not a string: it would decode null as "",
//     a value the producer did not write, and name a property of any
//     other type only "properties". The error names the property
//     ("properties.model: must be a string, not a JSON number").
func ParseJSON(b []byte) (Event, error) {
	if fe := scanLine(b); fe != nil {
		return Event{}, fe
	}
	// encoding/json would decode null as an event of no fields ("event_id
	// is missing").
	if string(bytes.TrimSpace(b)) == "null" {
		return Event{}, fmt.Errorf("%w: an event is a JSON object, not null", ErrMalformedJSON)
	}
	var j jsonEvent
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&j); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field != "" {
			return Event{}, fieldErr(te.Field, "must be %s, not a JSON %s", jsonType(te.Type.String()), te.Value)
		}
		if te != nil {
			// Not encoding/json's text, which names the Go type the
			// event would have been decoded into.
			return Event{}, fmt.Errorf("%w: an event is a JSON object, not a JSON %s", ErrMalformedJSON, te.Value)
		}
		if msg := err.Error(); strings.HasPrefix(msg, "json: unknown field ") {
			name, _ := strconv.Unquote(strings.TrimPrefix(msg, "json: unknown field "))
			return Event{}, fieldErr(clip.To(name, clip.Echo), "is not a known field")
		}
		return Event{}, fmt.Errorf("%w: %v", ErrMalformedJSON, err)
	}
	if dec.More() {
		return Event{}, fmt.Errorf("%w: more than one value on the line", ErrMalformedJSON)
	}
	// More says no before a closing bracket or brace: "{…}]{…}" would be
	// read as its first event and the rest of the line lost.
	if rest := bytes.TrimLeft(b[dec.InputOffset():], " \t\r\n"); len(rest) > 0 {
		return Event{}, fmt.Errorf("%w: %q after the event: one event a line", ErrMalformedJSON, clip.To(string(rest), clip.Echo))
	}
	var e Event
	switch {
	case j.EventID == nil:
		return Event{}, fieldErr("event_id", "is missing")
	case j.CustomerID == nil:
		return Event{}, fieldErr("customer_id", "is missing")
	case j.Meter == nil:
		return Event{}, fieldErr("meter", "is missing")
	}
	e.EventID, e.CustomerID, e.Meter = *j.EventID, *j.CustomerID, *j.Meter
	q, err := parseQuantity(j.Quantity)
	if err != nil {
		return Event{}, err
	}
	e.Quantity = q
	t, err := parseEventTime(j.EventTime)
	if err != nil {
		return Event{}, err
	}
	e.EventTime = t
	e.Source = j.Source
	e.Properties = j.Properties
	return e, nil
}

func fieldErr(field, format string, args ...any) *FieldError {
	return &FieldError{Field: field, Code: schemas.ReasonInvalid, Reason: fmt.Sprintf(format, args...)}
}

func jsonType(goType string) string {
	switch goType {
	case "string", "*string":
		return "a string"
	case "map[string]string":
		return "an object of strings"
	}
	return goType
}

func parseQuantity(raw json.RawMessage) (int64, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return 0, fieldErr("quantity", "is missing")
	}
	q, err := strconv.ParseInt(string(raw), 10, 64)
	if err != nil {
		var ne *strconv.NumError
		if errors.As(err, &ne) && errors.Is(ne.Err, strconv.ErrRange) {
			return 0, fieldErr("quantity", "%s is out of the 64-bit range", clip.To(string(raw), clip.Echo))
		}
		return 0, fieldErr("quantity", "must be an integer (got %s)", clip.To(string(raw), clip.Echo))
	}
	return q, nil
}

func parseEventTime(raw json.RawMessage) (time.Time, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return time.Time{}, fieldErr("event_time", "is missing")
	}
	if raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return time.Time{}, fieldErr("event_time", "is not a valid string")
		}
		// RFC 3339 (docs/producing.md, as the HTTP ingest's CloudEvent
		// time), stricter than time.Parse.
		t, ok := rfc3339.Parse(s)
		if !ok {
			return time.Time{}, fieldErr("event_time", "%q is not RFC 3339 (like 2026-11-29T12:00:00.250Z)", clip.To(s, clip.Echo))
		}
		return t.UTC(), nil
	}
	ms, err := strconv.ParseInt(string(raw), 10, 64)
	if err != nil {
		return time.Time{}, fieldErr("event_time", "must be an RFC 3339 string or integer epoch milliseconds (got %s)", clip.To(string(raw), clip.Echo))
	}
	return time.UnixMilli(ms).UTC(), nil
}

// MarshalJSON writes the event in the public JSON format, event_time as
// RFC 3339 with milliseconds.
func (e Event) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		EventID    string            `json:"event_id"`
		CustomerID string            `json:"customer_id"`
		Meter      string            `json:"meter"`
		Quantity   int64             `json:"quantity"`
		EventTime  string            `json:"event_time"`
		Source     string            `json:"source,omitempty"`
		Properties map[string]string `json:"properties,omitempty"`
	}{e.EventID, e.CustomerID, e.Meter, e.Quantity, e.EventTime.UTC().Format("2006-01-02T15:04:05.000Z07:00"), e.Source, e.Properties})
}

// hex4 parses four hex digits.
func hex4(b []byte) (rune, bool) {
	if len(b) < 4 {
		return 0, false
	}
	var r rune
	for _, c := range b[:4] {
		switch {
		case c >= '0' && c <= '9':
			r = r<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	return r, true
}
