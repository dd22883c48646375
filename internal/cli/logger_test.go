package cli

import (
	"bytes"
	"encoding/json"
	"errors"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/meterline/meterline/internal/service"
)

// TestLoggerSamplesFloods: a stage logs every record it rejects, and a
// producer decides how many that is. However many rejections come in a
// burst, at most the first logFirst lines of each second are written: the
// lines a second do not grow with the flood, as a share of it (one in 100)
// would. The rest are counted as dropped, and another message still gets
// through.
func TestLoggerSamplesFloods(t *testing.T) {
	var out bytes.Buffer
	log, err := newLogger("info", &out)
	if err != nil {
		t.Fatal(err)
	}
	before := testutil.ToFloat64(service.LogEntriesDropped)
	const n = 100_000
	for i := range n {
		log.Info("record rejected", zap.String("reason", "invalid"), zap.Int("i", i))
	}
	log.Warn("something else")
	lines := strings.Count(out.String(), "\n")
	rejected := strings.Count(out.String(), `"msg":"record rejected"`)
	// The burst may straddle a second's boundary: then up to two firsts.
	if max := 2 * logFirst; rejected > max || rejected < logFirst {
		t.Errorf("%d of %d rejections logged, want %d to %d", rejected, n, logFirst, max)
	}
	if !strings.Contains(out.String(), `"msg":"something else"`) || lines != rejected+1 {
		t.Errorf("another message was not logged (%d lines, %d of them rejections)", lines, rejected)
	}
	if dropped := testutil.ToFloat64(service.LogEntriesDropped) - before; dropped != float64(n-rejected) {
		t.Errorf("%v entries counted as dropped, want %d", dropped, n-rejected)
	}
}

// TestLoggerEscapesTerminalControls: a log line repeats what producers
// sent (a rejected record's key, a property's name in a detail, an
// error), and is read in terminals and log viewers. zap's JSON escapes
// the C0 controls (ESC), but writes C1 controls (U+009B CSI, U+009D OSC:
// an OSC 8 hyperlink) and bidirectional controls (U+202E shows "acme-1x"
// as "acme-x1") as they are. The logger writes them as \uXXXX text, in
// the message and in string, byte string and error fields, and leaves
// other text (letters of any script, emoji with the zero-width joiner)
// as it is.
func TestLoggerEscapesTerminalControls(t *testing.T) {
	var out bytes.Buffer
	log, err := newLogger("info", &out)
	if err != nil {
		t.Fatal(err)
	}
	const hostile = "k\u009b31m\u009d8;;https://evil.example/\u009cclick\u009d8;;\u009c acme-\u202e1x \u2028\u007f"
	log.With(zap.String("with", hostile)).Info("record rejected "+hostile,
		zap.String("detail", hostile), zap.ByteString("key", []byte(hostile)), zap.Error(errors.New(hostile)),
		zap.String("plain", "acme-1 日本 👩\u200d💻 \x1b"))
	line := out.String()
	for _, r := range []rune{0x9b, 0x9d, 0x9c, 0x202e, 0x2028, 0x7f} {
		if strings.ContainsRune(line, r) {
			t.Errorf("log line holds U+%04X as it is: %q", r, line)
		}
	}
	var m map[string]any
	if err := json.Unmarshal(out.Bytes(), &m); err != nil {
		t.Fatalf("log line is not JSON: %v: %q", err, line)
	}
	want := `k\u009b31m\u009d8;;https://evil.example/\u009cclick\u009d8;;\u009c acme-\u202e1x \u2028\u007f`
	for _, k := range []string{"msg", "with", "detail", "key", "error"} {
		got, _ := m[k].(string)
		if !strings.HasSuffix(got, want) {
			t.Errorf("%s = %q, want it to end in %q", k, got, want)
		}
	}
	if got := m["plain"]; got != "acme-1 日本 👩\u200d💻 \x1b" {
		t.Errorf("plain = %q, want it unchanged", got)
	}
}

// TestDemoLoggerEscapesTerminalControls: demo.log is a log of the same
// stages, fed by the demo's HTTP ingest and its embedded broker, which
// any local producer can write to. Its logger writes the characters a
// terminal acts on as \uXXXX text, as every command's does, and samples
// floods as they do.
func TestDemoLoggerEscapesTerminalControls(t *testing.T) {
	var out bytes.Buffer
	log, err := demoLogger("info", &out)
	if err != nil {
		t.Fatal(err)
	}
	const hostile = "k\u009b31m acme-\u202e1x \u2028\u007f"
	log.Info("record rejected", zap.String("detail", "properties."+hostile), zap.ByteString("key", []byte(hostile)))
	for _, r := range []rune{0x9b, 0x202e, 0x2028, 0x7f} {
		if strings.ContainsRune(out.String(), r) {
			t.Errorf("demo.log line holds U+%04X as it is: %q", r, out.String())
		}
	}
	out.Reset()
	for range 10 * logFirst {
		log.Info("duplicate dropped")
	}
	if n := strings.Count(out.String(), "\n"); n > 2*logFirst {
		t.Errorf("%d of %d entries of one message written to demo.log in a burst, want at most %d", n, 10*logFirst, 2*logFirst)
	}
}

// TestLoggerBoundsLongFields: a log line repeats what producers sent (a
// rejection's detail quotes a property's name of up to 4 KB, a key, an
// error), and a flood of such input writes 100 lines a second of each
// message. A string, byte string or error field longer than logFieldMax
// bytes as written (escapes counted) keeps its first and last
// logFieldMax/2 bytes and says how many bytes it leaves out; the line
// stays JSON, and the characters a terminal acts on are still escaped.
func TestLoggerBoundsLongFields(t *testing.T) {
	var out bytes.Buffer
	log, err := newLogger("info", &out)
	if err != nil {
		t.Fatal(err)
	}
	// Producer-like text: a property's name of 10 KB, with multi-byte
	// characters (that a cut must not split) throughout.
	long := "properties." + strings.Repeat("日本-acme-", 1000) + ": name longer than 256 bytes"
	c0 := strings.Repeat("\x01", 10_000)         // zap writes each as \u0001
	c1 := strings.Repeat("x\u009b\u202e", 3_000) // the logger writes \u009b, \u202e
	log.With(zap.String("with", long)).Info("record rejected",
		zap.String("detail", long), zap.ByteString("key", []byte(c0)), zap.Error(errors.New(long)),
		zap.String("c1", c1), zap.Int("partition", 3))
	line := out.String()
	const fields = 5
	if max := fields*(logFieldMax+64) + 200; len(line) > max {
		t.Errorf("a line of %d fields of 10 KB is %d bytes, want at most %d", fields, len(line), max)
	}
	for _, r := range []rune{0x9b, 0x202e} {
		if strings.ContainsRune(line, r) {
			t.Errorf("log line holds U+%04X as it is", r)
		}
	}
	var m map[string]any
	if err := json.Unmarshal(out.Bytes(), &m); err != nil {
		t.Fatalf("log line is not JSON: %v: %q", err, line)
	}
	if m["partition"] != 3.0 {
		t.Errorf("partition = %v, want 3", m["partition"])
	}
	for k, orig := range map[string]string{"with": long, "detail": long, "error": long, "key": c0, "c1": c1} {
		got, _ := m[k].(string)
		head, rest, ok := strings.Cut(got, " [... ")
		n, tail, ok2 := strings.Cut(rest, " bytes left out ...] ")
		if !ok || !ok2 {
			t.Errorf("%s (%d bytes of %d) does not say how many bytes it leaves out: %.200q", k, len(got), len(orig), got)
			continue
		}
		if k == "c1" {
			// Escaped: compare with the text as escaped.
			orig = escapeText(orig, acted)
		}
		if !utf8.ValidString(got) || strings.ContainsRune(got, utf8.RuneError) {
			t.Errorf("%s was cut inside a character: %.200q", k, got)
		}
		if !strings.HasPrefix(orig, head) || !strings.HasSuffix(orig, tail) {
			t.Errorf("%s keeps %.100q of its start and %.100q of its end, want them as they were", k, head, tail)
		}
		// Each side writes up to half the bound: less by at most a
		// character's 7 bytes.
		for _, side := range []string{head, tail} {
			if w := writtenJSON(t, side); w > logFieldMax/2 || w <= logFieldMax/2-7 {
				t.Errorf("%s keeps a side that writes %d bytes, want %d to %d", k, w, logFieldMax/2-6, logFieldMax/2)
			}
		}
		if want := strconv.Itoa(len(orig) - len(head) - len(tail)); k != "c1" && n != want {
			t.Errorf("%s says %s bytes left out, want %s", k, n, want)
		}
	}
}

// writtenJSON is the bytes s takes as a JSON string, quotes left out (zap
// and encoding/json write the text of these tests alike).
func writtenJSON(t *testing.T, s string) int {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(s); err != nil {
		t.Fatal(err)
	}
	return b.Len() - len("\"\"\n")
}

// TestLoggerLeavesShortFieldsAsTheyAre: the lines of normal operation (a
// rejection's short detail, a key, an error, a field of exactly
// logFieldMax bytes as written) are written as zap writes them.
func TestLoggerLeavesShortFieldsAsTheyAre(t *testing.T) {
	var out, ref bytes.Buffer
	log, err := newLogger("info", &out)
	if err != nil {
		t.Fatal(err)
	}
	enc := zap.NewProductionEncoderConfig()
	enc.EncodeTime = zapcore.ISO8601TimeEncoder
	plain := zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(enc), zapcore.AddSync(&ref), zapcore.InfoLevel))
	key := []byte("4:acme9:api_calls36:0b8f2f9e-7a51-4a62-9a3e-5d1c2b7e8f10")
	// logFieldMax bytes as written: a quote writes as two.
	atBound := strings.Repeat("a", logFieldMax-10) + strings.Repeat(`"`, 5)
	for _, l := range []*zap.Logger{log, plain} {
		l.With(zap.String("stage", "dedup")).Info("record rejected", zap.String("reason", "invalid_property"),
			zap.String("detail", "properties.region: a string of at most 256 bytes (got 300)"), zap.ByteString("key", key),
			zap.Int32("partition", 7), zap.Int64("offset", 123456), zap.Error(errors.New("dedup: partition 7: commit: NOT_COORDINATOR")),
			zap.String("at_bound", atBound), zap.Strings("topics", []string{"usage.events", "usage.deduped"}))
	}
	ts := regexp.MustCompile(`"ts":"[^"]*"`)
	got, want := ts.ReplaceAllString(out.String(), ""), ts.ReplaceAllString(ref.String(), "")
	if got != want {
		t.Errorf("a normal line changed:\n got %s\nwant %s", got, want)
	}
}

// TestBoundTextEdges: the bound counts bytes as written into the line
// (an escape's bytes too), so text of logFieldMax bytes as written is
// left as it is and one byte more is cut, and invalid UTF-8 (written as
// \ufffd) and DEL (as \\u007f) count what they write.
func TestBoundTextEdges(t *testing.T) {
	for _, c := range []struct {
		name string
		s    string
		cut  bool
	}{
		{"at the bound", strings.Repeat("a", logFieldMax), false},
		{"one byte over", strings.Repeat("a", logFieldMax+1), true},
		{"quotes at the bound", strings.Repeat(`"`, logFieldMax/2), false},
		{"quotes over", strings.Repeat(`"`, logFieldMax/2+1), true},
		{"invalid UTF-8", strings.Repeat("\xff", logFieldMax/6+1), true},
		{"DEL", strings.Repeat("\x7f", logFieldMax/7+1), true},
		{"DEL at the bound", strings.Repeat("\x7f", logFieldMax/7), false},
	} {
		got, cut := boundText(c.s)
		if cut != c.cut || (!cut && got != c.s) {
			t.Errorf("%s: cut %v, want %v", c.name, cut, c.cut)
		}
		if cut && !strings.Contains(got, " bytes left out ...] ") {
			t.Errorf("%s: %q does not say what it leaves out", c.name, got)
		}
	}
}
