package ingest

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/meterline/meterline/internal/rfc3339"
	"github.com/meterline/meterline/schemas"
)

// CloudEvent is one event of OpenMeter's event API: a CloudEvents 1.0
// event in the JSON format (application/cloudevents+json), with JSON data.
type CloudEvent struct {
	ID      string
	Source  string
	Type    string
	Subject string
	// Time is when the usage happened; zero when the event has none (no
	// time attribute, or null).
	Time time.Time
	// Data is the text of the event's data, a JSON object, given as JSON
	// in data or as base64 of JSON in data_base64; "" when it has none.
	Data string
}

// ceAttrs are a CloudEvent's attributes as read from its JSON, before
// they are checked: by encoding/json (ceJSON.attrs) or by scanBatch.
type ceAttrs struct {
	has  uint16 // the attributes present and not null: hasID, ...
	attr [8]string
	// data and dataBase64 are their values' JSON text, "null" included.
	data, dataBase64 string
}

// ceJSON is the JSON shape of a CloudEvent. Pointers tell a missing or
// null attribute from an empty one. Extension attributes are allowed and
// ignored, as OpenMeter does. encoding/json matches names without regard
// to case: it decodes only objects whose names checkNames took, which
// are then the attributes' exact names, or other names.
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
	b := trimSpace(body)
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
// attributes as OpenMeter's API does (its OpenAPI schema, which its server
// checks every request against before decoding it): id, source,
// specversion (1.0), type and subject are required non-empty strings;
// time, when present and not null, is RFC 3339 ("" is not); data, when
// present and not null, is a JSON object, or data_base64 base64 of one
// (checkDataBase64); datacontenttype, when present and not null, is
// exactly application/json. Member names are checked first (checkNames):
// attributes' exactly, extensions' in lowercase a-z and 0-9. The error is
// a *fieldError naming the attribute, or the member.
func parseCloudEvent(b []byte) (CloudEvent, *fieldError) {
	if b = trimSpace(b); len(b) == 0 || b[0] != '{' {
		return CloudEvent{}, &fieldError{"event", "invalid", "is not a JSON object"}
	}
	if fe := checkNames(string(b)); fe != nil {
		return CloudEvent{}, fe
	}
	var j ceJSON
	if err := json.Unmarshal(b, &j); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field != "" {
			return CloudEvent{}, &fieldError{te.Field, "invalid", fmt.Sprintf("must be a string, not a JSON %s", te.Value)}
		}
		return CloudEvent{}, &fieldError{"event", "invalid", err.Error()}
	}
	a := j.attrs()
	return checkCloudEvent(&a)
}

// decodeBatch decodes a whole batch body (an array, valid UTF-8; text is
// the same as a string) in one pass, into as[:0] (a buffer for reuse,
// which the result may share; nil: one is made): the fast path of a valid
// request. ok is false when any element does not decode into the
// CloudEvent shape; the caller then checks each element on its own, to
// name the bad ones, or count them: ok is false, and nothing is decoded
// beyond limit events, for a batch of more than limit events.
// scanBatch reads the plain case; encoding/json the rest.
func decodeBatch(as []ceAttrs, body []byte, text string, limit int) ([]ceAttrs, bool) {
	as, ok := scanBatch(as, text, limit)
	if ok {
		return as, true
	}
	clear(as) // what the scan read holds no request's text from now on
	if len(as) > limit || countEvents(body, false) > limit {
		return as[:0], false // too many events: not decoded, the caller counts them
	}
	// A null element is no event (encoding/json would leave it one of no
	// attributes): the slow path names it.
	var js []*ceJSON
	if err := json.Unmarshal(body, &js); err != nil || slices.Contains(js, nil) || anyBadNames(text) {
		return as[:0], false
	}
	as = slices.Grow(as[:0], len(js))[:len(js)]
	for i := range js {
		as[i] = js[i].attrs()
	}
	return as, true
}

// checkNames refuses the event obj (the text of a valid JSON object) for
// its first member whose name, escapes decoded, is neither an attribute's
// nor an extension's:
//   - An attribute is named exactly as the CloudEvents spec names it, in
//     lowercase. encoding/json would take "ID" or "Subject" for id or
//     subject (it matches names without regard to case, Unicode folding
//     included), and keep the last of two spellings: an event's identity
//     would then depend on which spelling came last. The CloudEvents SDK
//     OpenMeter decodes with matches names exactly and refuses such a
//     member ("bad key: CloudEvents spec attribute MUST NOT be
//     overwritten by extension").
//   - Any other member is an extension attribute (ignored), whose name
//     must be lowercase letters a-z and digits 0-9, the spec's rule for
//     every attribute name. (The SDK takes upper case there too, and
//     lowercases it; see TestOpenMeterParity.)
//
// It also refuses a second specversion, or datacontenttype: the SDK
// refuses them ("specversion was already provided"), where encoding/json
// would keep the last without a word. (It keeps the last of the other
// attributes, id, source, type, subject and time, and so does this ingest:
// OpenMeter takes them.)
func checkNames(obj string) *fieldError {
	var seen uint16
	var fe *fieldError
	eachMember(obj, func(lit string, escaped bool, value string) bool {
		name := lit[1 : len(lit)-1]
		if escaped {
			name, _ = unquote(lit)
		}
		switch bit := ceBit(name); {
		case bit < 0:
			if fe = badName(name); fe != nil {
				return false
			}
			if fe = extensionValue(name, value); fe != nil {
				return false
			}
		case 1<<bit&(hasSpecVersion|hasDataContentType) != 0:
			if seen&(1<<bit) != 0 {
				fe = &fieldError{name, "invalid", "appears twice"}
				return false
			}
			seen |= 1 << bit
		}
		return true
	})
	return fe
}

// isExtensionName reports whether name is a valid name of an extension
// attribute: letters a-z and digits 0-9, at least one (the CloudEvents
// spec's rule for every attribute name), or A-Z, which OpenMeter's SDK
// takes in an extension's name (and lowercases): extensions are ignored,
// so their case changes nothing here.
func isExtensionName(name string) bool {
	for i := 0; i < len(name); i++ {
		if c := name[i]; (c < 'a' || c > 'z') && (c < 'A' || c > 'Z') && (c < '0' || c > '9') {
			return false
		}
	}
	return name != ""
}

// isLowerExtensionName is isExtensionName without upper case: a name
// scanBatch can ignore without asking whether encoding/json would take it
// for an attribute.
func isLowerExtensionName(name string) bool {
	for i := 0; i < len(name); i++ {
		if c := name[i]; (c < 'a' || c > 'z') && (c < '0' || c > '9') {
			return false
		}
	}
	return name != ""
}

// badName is the error of a member, not an attribute's exact name, whose
// name is an attribute's in another case (Unicode folding included) or
// not a valid extension's (checkNames), naming it (clipped); nil for a
// valid extension name.
func badName(name string) *fieldError {
	for _, a := range ceNames {
		if strings.EqualFold(name, a) {
			return &fieldError{clip(name), "invalid", fmt.Sprintf("is not the attribute %q: CloudEvents attribute names are lowercase, and are matched exactly", a)}
		}
	}
	if isExtensionName(name) {
		return nil
	}
	return &fieldError{clip(name), "invalid", "is not a valid extension attribute name: CloudEvents attribute names are letters a-z and digits 0-9"}
}

// extensionValue refuses the value (its JSON text) of the extension
// attribute name as OpenMeter's SDK refuses it (v2/types/value.go
// Validate): an extension's value is a string, a boolean or an integer
// within 32 bits (a number within them is taken, truncated); null is no
// extension. An object, an array or a number beyond 32 bits is refused,
// naming it.
func extensionValue(name, v string) *fieldError {
	switch v[0] {
	case '"', 't', 'f', 'n':
		return nil
	case '{', '[':
		return &fieldError{clip(name), "invalid", fmt.Sprintf("must not be a JSON %s: an extension attribute's value is a string, a boolean or an integer within 32 bits", dataKind(v))}
	}
	if f, err := strconv.ParseFloat(v, 64); err != nil || f > math.MaxInt32 || f < math.MinInt32 {
		return &fieldError{clip(name), "invalid", fmt.Sprintf("%s is beyond 32 bits: an extension attribute's value is a string, a boolean or an integer within 32 bits", clip(v))}
	}
	return nil
}

// anyBadNames reports whether an event of the batch text (a valid JSON
// array) has a member checkNames refuses.
func anyBadNames(text string) bool {
	i := skipSpace(text, 0)
	if i >= len(text) || text[i] != '[' {
		return false
	}
	for i = skipSpace(text, i+1); i < len(text) && text[i] != ']'; {
		end := skipValid(text, i)
		if end < 0 {
			return false
		}
		if text[i] == '{' && checkNames(text[i:end]) != nil {
			return true
		}
		if i = skipSpace(text, end); i < len(text) && text[i] == ',' {
			i = skipSpace(text, i+1)
		}
	}
	return false
}

// attrs are the attributes j holds.
func (j *ceJSON) attrs() ceAttrs {
	var a ceAttrs
	for k, v := range [...]*string{j.ID, j.Source, j.SpecVersion, j.Type, j.Subject, j.Time, j.DataContentType, j.DataSchema} {
		if v != nil {
			a.attr[k], a.has = *v, a.has|1<<k
		}
	}
	if j.Data != nil {
		a.data, a.has = string(j.Data), a.has|hasData
	}
	if j.DataBase64 != nil {
		a.dataBase64, a.has = string(j.DataBase64), a.has|hasDataBase64
	}
	return a
}

// checkCloudEvent checks a decoded CloudEvent's attributes (see
// parseCloudEvent).
func checkCloudEvent(a *ceAttrs) (CloudEvent, *fieldError) {
	var ev CloudEvent
	for _, k := range [...]int{0, 1, 2, 3, 4} { // id, source, specversion, type, subject
		switch {
		case a.has&(1<<k) == 0:
			return CloudEvent{}, &fieldError{ceNames[k], "invalid", "is missing (CloudEvents requires it; subject is the customer)"}
		case a.attr[k] == "":
			return CloudEvent{}, &fieldError{ceNames[k], "invalid", "must not be empty"}
		case schemas.IsBlank(a.attr[k]):
			// CloudEvents wants these non-empty, and its SDK reads white
			// space as empty: such an id would make one identity of
			// every event that has it (docs/design.md, Event identity
			// and keys).
			return CloudEvent{}, &fieldError{ceNames[k], "invalid", "must not be blank (white space only)"}
		}
	}
	ev.ID, ev.Source, ev.Type, ev.Subject = a.attr[0], a.attr[1], a.attr[3], a.attr[4]
	// The id becomes part of every record's identity, hashed
	// (producer.EventID), where the record's own checks no longer see it:
	// it follows the rule of identity fields here (docs/design.md, Event
	// identity and keys; CloudEvents strings hold no control characters
	// either).
	if fe := schemas.CheckText("id", ev.ID, true); fe != nil {
		return CloudEvent{}, &fieldError{fe.Field, fe.Code, fe.Reason}
	}
	if v := a.attr[2]; v != "1.0" {
		return CloudEvent{}, &fieldError{"specversion", "invalid", fmt.Sprintf("%q is not supported; want \"1.0\"", clip(v))}
	}
	if a.has&hasTime != 0 {
		// RFC 3339 as OpenMeter's schema (format date-time) wants it,
		// stricter than time.Parse.
		t, ok := rfc3339.Parse(a.attr[5])
		if !ok {
			return CloudEvent{}, &fieldError{"time", "invalid", fmt.Sprintf("%q is not RFC 3339 (like 2026-11-29T12:00:00.250Z)", clip(a.attr[5]))}
		}
		// A zero Time is an event without time, which gets the time the
		// request was received: Go's zero time written out
		// (0001-01-01T00:00:00Z) is a time before 2000, refused as the
		// producer refuses any such time, not billed as now.
		if t.IsZero() {
			return CloudEvent{}, &fieldError{"time", "invalid", fmt.Sprintf("%q is before 2000-01-01", clip(a.attr[5]))}
		}
		ev.Time = t.UTC()
	}
	// Ignored, but OpenMeter's schema wants it non-empty (minLength 1).
	if a.has&hasDataSchema != 0 && a.attr[7] == "" {
		return CloudEvent{}, &fieldError{"dataschema", "invalid", "must not be empty"}
	}
	// OpenMeter's schema takes only this type, exactly (no parameters,
	// no other case).
	if a.has&hasDataContentType != 0 && a.attr[6] != "application/json" {
		return CloudEvent{}, &fieldError{"datacontenttype", "invalid", fmt.Sprintf("%q is not supported; data must be JSON (application/json)", clip(a.attr[6]))}
	}
	if d := trimSpace(a.data); len(d) > 0 && d != "null" {
		if d[0] != '{' {
			return CloudEvent{}, &fieldError{"data", "invalid", "must be a JSON object"}
		}
		ev.Data = d
	}
	if a.has&hasDataBase64 != 0 { // null included: OpenMeter refuses it
		d, fe := checkDataBase64(trimSpace(a.dataBase64))
		if fe != nil {
			return CloudEvent{}, fe
		}
		if ev.Data != "" {
			return CloudEvent{}, &fieldError{"data_base64", "invalid", "must not be sent with data: an event carries one of them"}
		}
		ev.Data = d
	}
	if ev.Data != "" {
		if fe := duplicateMember(ev.Data); fe != nil {
			return CloudEvent{}, fe
		}
	}
	// Any other time before 2000 is refused as the producer refuses it,
	// but named as written: the producer's reason reads it as epoch
	// milliseconds (and the epoch itself as a missing time).
	if ev.Time.Before(minEventTime) && !ev.Time.IsZero() {
		return CloudEvent{}, &fieldError{"time", "invalid", fmt.Sprintf("%q is before 2000-01-01", clip(a.attr[5]))}
	}
	return ev, nil
}

// minEventTime is the earliest event time (schemas.MinEventTime).
var minEventTime = time.UnixMilli(schemas.MinEventTime)

// checkDataBase64 decodes a CloudEvent's data_base64 (its JSON text,
// trimmed) as the CloudEvents SDK OpenMeter decodes with does: a string
// (not null, which OpenMeter refuses too) of standard, padded base64
// (encoding/base64's StdEncoding, which skips line breaks). The bytes are
// checked as a request's own text is (docs/design.md, Event identity and
// keys: valid UTF-8, no half of a surrogate pair escaped) and must be JSON,
// an object as data must be (OpenMeter takes any JSON there, past its
// schema's rule for data, and fails the request at bytes that are not
// JSON); their text, trimmed, is the event's data, "" for none (no bytes,
// or null, as data null is). They are fewer than the request's, so its size
// bounds them.
func checkDataBase64(raw string) (string, *fieldError) {
	if raw[0] != '"' {
		return "", &fieldError{"data_base64", "invalid", "must be a string, not a JSON " + dataKind(raw)}
	}
	s := raw[1 : len(raw)-1]
	if strings.IndexByte(s, '\\') >= 0 {
		if err := json.Unmarshal([]byte(raw), &s); err != nil {
			return "", &fieldError{"data_base64", "invalid", "is not a JSON string: " + err.Error()}
		}
	}
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		return "", &fieldError{"data_base64", "invalid", "is not base64 (standard, padded): " + err.Error()}
	}
	if len(b) == 0 {
		return "", nil
	}
	fe := checkText(b)
	if fe == nil && hasEscape(b) {
		fe = checkEscapes(b)
	}
	if fe != nil { // "is not valid ...", of the decoded bytes
		return "", &fieldError{"data_base64", fe.Code, "does not hold " + strings.TrimPrefix(fe.Reason, "is not ")}
	}
	if !json.Valid(b) {
		return "", &fieldError{"data_base64", "invalid", "does not hold JSON: " + syntaxError(b)}
	}
	switch d := trimSpace(string(b)); {
	case d == "null":
		return "", nil
	case d[0] != '{':
		return "", &fieldError{"data_base64", "invalid", "must hold a JSON object, not a JSON " + dataKind(d)}
	default:
		return d, nil
	}
}

// dataKind names the JSON type of a JSON value's text (trimmed), for the
// reason it is refused.
func dataKind(d string) string {
	switch d[0] {
	case 'n':
		return "null"
	case '{':
		return "object"
	case '[':
		return "array"
	case '"':
		return "string"
	case 't', 'f':
		return "boolean"
	}
	return "number"
}

// trimSpace trims JSON's whitespace (space, tab, line feed, carriage
// return: RFC 8259), the only kind a JSON value's text can start or end
// with, and no other: around a body or an NDJSON line, bytes.TrimSpace
// would also take Unicode's (a no-break space, U+2028), so that a body
// that is not JSON would be read as if it were.
func trimSpace[T string | []byte](s T) T {
	i, j := 0, len(s)
	for i < j && isSpace(s[i]) {
		i++
	}
	for j > i && isSpace(s[j-1]) {
		j--
	}
	return s[i:j]
}

// fieldError is one problem with one event, before its index is known.
type fieldError struct {
	Field, Code, Reason string
}

func (e *fieldError) at(i int) EventError {
	return EventError{Index: i, Field: e.Field, Code: e.Code, Reason: e.Reason}
}
