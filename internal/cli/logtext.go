package cli

import (
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"go.uber.org/zap/zapcore"
)

// Log lines repeat what producers sent: a rejected record's key, a
// property's name in a rejection's detail, an error that quotes input.
// They are read in terminals and log viewers, which act on some
// characters instead of showing them. zap's JSON escapes the C0 controls
// (ESC among them) but writes the C1 controls (U+009B CSI, U+009D OSC: a
// terminal's colours, title or OSC 8 hyperlink) and the bidirectional
// controls (U+202E shows "acme-1x" as "acme-x1") as they are. textSafe
// writes those, DEL and the line and paragraph separators as \uXXXX text
// in the message and in the string, byte string and error fields, and
// bounds those fields (boundText) (docs/operations.md, Health, metrics
// and logs).
type textSafe struct{ zapcore.Core }

func (c textSafe) With(fs []zapcore.Field) zapcore.Core { return textSafe{c.Core.With(safeFields(fs))} }

func (c textSafe) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(e.Level) {
		return ce.AddCore(e, c)
	}
	return ce
}

func (c textSafe) Write(e zapcore.Entry, fs []zapcore.Field) error {
	e.Message = safeText(e.Message)
	return c.Core.Write(e, safeFields(fs))
}

// safeFields returns fs with its text made safe; fs itself when no field
// needs it.
func safeFields(fs []zapcore.Field) []zapcore.Field {
	var out []zapcore.Field
	for i, f := range fs {
		g, changed := safeField(f)
		if !changed {
			continue
		}
		if out == nil {
			out = append(make([]zapcore.Field, 0, len(fs)), fs...)
		}
		out[i] = g
	}
	if out == nil {
		return fs
	}
	return out
}

func safeField(f zapcore.Field) (zapcore.Field, bool) {
	var s string
	switch f.Type {
	case zapcore.StringType:
		s = f.String
	case zapcore.ByteStringType:
		b, _ := f.Interface.([]byte)
		s = string(b)
	case zapcore.ErrorType:
		err, ok := f.Interface.(error)
		if !ok || err == nil {
			return f, false
		}
		s = err.Error()
	default:
		return f, false
	}
	s, cut := boundText(s)
	if !cut && !unsafeText(s) {
		return f, false
	}
	return zapcore.Field{Key: f.Key, Type: zapcore.StringType, String: safeText(s)}, true
}

// logFieldMax is the most bytes a string, byte string or error field's
// text writes into a log line, as written (escapes counted), before the
// note of what boundText leaves out. The text a producer controls (a
// rejection's detail quotes a property's name of up to 4 KB, a key, an
// error that quotes input) would otherwise make each of the 100 lines a
// second of a flood's message up to kilobytes. The fields of normal
// operation are far shorter: a detail's reason, a key (customer, meter,
// event ID), a wrapped error, a topic or a query ID; the full record of a
// line that names one (partition, offset) is in its topic, and a stage's
// last error is written, uncut, on stderr as the command exits.
const logFieldMax = 1024

// boundText is s, if it writes at most logFieldMax bytes into a line;
// else its first and last characters that write logFieldMax/2 bytes each
// (an error's cause is at its end) around " [... N bytes left out ...] ",
// N the bytes of s between them; and whether it cut s.
func boundText(s string) (string, bool) {
	if len(s) <= logFieldMax/7 { // no character writes more than 7 bytes per byte
		return s, false
	}
	head, w := -1, 0
	for i, r := range s {
		n := writtenLen(r, s[i:])
		if head < 0 && w+n > logFieldMax/2 {
			head = i
		}
		if w += n; w > logFieldMax {
			break
		}
	}
	if w <= logFieldMax {
		return s, false
	}
	tail := len(s)
	for w = 0; tail > head; {
		r, size := utf8.DecodeLastRuneInString(s[:tail])
		if w += writtenLen(r, s[tail-size:]); w > logFieldMax/2 {
			break
		}
		tail -= size
	}
	return s[:head] + " [... " + strconv.Itoa(tail-head) + " bytes left out ...] " + s[tail:], true
}

// writtenLen is the bytes r, at the start of s, writes into a log line:
// as safeText writes it, then zap's JSON.
func writtenLen(r rune, s string) int {
	switch {
	case r == utf8.RuneError && !strings.HasPrefix(s, "\ufffd"):
		return len(`\ufffd`) // zap writes an invalid byte as \ufffd
	case r == '"' || r == '\\' || r == '\n' || r == '\r' || r == '\t':
		return 2
	case r < 0x20:
		return len(`\u0001`)
	case acted(r):
		return len(`\\u009b`) // safeText's \u009b, its backslash escaped
	}
	return utf8.RuneLen(r)
}

// unsafeText reports whether s holds a character safeText escapes.
func unsafeText(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x7f {
			return strings.IndexFunc(s, acted) >= 0
		}
	}
	return false
}

// acted reports whether a terminal or a viewer may act on r rather than
// show it: DEL, a C1 control, a bidirectional control, or the line or
// paragraph separator. (zap escapes the C0 controls itself.)
func acted(r rune) bool {
	return r >= 0x7f && r <= 0x9f || r == 0x2028 || r == 0x2029 || unicode.Is(unicode.Bidi_Control, r)
}

// safeText is s with the characters acted reports written as \uXXXX.
func safeText(s string) string {
	if !unsafeText(s) {
		return s
	}
	return escapeText(s, acted)
}

// terminalText is s, for a terminal, with the characters acted reports
// and the C0 controls but tab written as \uXXXX.
func terminalText(s string) string {
	c0 := func(r rune) bool { return r < 0x20 && r != '\t' }
	if strings.IndexFunc(s, c0) < 0 && !unsafeText(s) {
		return s
	}
	return escapeText(s, func(r rune) bool { return c0(r) || acted(r) })
}

func escapeText(s string, escape func(rune) bool) string {
	var b strings.Builder
	b.Grow(len(s) + 16)
	for _, r := range s {
		if escape(r) {
			fmt.Fprintf(&b, `\u%04x`, r)
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}
