package ingest

import (
	"encoding/json"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// The fast paths of a request's JSON, which take the plain case and say
// "not mine" for anything else:
//
//   - scanBatch reads a batch of CloudEvents in one pass over its text, as
//     encoding/json would decode it into []ceJSON, without reflection and
//     with every string a substring of the request's text. Anything it does
//     not take (an escape in a name or an attribute, a name that is neither
//     an attribute's nor an extension's, a duplicate attribute, a value of a
//     wrong type, invalid JSON) sends the request to encoding/json and
//     checkNames, which answer as they always did.
//   - dataView finds the value a simple path ($.a.b, $['a'], $.a[0]) selects
//     in an event's data by walking its text, instead of decoding the data
//     into maps and slices for a JSONPath evaluation.
//
// TestRequestsGolden holds the answers and records to those of the ingest
// before these paths; FuzzScanBatch and FuzzDataView compare them with
// encoding/json and the JSONPath evaluation on arbitrary input.

// maxScanDepth bounds the nesting the scanner follows; deeper values are
// left to encoding/json (whose own limit is 10000).
const maxScanDepth = 512

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

func skipSpace(s string, i int) int {
	for i < len(s) && isSpace(s[i]) {
		i++
	}
	return i
}

// scanString returns the end (after the closing quote) of the JSON string
// starting at s[i] == '"', and whether it has escapes; end is -1 when it is
// not a valid JSON string. Bytes from 0x80 are not checked: callers scan
// text already known to be valid UTF-8.
func scanString(s string, i int) (end int, escaped bool) {
	for i++; i < len(s); i++ {
		c := s[i]
		if !stringStop[c] {
			continue // the common byte: one lookup
		}
		switch {
		case c == '"':
			return i + 1, escaped
		case c < 0x20:
			return -1, false
		}
		// c == '\\'
		escaped = true
		if i+1 >= len(s) {
			return -1, false
		}
		i++
		switch s[i] {
		case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
		case 'u':
			if i+4 >= len(s) || !isHex(s[i+1]) || !isHex(s[i+2]) || !isHex(s[i+3]) || !isHex(s[i+4]) {
				return -1, false
			}
			i += 4
		default:
			return -1, false
		}
	}
	return -1, false
}

// stringStop holds the bytes that end a plain run of a JSON string's
// text: the quote, the backslash and the control characters.
var stringStop = func() (t [256]bool) {
	for c := range 0x20 {
		t[c] = true
	}
	t['"'], t['\\'] = true, true
	return t
}()

func isHex(c byte) bool { return isDigit(c) || (c|0x20) >= 'a' && (c|0x20) <= 'f' }

// scanNumber returns the end of the JSON number starting at s[i], or -1.
func scanNumber(s string, i int) int {
	if i < len(s) && s[i] == '-' {
		i++
	}
	switch {
	case i >= len(s):
		return -1
	case s[i] == '0':
		i++
	case s[i] >= '1' && s[i] <= '9':
		for i < len(s) && isDigit(s[i]) {
			i++
		}
	default:
		return -1
	}
	if i < len(s) && s[i] == '.' {
		i++
		if i >= len(s) || !isDigit(s[i]) {
			return -1
		}
		for i < len(s) && isDigit(s[i]) {
			i++
		}
	}
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			i++
		}
		if i >= len(s) || !isDigit(s[i]) {
			return -1
		}
		for i < len(s) && isDigit(s[i]) {
			i++
		}
	}
	return i
}

// skipValue returns the end of the JSON value starting at s[i], checking
// its syntax, or -1 when it is not valid JSON (or nests deeper than
// maxScanDepth).
func skipValue(s string, i, depth int) int {
	if i >= len(s) {
		return -1
	}
	switch c := s[i]; c {
	case '"':
		end, _ := scanString(s, i)
		return end
	case '{', '[':
		if depth >= maxScanDepth {
			return -1
		}
		closing := byte('}')
		if c == '[' {
			closing = ']'
		}
		i = skipSpace(s, i+1)
		if i < len(s) && s[i] == closing {
			return i + 1
		}
		for {
			if c == '{' {
				if i >= len(s) || s[i] != '"' {
					return -1
				}
				if i, _ = scanString(s, i); i < 0 {
					return -1
				}
				if i = skipSpace(s, i); i >= len(s) || s[i] != ':' {
					return -1
				}
				i = skipSpace(s, i+1)
			}
			if i = skipValue(s, i, depth+1); i < 0 {
				return -1
			}
			i = skipSpace(s, i)
			switch {
			case i >= len(s):
				return -1
			case s[i] == closing:
				return i + 1
			case s[i] != ',':
				return -1
			}
			i = skipSpace(s, i+1)
		}
	case 't':
		return literal(s, i, "true")
	case 'f':
		return literal(s, i, "false")
	case 'n':
		return literal(s, i, "null")
	}
	return scanNumber(s, i)
}

func literal(s string, i int, lit string) int {
	if len(s)-i >= len(lit) && s[i:i+len(lit)] == lit {
		return i + len(lit)
	}
	return -1
}

// The attributes of a CloudEvent, as bits of ceAttrs.has.
const (
	hasID = 1 << iota
	hasSource
	hasSpecVersion
	hasType
	hasSubject
	hasTime
	hasDataContentType
	hasDataSchema
	hasData
	hasDataBase64
)

// ceNames are the JSON names of the attributes, in the order of the bits.
var ceNames = [...]string{"id", "source", "specversion", "type", "subject", "time", "datacontenttype", "dataschema", "data", "data_base64"}

// ceBit is the index in ceNames of an attribute's name; -1 for another
// name. (A switch, which the compiler makes a search by length and
// content, costs less than comparing with each name in turn.)
func ceBit(name string) int {
	switch name {
	case "id":
		return 0
	case "source":
		return 1
	case "specversion":
		return 2
	case "type":
		return 3
	case "subject":
		return 4
	case "time":
		return 5
	case "datacontenttype":
		return 6
	case "dataschema":
		return 7
	case "data":
		return 8
	case "data_base64":
		return 9
	}
	return -1
}

// scanBatch reads the text s of a batch (a JSON array of CloudEvent
// objects; s is valid UTF-8) into the attributes of its events, as
// decodeBatch would, appended to evs[:0] (a buffer for reuse; nil: one is
// made). ok is false for anything but the plain case (see the file
// comment), and for a batch of more than limit events: the caller then
// decodes with encoding/json, which gives the same events or the same
// error; the slice returned then holds what was read, for reuse only.
func scanBatch(evs []ceAttrs, s string, limit int) (_ []ceAttrs, ok bool) {
	evs = evs[:0]
	i := skipSpace(s, 0)
	if i >= len(s) || s[i] != '[' {
		return evs, false
	}
	i = skipSpace(s, i+1)
	if i < len(s) && s[i] == ']' {
		return evs, false // empty: the slow path names the problem
	}
	if evs == nil {
		evs = make([]ceAttrs, 0, min(len(s)/128+1, DefaultMaxEvents))
	}
	for {
		if len(evs) == limit {
			return evs, false // more events than a request may carry
		}
		evs = append(evs, ceAttrs{})
		if i = scanCloudEvent(s, i, &evs[len(evs)-1]); i < 0 {
			return evs, false
		}
		i = skipSpace(s, i)
		switch {
		case i >= len(s):
			return evs, false
		case s[i] == ']':
			if skipSpace(s, i+1) != len(s) {
				return evs, false
			}
			return evs, true
		case s[i] != ',':
			return evs, false
		}
		i = skipSpace(s, i+1)
	}
}

// scanCloudEvent reads the object at s[i] into a and returns its end, or
// -1 when it is not the plain case.
func scanCloudEvent(s string, i int, a *ceAttrs) int {
	if i >= len(s) || s[i] != '{' {
		return -1
	}
	i = skipSpace(s, i+1)
	if i < len(s) && s[i] == '}' {
		return i + 1
	}
	// seen: the attributes named so far, null ones included (a.has holds
	// only those with a value), so that any attribute named twice leaves
	// the event to the slow path.
	var seen uint16
	for {
		if i >= len(s) || s[i] != '"' {
			return -1
		}
		end, escaped := scanString(s, i)
		if end < 0 || escaped {
			return -1
		}
		name := s[i+1 : end-1]
		if i = skipSpace(s, end); i >= len(s) || s[i] != ':' {
			return -1
		}
		i = skipSpace(s, i+1)
		bit := ceBit(name)
		if bit < 0 {
			// An extension attribute, ignored. A name that is not a
			// lowercase extension's ("ID", "my_ext", "Foo") is the slow
			// path's: checkNames refuses it, naming it, or takes it.
			if !isLowerExtensionName(name) {
				return -1
			}
			start := i
			if i = skipValue(s, i, 1); i < 0 || extensionValue(name, s[start:i]) != nil {
				return -1
			}
		} else {
			if seen&(1<<bit) != 0 {
				// A duplicate, null or not: encoding/json's last-wins, and
				// checkNames's refusal of a second specversion or
				// datacontenttype, are the slow path's business.
				return -1
			}
			seen |= 1 << bit
			start := i
			if i = skipValue(s, i, 1); i < 0 {
				return -1
			}
			v := s[start:i]
			switch {
			case 1<<bit == hasData:
				a.data, a.has = v, a.has|hasData
			case 1<<bit == hasDataBase64:
				a.dataBase64, a.has = v, a.has|hasDataBase64
			case v == "null":
				// A null attribute is a missing one, as a nil *string.
			case v[0] != '"' || indexByte(v, '\\') >= 0:
				return -1 // another type (encoding/json names it), or escapes
			default:
				a.attr[bit], a.has = v[1:len(v)-1], a.has|1<<bit
			}
		}
		i = skipSpace(s, i)
		switch {
		case i >= len(s):
			return -1
		case s[i] == '}':
			return i + 1
		case s[i] != ',':
			return -1
		}
		i = skipSpace(s, i+1)
	}
}

func indexByte(s string, c byte) int {
	for i := 0; i < len(s); i++ {
		if s[i] == c {
			return i
		}
	}
	return -1
}

// dataView is an event's data (a JSON object's text, valid JSON: the
// data of a CloudEvent that passed checkCloudEvent) for the lookups of
// simple paths. Its top-level members are listed once per event, on the
// first lookup, when they are at most maxIndexed; the data of more is
// walked again by each lookup instead, so that neither the memory of a
// lookup nor its allocations grow with the data's members. A request
// reuses one dataView for all its events.
type dataView struct {
	text    string
	indexed bool
	bad     bool // the text did not scan: lookups fall back to decoding
	all     bool // members lists every member of the data
	members []member
}

// maxIndexed bounds the members a dataView lists: far more than the data
// of an event usually has.
const maxIndexed = 64

// member is one member of an object: its name (unescaped) and its value's
// text.
type member struct{ name, value string }

func (d *dataView) reset(text string) {
	d.text, d.indexed, d.bad, d.all, d.members = text, false, false, false, d.members[:0]
}

// lookup returns the value that the path of steps selects, as a JSONPath
// evaluation over the decoded data would (encoding/json keeps the last of
// duplicate names). ok is false when the text does not scan; the caller
// then evaluates the path on the decoded data.
func (d *dataView) lookup(steps []pathStep) (v jvalue, ok bool) {
	if d.text == "" {
		return jvalue{}, true // no data: nothing is selected
	}
	if !d.indexed {
		d.indexed = true
		var ok bool
		d.members, d.all, ok = appendMembers(d.members[:0], d.text, maxIndexed)
		d.bad = !ok
	}
	if d.bad {
		return jvalue{}, false
	}
	if len(steps) == 0 {
		return toJValue(d.text)
	}
	if steps[0].isIndex {
		return jvalue{}, true // the data is an object: an index selects nothing
	}
	text, found := "", false
	if d.all {
		for k := len(d.members) - 1; k >= 0; k-- {
			if d.members[k].name == steps[0].name {
				text, found = d.members[k].value, true
				break
			}
		}
	} else if text, found, ok = lastMember(d.text, steps[0].name); !ok {
		return jvalue{}, false
	}
	ok = true
	for _, st := range steps[1:] {
		if !found {
			break
		}
		switch {
		case st.isIndex && text[0] == '[':
			text, found, ok = element(text, st.index)
		case !st.isIndex && text[0] == '{':
			text, found, ok = lastMember(text, st.name)
		default:
			found = false // a name selects nothing in an array or a scalar, an index nothing in an object or a scalar
		}
		if !ok {
			return jvalue{}, false
		}
	}
	if !found {
		return jvalue{}, true
	}
	return toJValue(text)
}

// element returns the value of element i of the array text arr (valid
// JSON), counted from the end when i is negative. It allocates nothing.
func element(arr string, i int) (value string, found, ok bool) {
	if i < 0 {
		n := 0
		if ok = eachElement(arr, func(string) bool { n++; return true }); !ok {
			return "", false, false
		}
		if i += n; i < 0 {
			return "", false, true
		}
	}
	k := 0
	ok = eachElement(arr, func(v string) bool {
		if k == i {
			value, found = v, true
			return false
		}
		k++
		return true
	})
	return value, found, ok
}

// eachElement calls fn with the text of each element of the array text
// arr (valid JSON); fn returns false to stop. ok is false when arr does
// not scan as one JSON array.
func eachElement(arr string, fn func(value string) bool) bool {
	i := skipSpace(arr, 0)
	if i >= len(arr) || arr[i] != '[' {
		return false
	}
	if i = skipSpace(arr, i+1); i < len(arr) && arr[i] == ']' {
		return skipSpace(arr, i+1) == len(arr)
	}
	for {
		start := i
		if i = skipValid(arr, i); i < 0 {
			return false
		}
		if !fn(arr[start:i]) {
			return true
		}
		var last bool
		if i, last = nextItem(arr, i, ']'); last {
			return i == len(arr)
		}
	}
}

// appendMembers appends the members of the object text obj, names
// unescaped, unless it has more than most: all reports whether every one
// was appended.
func appendMembers(ms []member, obj string, most int) (_ []member, all, ok bool) {
	all = true
	ok = eachMember(obj, func(lit string, escaped bool, value string) bool {
		if len(ms) == most {
			all = false
			return false
		}
		name := lit[1 : len(lit)-1]
		if escaped {
			var ok bool
			if name, ok = unquote(lit); !ok {
				all = false
				return false // lookups walk the text, and find it does not scan
			}
		}
		ms = append(ms, member{name, value})
		return true
	})
	return ms, all, ok
}

// lastMember returns the value of the last member called name in the
// object text obj. It allocates nothing, escaped names included.
func lastMember(obj, name string) (value string, found, ok bool) {
	ok = eachMember(obj, func(lit string, escaped bool, v string) bool {
		if n := lit[1 : len(lit)-1]; n == name || escaped && unescapedIs(n, name) {
			value, found = v, true
		}
		return true
	})
	return value, found, ok
}

// eachMember calls fn with each member of the object text obj (valid
// JSON): its name's literal, quotes included, whether that has escapes,
// and its value's text; fn returns false to stop. ok is false when obj
// does not scan as one JSON object.
func eachMember(obj string, fn func(lit string, escaped bool, value string) bool) bool {
	i := skipSpace(obj, 0)
	if i >= len(obj) || obj[i] != '{' {
		return false
	}
	i = skipSpace(obj, i+1)
	if i < len(obj) && obj[i] == '}' {
		return skipSpace(obj, i+1) == len(obj)
	}
	for {
		if i >= len(obj) || obj[i] != '"' {
			return false
		}
		end, escaped := scanString(obj, i)
		if end < 0 {
			return false
		}
		lit := obj[i:end]
		if i = skipSpace(obj, end); i >= len(obj) || obj[i] != ':' {
			return false
		}
		i = skipSpace(obj, i+1)
		start := i
		if i = skipValid(obj, i); i < 0 {
			return false
		}
		if !fn(lit, escaped, obj[start:i]) {
			return true
		}
		var last bool
		if i, last = nextItem(obj, i, '}'); last {
			return i == len(obj)
		}
	}
}

// nextItem moves past what follows a member or an element ending at s[i]
// of the object or array that closing ends (the whole of s): the blanks
// and a comma, to where the next one starts (last false); or, at its end
// (last true), to where the text after it starts, len(s) when that is
// blanks only, -1 when the text does not scan.
func nextItem(s string, i int, closing byte) (next int, last bool) {
	i = skipSpace(s, i)
	switch {
	case i >= len(s) || s[i] != ',' && s[i] != closing:
		return -1, true
	case s[i] == closing:
		return skipSpace(s, i+1), true
	}
	return skipSpace(s, i+1), false
}

// skipValid returns the end of the JSON value starting at s[i], in text
// known to be valid JSON (a dataView's). It follows an object's or an
// array's brackets in one loop, without recursion, so that a value nested
// however deep is skipped as any other, not left to a decode of the whole
// data (some 60 times its size in memory).
func skipValid(s string, i int) int {
	if i >= len(s) {
		return -1
	}
	if c := s[i]; c != '{' && c != '[' {
		return skipValue(s, i, 0) // a scalar
	}
	depth := 0
	for ; i < len(s); i++ {
		switch s[i] {
		case '"':
			end, _ := scanString(s, i)
			if end < 0 {
				return -1
			}
			i = end - 1
		case '{', '[':
			depth++
		case '}', ']':
			if depth--; depth == 0 {
				return i + 1
			}
		}
	}
	return -1
}

// hexRune parses the four hex digits that start s.
func hexRune(s string) (rune, bool) {
	if len(s) < 4 {
		return 0, false
	}
	var r rune
	for _, c := range []byte(s[:4]) {
		switch {
		case isDigit(c):
			r = r<<4 | rune(c-'0')
		case isHex(c):
			r = r<<4 | rune(c|0x20-'a'+10)
		default:
			return 0, false
		}
	}
	return r, true
}

// unescapedIs reports whether the text of a JSON string with escapes
// (lit, without its quotes) is want, as encoding/json decodes it (half
// of a surrogate pair becomes U+FFFD), without allocating.
func unescapedIs(lit, want string) bool {
	var buf [utf8.UTFMax]byte
	j := 0
	ok := eachUnescaped(lit, func(plain string, r rune) bool {
		if r >= 0 {
			n := utf8.EncodeRune(buf[:], r)
			if len(want)-j < n || want[j:j+n] != string(buf[:n]) {
				return false
			}
			j += n
			return true
		}
		if len(want)-j < len(plain) || want[j:j+len(plain)] != plain {
			return false
		}
		j += len(plain)
		return true
	})
	return ok && j == len(want)
}

// eachUnescaped calls fn with the text of a JSON string with escapes
// (lit, without its quotes), as encoding/json decodes it (half of a
// surrogate pair becomes U+FFFD), piece by piece, without allocating: a
// run of bytes without escapes (r is -1), or the rune of one escape
// (plain is ""). fn returns false to stop; ok is false when it did, or
// when an escape is not valid.
func eachUnescaped(lit string, fn func(plain string, r rune) bool) bool {
	for i := 0; i < len(lit); {
		if lit[i] != '\\' {
			j := i + 1
			for j < len(lit) && lit[j] != '\\' {
				j++
			}
			if !fn(lit[i:j], -1) {
				return false
			}
			i = j
			continue
		}
		if i+1 >= len(lit) {
			return false
		}
		var r rune
		switch c := lit[i+1]; c {
		case 'b':
			r = '\b'
		case 'f':
			r = '\f'
		case 'n':
			r = '\n'
		case 'r':
			r = '\r'
		case 't':
			r = '\t'
		case 'u':
			u, ok := hexRune(lit[i+2:])
			if !ok {
				return false
			}
			r, i = u, i+4
			if utf16.IsSurrogate(r) {
				r = unicode.ReplacementChar
				if i+8 <= len(lit) && lit[i+2] == '\\' && lit[i+3] == 'u' {
					if lo, ok := hexRune(lit[i+4:]); ok {
						if d := utf16.DecodeRune(u, lo); d != unicode.ReplacementChar {
							r, i = d, i+6
						}
					}
				}
			}
		default: // " \\ / '
			r = rune(c)
		}
		i += 2
		if !fn("", r) {
			return false
		}
	}
	return true
}

// unquote decodes a JSON string literal with escapes as encoding/json
// does (a lone surrogate becomes U+FFFD).
func unquote(lit string) (string, bool) {
	var s string
	if err := json.Unmarshal([]byte(lit), &s); err != nil {
		return "", false
	}
	return s, true
}

// toJValue is the value of a JSON value's text, as the mapper needs it.
func toJValue(text string) (jvalue, bool) {
	switch text[0] {
	case '"':
		if indexByte(text, '\\') < 0 {
			return jvalue{kind: jString, s: text[1 : len(text)-1]}, true
		}
		s, ok := unquote(text)
		return jvalue{kind: jString, s: s}, ok
	case '{', '[':
		return jvalue{kind: jComposite}, true
	case 't':
		return jvalue{kind: jBool, s: "true"}, true
	case 'f':
		return jvalue{kind: jBool, s: "false"}, true
	case 'n':
		return jvalue{}, true // null counts as missing
	}
	return jvalue{kind: jNumber, s: text}, true
}
