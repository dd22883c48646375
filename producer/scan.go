package producer

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/meterline/meterline/internal/clip"
	"github.com/meterline/meterline/schemas"
)

// scanLine scans the raw bytes of one line of the JSON format, in one
// pass and before anything is decoded (ParseJSON), and returns a
// *FieldError for the first of:
//   - a string that is not valid text: invalid UTF-8, or a \u escape of a
//     UTF-16 surrogate that is not part of a pair (named by the member
//     names on its way, "event" at the top);
//   - a member of the event named as a field in another case ("EVENT_ID",
//     which encoding/json would decode into event_id);
//   - a member of the event named twice, or a property named twice;
//   - properties of more than schemas.MaxProperties members (oversized),
//     counted without storing them;
//   - a property whose value is not a string: null (encoding/json would
//     take it for ""), a number, a boolean, an object or an array
//     (encoding/json would name only "properties").
//
// Anything that is not JSON it leaves to the decoder, which reports it:
// it stops there and returns nil. It allocates nothing for a valid line
// whose member names have no escapes.
func scanLine(b []byte) *FieldError {
	var s lineScan
	return s.run(b)
}

// eventFields are the members of an event, in the order of lineScan.seen's
// bits.
var eventFields = [...]string{"event_id", "customer_id", "meter", "quantity", "event_time", "source", "properties"}

const fieldProperties = 6

// maxScanDepth is encoding/json's nesting limit: a deeper line is left to
// the decoder, which refuses it.
const maxScanDepth = 10000

// What an object of the line is.
const (
	objOther      = iota
	objEvent      // the line's top-level object
	objProperties // the event's properties
)

// frame is an object or an array the scan is in.
type frame struct {
	object  bool
	kind    uint8 // objOther, objEvent or objProperties
	isKey   bool  // the object's next string is a member name
	escaped bool  // key has escapes
	field   int   // objEvent: the index in eventFields of the current member, or -1
	key     []byte
}

// lineScan is the state of scanLine besides its stack of frames (a local
// slice of run's, so that neither escapes to the heap).
type lineScan struct {
	seen uint8 // the event's members seen (bits of eventFields)
	// props are the names of the properties seen (decoded), up to
	// MaxProperties; nprops counts every one.
	props  [schemas.MaxProperties][]byte
	nprops int
}

func (s *lineScan) run(b []byte) *FieldError {
	var buf [16]frame
	stack := buf[:0]
	const (
		value = iota // a value is next
		after        // a value ended: a comma, or the end of its container
		name         // a member name is next
	)
	i, state := skipSpace(b, 0), value
	for {
		switch state {
		case value:
			if i >= len(b) {
				return nil
			}
			switch c := b[i]; c {
			case '{', '[':
				if len(stack) >= maxScanDepth {
					return nil
				}
				if fe := wrongProperty(stack, b[i:i+1]); fe != nil {
					return fe
				}
				f := frame{object: c == '{', isKey: c == '{', field: -1}
				if f.object {
					f.kind = childKind(stack)
				}
				stack = append(stack, f)
				state = value
				if f.object {
					state = name
				}
				if i = skipSpace(b, i+1); i < len(b) && (b[i] == '}' && f.object || b[i] == ']' && !f.object) {
					if fe := s.pop(stack[len(stack)-1]); fe != nil {
						return fe
					}
					stack = stack[:len(stack)-1]
					i, state = i+1, after
				}
			case '"':
				end, _, fe := str(b, i, stack, false)
				if end < 0 {
					return fe
				}
				i, state = end, after
			default: // a number or a literal: the decoder checks it
				start := i
				for i < len(b) && !isDelim(b[i]) {
					i++
				}
				if fe := wrongProperty(stack, b[start:i]); fe != nil {
					return fe
				}
				state = after
			}
		case after:
			if len(stack) == 0 {
				return nil // what follows the line's value is the decoder's
			}
			if i = skipSpace(b, i); i >= len(b) {
				return nil
			}
			top := &stack[len(stack)-1]
			switch c := b[i]; {
			case c == ',':
				i, state = skipSpace(b, i+1), value
				if top.object {
					top.isKey, state = true, name
				}
			case c == '}' && top.object || c == ']' && !top.object:
				if fe := s.pop(*top); fe != nil {
					return fe
				}
				stack = stack[:len(stack)-1]
				i++
			default:
				return nil
			}
		case name:
			if i >= len(b) || b[i] != '"' {
				return nil
			}
			end, escaped, fe := str(b, i, stack, true)
			if end < 0 {
				return fe
			}
			if fe := s.member(&stack[len(stack)-1], b[i+1:end-1], escaped); fe != nil {
				return fe
			}
			if i = skipSpace(b, end); i >= len(b) || b[i] != ':' {
				return nil
			}
			i, state = skipSpace(b, i+1), value
		}
	}
}

// wrongProperty refuses v, the start of a value that is not a string (a
// literal, or the "{" or "[" opening an object or an array), when it is
// the value of a property, the innermost of stack. encoding/json would
// leave null at "", a property the producer did not write; of any other
// it would name only "properties". The error names the property (its
// name's escapes decoded), in encoding/json's words. A literal that is not
// JSON is the decoder's.
func wrongProperty(stack []frame, v []byte) *FieldError {
	if len(stack) == 0 || stack[len(stack)-1].kind != objProperties {
		return nil
	}
	var kind string
	switch string(v) {
	case "null":
		kind = "null"
	case "true", "false":
		kind = "bool"
	case "{":
		kind = "object"
	case "[":
		kind = "array"
	default:
		if !json.Valid(v) {
			return nil
		}
		kind = "number"
	}
	top := &stack[len(stack)-1]
	n := top.key
	if top.escaped {
		n = unescape(n)
	}
	return fieldErr(clip.To("properties."+string(n), clip.Echo), "must be a string, not a JSON %s", kind)
}

// childKind is the kind of an object starting inside the innermost of
// stack.
func childKind(stack []frame) uint8 {
	if len(stack) == 0 {
		return objEvent
	}
	if top := &stack[len(stack)-1]; top.kind == objEvent && top.field == fieldProperties {
		return objProperties
	}
	return objOther
}

// pop checks the innermost object or array, top, at its end.
func (s *lineScan) pop(top frame) *FieldError {
	if top.kind == objProperties && s.nprops > schemas.MaxProperties {
		return &FieldError{Field: "properties", Code: schemas.ReasonOversized,
			Reason: fmt.Sprintf("%d properties, more than %d", s.nprops, schemas.MaxProperties)}
	}
	return nil
}

// member records the name lit (a string's text, quotes excluded) of the
// next member of the innermost object, top, and refuses it when the event
// or its properties already have a member of that name.
func (s *lineScan) member(top *frame, lit []byte, escaped bool) *FieldError {
	top.key, top.escaped, top.isKey = lit, escaped, false
	switch top.kind {
	case objEvent:
		n := lit
		if escaped {
			n = unescape(lit)
		}
		top.field = eventField(n)
		if top.field < 0 {
			if k := foldedField(n); k >= 0 {
				return fieldErr(clip.To(string(n), clip.Echo), "is not the field %q: field names are lowercase, and are matched exactly", eventFields[k])
			}
			return nil // not a field: the decoder refuses it
		}
		if s.seen&(1<<top.field) != 0 {
			return fieldErr(eventFields[top.field], "appears twice")
		}
		s.seen |= 1 << top.field
	case objProperties:
		if s.nprops++; s.nprops > schemas.MaxProperties {
			return nil // refused when the properties end (pop)
		}
		n := lit
		if escaped {
			n = unescape(lit)
		}
		for _, p := range s.props[:s.nprops-1] {
			if bytes.Equal(p, n) {
				return fieldErr(clip.To("properties."+string(n), clip.Echo), "appears twice")
			}
		}
		s.props[s.nprops-1] = n
	}
	return nil
}

// eventField is the index in eventFields of the field named exactly
// name; -1 for none.
func eventField(name []byte) int {
	for k, f := range eventFields {
		if string(name) == f {
			return k
		}
	}
	return -1
}

// foldedField is the index in eventFields of the field that name, not a
// field's exact name, is in another case (Unicode simple folding, as
// bytes.EqualFold); -1 for none. encoding/json would decode such a
// member into the field: ParseJSON refuses it first.
func foldedField(name []byte) int {
	for k, f := range eventFields {
		if bytes.EqualFold(name, []byte(f)) {
			return k
		}
	}
	return -1
}

// unescape decodes the text of a JSON string with escapes (quotes
// excluded), already scanned as valid text.
func unescape(lit []byte) []byte {
	var v string
	q := make([]byte, 0, len(lit)+2)
	q = append(append(append(q, '"'), lit...), '"')
	if json.Unmarshal(q, &v) != nil {
		return lit
	}
	return []byte(v)
}

// str scans the JSON string starting at b[i] == '"', inside the objects
// and arrays of stack, and returns its end (after the closing quote) and
// whether it has escapes. end is -1 when it is not valid JSON (fe nil: the
// decoder reports it) or not valid text (fe names it).
func str(b []byte, i int, stack []frame, isKey bool) (end int, escaped bool, fe *FieldError) {
	for j := i + 1; j < len(b); {
		if !stringStop[b[j]] {
			j++ // the common byte: one lookup
			continue
		}
		switch c := b[j]; {
		case c == '"':
			return j + 1, escaped, nil
		case c == '\\':
			escaped = true
			if j+1 >= len(b) {
				return -1, false, nil
			}
			switch b[j+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				j += 2
				continue
			case 'u':
			default:
				return -1, false, nil
			}
			u, ok := hex4(b[j+2:])
			if !ok {
				return -1, false, nil
			}
			if u >= 0xD800 && u < 0xE000 {
				if u < 0xDC00 && j+12 <= len(b) && b[j+6] == '\\' && b[j+7] == 'u' {
					if lo, ok := hex4(b[j+8:]); ok && lo >= 0xDC00 && lo < 0xE000 {
						j += 12 // a pair: one code point
						continue
					}
				}
				return -1, false, textErr(stack, isKey, fmt.Sprintf("is not valid text (\\u%04x at column %d is half of a UTF-16 surrogate pair)", u, j+1))
			}
			j += 6
		case c < 0x20:
			return -1, false, nil
		default: // from 0x80
			r, n := utf8.DecodeRune(b[j:])
			if r == utf8.RuneError && n == 1 {
				return -1, false, textErr(stack, isKey, fmt.Sprintf("is not valid UTF-8 (byte 0x%02x at column %d)", c, j+1))
			}
			j += n
		}
	}
	return -1, false, nil
}

// textErr is the error of a string that is not valid text, named by the
// names of the members it is in (a key: of the members its object is in).
func textErr(stack []frame, isKey bool, why string) *FieldError {
	var parts []string
	for _, f := range stack {
		if f.object && !f.isKey && len(f.key) > 0 {
			k := f.key
			if f.escaped {
				k = unescape(k)
			}
			parts = append(parts, string(k))
		}
	}
	field := "event"
	if len(parts) > 0 {
		// The names are the producer's text, as long as the line: the
		// field is clipped as a quoted value is.
		field = clip.To(strings.Join(parts, "."), clip.Echo)
	}
	if isKey {
		return fieldErr(field, "a key %s", why)
	}
	return fieldErr(field, "%s", why)
}

// stringStop holds the bytes of a JSON string that need a look: the
// quote, the backslash, the control characters and every byte from 0x80.
var stringStop = func() (t [256]bool) {
	for c := range 256 {
		t[c] = c < 0x20 || c == '"' || c == '\\' || c >= utf8.RuneSelf
	}
	return t
}()

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// isDelim reports whether c ends a number or a literal.
func isDelim(c byte) bool {
	switch c {
	case ' ', '\t', '\n', '\r', ',', ':', ']', '}', '[', '{', '"':
		return true
	}
	return false
}
