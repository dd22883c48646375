package ingest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// CloudEvent is one event of OpenMeter's event API: a CloudEvents 1.0
// event in the JSON format (application/cloudevents+json), with JSON data.
type CloudEvent struct {
	ID      string
	Source  string
	Type    string
	Subject string
	// Time is when the usage happened; zero when the event has none.
	Time time.Time
	// Data is the event's data: a JSON object, or nil.
	Data json.RawMessage
}

// ceJSON is the JSON shape of a CloudEvent. Pointers tell a missing or
// null attribute from an empty one. Extension attributes are allowed and
// ignored, as OpenMeter does.
type ceJSON struct {
	ID              *string         `json:"id"`
	Source          *string         `json:"source"`
	SpecVersion     *string         `json:"specversion"`
	Type            *string         `json:"type"`
	Subject         *string         `json:"subject"`
	Time            *string         `json:"time"`
	DataContentType *string         `json:"datacontenttype"`
	DataSchema      *string         `json:"dataschema"`
	Data            json.RawMessage `json:"data"`
	DataBase64      json.RawMessage `json:"data_base64"`
}

// errMalformed is wrapped by splitJSON's errors: the body is not JSON of
// the expected shape.
var errMalformed = errors.New("malformed JSON")

// splitJSON splits a JSON body that is one object or an array of objects
// into its objects' raw bytes; single reports a lone object. Elements are
// not decoded: each is checked on its own, so that one bad event is named
// by its index.
func splitJSON(body []byte) (elems []json.RawMessage, single bool, err error) {
	b := bytes.TrimSpace(body)
	if len(b) == 0 {
		return nil, false, fmt.Errorf("%w: the body is empty", errMalformed)
	}
	switch b[0] {
	case '{':
		if !json.Valid(b) {
			return nil, true, fmt.Errorf("%w: %s", errMalformed, syntaxError(b))
		}
		return []json.RawMessage{b}, true, nil
	case '[':
		if err := json.Unmarshal(b, &elems); err != nil {
			return nil, false, fmt.Errorf("%w: %s", errMalformed, syntaxError(b))
		}
		return elems, false, nil
	}
	return nil, false, fmt.Errorf("%w: want a JSON object or an array of objects, the body starts with %q", errMalformed, firstRune(b))
}

// syntaxError describes why b is not valid JSON, with the byte offset.
func syntaxError(b []byte) string {
	var v any
	err := json.Unmarshal(b, &v)
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return fmt.Sprintf("%v (at byte %d)", se, se.Offset)
	}
	if err != nil {
		return err.Error()
	}
	return "not JSON of the expected shape"
}

func firstRune(b []byte) string {
	r := []rune(string(b[:min(len(b), 4)]))
	if len(r) == 0 {
		return ""
	}
	return string(r[0])
}

// parseCloudEvent decodes one CloudEvent in the JSON format and checks its
// attributes as OpenMeter's API does: id, source, specversion (1.0), type
// and subject are required non-empty strings; time, when present, is RFC
// 3339; data, when present, is a JSON object (or null), and
// datacontenttype, when present, application/json. The error is a
// *fieldError naming the attribute.
func parseCloudEvent(b []byte) (CloudEvent, *fieldError) {
	if b = bytes.TrimSpace(b); len(b) == 0 || b[0] != '{' {
		return CloudEvent{}, &fieldError{"event", "invalid", "is not a JSON object"}
	}
	var j ceJSON
	if err := json.Unmarshal(b, &j); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field != "" {
			return CloudEvent{}, &fieldError{te.Field, "invalid", fmt.Sprintf("must be a string, not a JSON %s", te.Value)}
		}
		return CloudEvent{}, &fieldError{"event", "invalid", err.Error()}
	}
	return checkCloudEvent(&j)
}

// decodeBatch decodes a whole batch body (an array) in one pass: the fast
// path of a valid request. ok is false when any element does not decode
// into the CloudEvent shape; the caller then checks each element on its
// own, to name the bad ones.
func decodeBatch(body []byte) ([]ceJSON, bool) {
	var js []ceJSON
	if err := json.Unmarshal(body, &js); err != nil {
		return nil, false
	}
	return js, true
}

// checkCloudEvent checks a decoded CloudEvent's attributes (see
// parseCloudEvent).
func checkCloudEvent(j *ceJSON) (CloudEvent, *fieldError) {
	var ev CloudEvent
	for _, a := range [...]struct {
		name string
		v    *string
		dst  *string
	}{{"id", j.ID, &ev.ID}, {"source", j.Source, &ev.Source}, {"specversion", j.SpecVersion, nil},
		{"type", j.Type, &ev.Type}, {"subject", j.Subject, &ev.Subject}} {
		switch {
		case a.v == nil:
			return CloudEvent{}, &fieldError{a.name, "invalid", "is missing (CloudEvents requires it; subject is the customer)"}
		case *a.v == "":
			return CloudEvent{}, &fieldError{a.name, "invalid", "must not be empty"}
		case a.dst != nil:
			*a.dst = *a.v
		}
	}
	if *j.SpecVersion != "1.0" {
		return CloudEvent{}, &fieldError{"specversion", "invalid", fmt.Sprintf("%q is not supported; want \"1.0\"", *j.SpecVersion)}
	}
	if j.Time != nil {
		t, err := time.Parse(time.RFC3339Nano, *j.Time)
		if err != nil {
			return CloudEvent{}, &fieldError{"time", "invalid", fmt.Sprintf("%q is not RFC 3339 (like 2026-11-29T12:00:00.250Z)", *j.Time)}
		}
		ev.Time = t.UTC()
	}
	if j.DataContentType != nil && *j.DataContentType != "application/json" {
		return CloudEvent{}, &fieldError{"datacontenttype", "invalid", fmt.Sprintf("%q is not supported; data must be JSON (application/json)", *j.DataContentType)}
	}
	if len(j.DataBase64) > 0 && !bytes.Equal(j.DataBase64, []byte("null")) {
		return CloudEvent{}, &fieldError{"data_base64", "invalid", "is not supported; data must be a JSON object"}
	}
	if d := bytes.TrimSpace(j.Data); len(d) > 0 && !bytes.Equal(d, []byte("null")) {
		if d[0] != '{' {
			return CloudEvent{}, &fieldError{"data", "invalid", "must be a JSON object"}
		}
		ev.Data = d
	}
	return ev, nil
}

// fieldError is one problem with one event, before its index is known.
type fieldError struct {
	Field, Code, Reason string
}

func (e *fieldError) at(i int) EventError {
	return EventError{Index: i, Field: e.Field, Code: e.Code, Reason: e.Reason}
}
