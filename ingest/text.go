package ingest

import (
	"bytes"
	"fmt"
	"strconv"
	"unicode/utf8"

	cut "github.com/meterline/meterline/internal/clip"
	"github.com/meterline/meterline/schemas"
)

// checkText refuses an event whose raw bytes are not valid UTF-8
// (docs/design.md, Event identity and keys): a JSON decoder would turn each
// bad byte into U+FFFD, so that two different customers or IDs could become
// one.
func checkText(raw []byte) *fieldError {
	if utf8.Valid(raw) {
		return nil
	}
	for i := 0; i < len(raw); {
		r, n := utf8.DecodeRune(raw[i:])
		if r == utf8.RuneError && n == 1 {
			return &fieldError{fieldAt(raw, i), schemas.ReasonInvalid, fmt.Sprintf("is not valid UTF-8 (byte 0x%02x at offset %d)", raw[i], i)}
		}
		i += n
	}
	return nil
}

// maxEcho bounds the bytes of a value a producer sent that an error's
// reason repeats (clip).
const maxEcho = cut.Echo

// clip is a value a producer sent, as an error's reason repeats it: at
// most maxEcho bytes of it, cut at the start of a character, then "…".
// Unclipped, a request of long values would be answered with several
// times its own size (a quoted byte can take five in the answer).
func clip(s string) string { return cut.To(s, maxEcho) }

// maxReason bounds the reasons of another package's errors.
const maxReason = 256

// clipTo is s cut to at most n bytes at the start of a character, then
// "…".
func clipTo(s string, n int) string { return cut.To(s, n) }

// checkEscapes refuses an event whose JSON text escapes half of a UTF-16
// surrogate pair (\ud800 alone): encoding/json decodes each such escape
// to U+FFFD, so that "acme-\ud800" and "acme-\udbff" would become one
// customer, as invalid UTF-8 would (docs/design.md, Event identity and
// keys). raw is valid UTF-8; a backslash in valid JSON starts an escape
// inside a string, and invalid JSON is left to the decoder.
func checkEscapes(raw []byte) *fieldError {
	for i := bytes.IndexByte(raw, '\\'); i >= 0 && i+1 < len(raw); {
		n := 2 // \" \\ \n ...
		if raw[i+1] == 'u' {
			n = 6
			if u, ok := hex4(raw[i+2:]); ok && u >= 0xD800 && u < 0xE000 {
				lo, pair := hex4(raw[min(i+8, len(raw)):])
				if u >= 0xDC00 || !pair || raw[i+6] != '\\' || raw[i+7] != 'u' || lo < 0xDC00 || lo >= 0xE000 {
					return &fieldError{fieldAt(raw, i), schemas.ReasonInvalid, fmt.Sprintf("is not valid text (\\u%04x at offset %d is half of a UTF-16 surrogate pair)", u, i)}
				}
				n = 12 // a pair: one code point
			}
		}
		j := bytes.IndexByte(raw[min(i+n, len(raw)):], '\\')
		if j < 0 {
			return nil
		}
		i += n + j
	}
	return nil
}

// hasEscape reports whether b may hold a surrogate escape (checkEscapes):
// nearly every request has none, and is not walked.
func hasEscape(b []byte) bool { return bytes.Contains(b, []byte(`\u`)) }

// hex4 parses the four hex digits of a \u escape.
func hex4(b []byte) (rune, bool) {
	if len(b) < 4 {
		return 0, false
	}
	return hexRune(string(b[:4]))
}

// fieldAt names the field of the event text raw that holds raw[off], as
// an error names it: its members' names joined by dots and its elements'
// indexes in brackets ("data.items[1].model", "properties.model",
// "subject"), clipped; "event" when raw[off] is in none of its members'
// values (in a member's name at the top) or raw does not scan that far.
func fieldAt(raw []byte, off int) string {
	if p := pathIn(string(raw), skipSpace(string(raw), 0), off, "", 0); p != "" {
		return clip(p)
	}
	return "event"
}

// pathIn returns path, the path of the JSON value starting at s[i],
// followed by the path of its innermost member or element whose value
// holds s[off].
func pathIn(s string, i, off int, path string, depth int) string {
	if i >= len(s) || depth >= maxScanDepth || s[i] != '{' && s[i] != '[' {
		return path
	}
	object, closing := s[i] == '{', byte(']')
	if object {
		closing = '}'
	}
	i = skipSpace(s, i+1)
	for n := 0; i < len(s) && s[i] != closing; n++ {
		step := "[" + strconv.Itoa(n) + "]"
		if object {
			end, escaped := scanString(s, i)
			if s[i] != '"' || end < 0 || off < end {
				return path // not a name, or off is in it
			}
			name := s[i+1 : end-1]
			if escaped {
				name, _ = unquote(s[i:end])
			}
			if step = "." + name; path == "" {
				step = name
			}
			if i = skipSpace(s, end); i >= len(s) || s[i] != ':' {
				return path
			}
			i = skipSpace(s, i+1)
		}
		end := skipValue(s, i, depth+1)
		if end < 0 || off < end {
			return pathIn(s, i, off, path+step, depth+1)
		}
		if i = skipSpace(s, end); i < len(s) && s[i] == ',' {
			i = skipSpace(s, i+1)
		}
	}
	return path
}
