package cli

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"

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
