package cli

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/producer"
	"github.com/meterline/meterline/schemas"
)

// TestProduceInvalidText: `meterline produce` checks text on the raw bytes
// of each line (docs/design.md, Event identity and keys). "acme\xff" and
// "acme\xfe" used to become one customer "acme\uFFFD" (encoding/json's
// replacement), so the second event was a copy of the first; each is now a
// bad line naming customer_id, as are control characters (C0, DEL, C1)
// and bidirectional controls in identity fields and source. A real U+FFFD
// is text.
func TestProduceInvalidText(t *testing.T) {
	_, brokers := testenv.KFake(t, kfake.SeedTopics(4, "usage.events"))
	ts := time.Now().Add(-time.Minute).UTC().Format(time.RFC3339Nano)
	ev := func(customer, id, extra string) string {
		return `{"event_id":"` + id + `","customer_id":"` + customer + `","meter":"api_calls","quantity":1,"event_time":"` + ts + `"` + extra + `}`
	}
	in := strings.Join([]string{
		ev("acme\xff", "req-1", ""),
		ev("acme\xfe", "req-1", ""),
		ev("acme\uFFFD", "req-1", ""),
		ev(`acme\u0009`, "req-2", ""),
		ev("acme", `req-3\u0000`, ""),
		ev("acme", "req-4", `,"source":"gw\r"`),
		ev("acme", "req-5", "\x2c\"properties\":{\"model\":\"m\xc3\"}"),
		ev("acme\u202e1-", "req-6", ""),
		ev(`acme\u007f`, "req-7", ""),
		ev("acme", "req-8", `,"source":"gw\u0085"`),
	}, "\n") + "\n"
	code, stdout, stderr := run(t, in, "produce", "--brokers", brokers[0])
	if code == 0 {
		t.Fatalf("exit 0; want non-zero\nstdout: %s\nstderr: %s", stdout, stderr)
	}
	for _, re := range []*regexp.Regexp{
		regexp.MustCompile(`(?m)^line 1: customer_id: is not valid UTF-8 \(byte 0xff at column 40\)$`),
		regexp.MustCompile(`(?m)^line 2: customer_id: is not valid UTF-8 \(byte 0xfe at column 40\)$`),
		regexp.MustCompile(`(?m)^line 4: customer_id: holds the control character U\+0009 at offset 4`),
		regexp.MustCompile(`(?m)^line 5: event_id: holds the control character U\+0000 at offset 5`),
		regexp.MustCompile(`(?m)^line 6: source: holds the control character U\+000D`),
		regexp.MustCompile(`(?m)^line 7: properties.model: is not valid UTF-8`),
		regexp.MustCompile(`(?m)^line 8: customer_id: holds the bidirectional control U\+202E at offset 4`),
		regexp.MustCompile(`(?m)^line 9: customer_id: holds the control character U\+007F at offset 4`),
		regexp.MustCompile(`(?m)^line 10: source: holds the control character U\+0085 at offset 2`),
	} {
		if !re.MatchString(stderr) {
			t.Errorf("stderr lacks %s:\n%s", re, stderr)
		}
	}
	if !strings.Contains(stdout, "10 lines, 1 sent, 9 bad, 0 failed") {
		t.Errorf("summary: %s", stdout)
	}
	recs := testenv.ReadAll(t, brokers, "usage.events")
	if len(recs) != 1 {
		t.Fatalf("topic has %d records, want only the event of customer acme\\uFFFD", len(recs))
	}
	var ue schemas.UsageEvent
	if err := schemas.DecodeInto(recs[0].Value, &ue); err != nil {
		t.Fatal(err)
	}
	if ue.CustomerID != "acme\uFFFD" {
		t.Fatalf("sent customer %q, want acme\\uFFFD", ue.CustomerID)
	}
}

// TestProduceExactNames: `meterline produce` matches the fields of a line
// exactly. A lone "EVENT_ID" was taken for event_id (encoding/json
// matches names without regard to case), though "EVENT_ID" next to
// "event_id" was refused; each case variant is now a bad line naming the
// member as the line spells it, and nothing of it is sent.
func TestProduceExactNames(t *testing.T) {
	_, brokers := testenv.KFake(t, kfake.SeedTopics(4, "usage.events"))
	ts := time.Now().Add(-time.Minute).UTC().Format(time.RFC3339Nano)
	rest := `"customer_id":"acme","meter":"api_calls","quantity":1,"event_time":"` + ts + `"`
	in := strings.Join([]string{
		`{"EVENT_ID":"req-1",` + rest + `}`,
		`{"event_id":"req-2",` + rest + `,"Source":"gw"}`,
		`{"event_id":"req-3",` + rest + `}`,
	}, "\n") + "\n"
	code, stdout, stderr := run(t, in, "produce", "--brokers", brokers[0])
	if code == 0 {
		t.Fatalf("exit 0; want non-zero\nstdout: %s\nstderr: %s", stdout, stderr)
	}
	for _, re := range []*regexp.Regexp{
		regexp.MustCompile(`(?m)^line 1: EVENT_ID: is not the field "event_id": field names are lowercase, and are matched exactly$`),
		regexp.MustCompile(`(?m)^line 2: Source: is not the field "source": field names are lowercase, and are matched exactly$`),
	} {
		if !re.MatchString(stderr) {
			t.Errorf("stderr lacks %s:\n%s", re, stderr)
		}
	}
	if !strings.Contains(stdout, "3 lines, 1 sent, 2 bad, 0 failed") {
		t.Errorf("summary: %s", stdout)
	}
	recs := testenv.ReadAll(t, brokers, "usage.events")
	if len(recs) != 1 {
		t.Fatalf("topic has %d records, want only req-3's", len(recs))
	}
	var ue schemas.UsageEvent
	if err := schemas.DecodeInto(recs[0].Value, &ue); err != nil {
		t.Fatal(err)
	}
	if ue.EventID != "req-3" {
		t.Fatalf("sent event %q, want req-3", ue.EventID)
	}
}

// FuzzProduceLines feeds arbitrary input to the decoding half of
// `meterline produce`: the line reader and each line's parse, validation
// and encoding. It must never panic; every line is either empty, a record
// whose value decodes to a valid UsageEvent under the canonical key of its
// identity, or an error naming a field or a malformed line.
func FuzzProduceLines(f *testing.F) {
	f.Add([]byte(`{"event_id":"req-42","customer_id":"acme","meter":"api_calls","quantity":3,"event_time":"2026-11-29T12:00:00.250Z","source":"api-gateway","properties":{"model":"m1"}}` + "\n\n"))
	f.Add([]byte("{\"event_id\":\"e\",\"customer_id\":\"acme\xff\",\"meter\":\"m\",\"quantity\":1,\"event_time\":1795003200250}\r\n{\"bad\""))
	f.Add([]byte(`{"event_id":"e","customer_id":"c\u0000","meter":"m","quantity":1,"event_time":1795003200250}`))
	p, err := producer.New(producer.WithBrokers("127.0.0.1:1"), producer.WithMaxSkew(100*365*24*time.Hour))
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(p.Close)
	f.Fuzz(func(t *testing.T, in []byte) {
		br := bufio.NewReaderSize(bytes.NewReader(in), 1<<20)
		c := &chunk{first: 1, done: make(chan struct{})}
		for {
			b, err := readLine(br)
			if len(b) > 0 || err == nil || errors.Is(err, errLineTooLong) {
				c.lines = append(c.lines, inputLine{b: bytes.Clone(b), tooLong: errors.Is(err, errLineTooLong)})
			}
			if err != nil && !errors.Is(err, errLineTooLong) {
				if !errors.Is(err, io.EOF) {
					t.Fatalf("readLine: %v", err)
				}
				break
			}
		}
		encodeChunk(p, c)
		for i, r := range c.recs {
			if err := c.errs[i]; err != nil {
				var fe *producer.FieldError
				if r != nil || (!errors.As(err, &fe) && !errors.Is(err, producer.ErrMalformedJSON)) {
					t.Fatalf("line %d: record %v with error of an unexpected class: %v", i+1, r, err)
				}
				continue
			}
			if r == nil {
				continue // an empty line
			}
			var ue schemas.UsageEvent
			if err := schemas.DecodeInto(r.Value, &ue); err != nil {
				t.Fatalf("line %d: record does not decode: %v", i+1, err)
			}
			if err := ue.Validate(); err != nil {
				t.Fatalf("line %d: sent an invalid event: %v", i+1, err)
			}
			if !bytes.Equal(r.Key, ue.Identity().Key()) {
				t.Fatalf("line %d: key %q is not the canonical key of %+v", i+1, r.Key, ue.Identity())
			}
		}
	})
}

// producePipe runs Produce, with ctx, of what is written to the pipe it
// returns, to usage.events on a kfake broker; the summary comes on the
// channel when Produce returns.
func producePipe(t *testing.T, ctx context.Context) ([]string, *io.PipeWriter, <-chan ProduceSummary) {
	t.Helper()
	_, brokers := testenv.KFake(t, kfake.SeedTopics(4, "usage.events"))
	p, err := producer.New(producer.WithBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	pr, pw := io.Pipe()
	t.Cleanup(func() { _ = pw.Close() })
	done := make(chan ProduceSummary, 1)
	go func() { done <- Produce(ctx, pr, p, ProduceOptions{}) }()
	return brokers, pw, done
}

// writeSent writes line i, event req-i, to w, and waits until usage.events
// holds i events.
func writeSent(t *testing.T, brokers []string, w io.Writer, i int) {
	t.Helper()
	ts := time.Now().Add(-time.Minute).UTC().Format(time.RFC3339Nano)
	line := fmt.Sprintf(`{"event_id":"req-%d","customer_id":"acme","meter":"api_calls","quantity":1,"event_time":"%s"}`+"\n", i, ts)
	if _, err := w.Write([]byte(line)); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(testenv.ReadAll(t, brokers, "usage.events")) < i {
		if time.Now().After(deadline) {
			t.Fatalf("line %d, written to the pipe, not sent within 10 s", i)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestProduceSendsWhatAPipeHasWritten: a line read from a slow stream
// (`tail -f events.ndjson | meterline produce`) is sent once no more input
// is waiting, not when 512 lines have arrived.
func TestProduceSendsWhatAPipeHasWritten(t *testing.T) {
	brokers, pw, done := producePipe(t, context.Background())
	for i := 1; i <= 2; i++ {
		writeSent(t, brokers, pw, i)
	}
	_ = pw.Close()
	if s := <-done; s.Sent != 2 || s.Err != nil {
		t.Errorf("summary %+v, want 2 sent", s)
	}
}

// TestProduceStopsWhileInputIsIdle: told to stop (SIGINT, SIGTERM: its
// context ends) while its input is open but idle (a service that pipes
// events in and has none to write now, a terminal waiting for a line),
// Produce returns within its grace period, as docs/producing.md promises,
// counting what it sent, rather than wait for the next line of the input;
// the part of a line read when it stopped is not taken for a bad line.
func TestProduceStopsWhileInputIsIdle(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	brokers, pw, done := producePipe(t, ctx) // the pipe stays open: the input never ends
	writeSent(t, brokers, pw, 1)
	// Half a line, the rest of which the writer has yet to write.
	if _, err := pw.Write([]byte(`{"event_id":"req-2","customer_id":"acme"`)); err != nil {
		t.Fatal(err)
	}
	cancel()
	select {
	case s := <-done:
		if s.Sent != 1 || s.Lines != 1 || s.Bad != 0 || s.Unacked != 0 || s.Err == nil || !strings.Contains(s.Err.Error(), "interrupted") {
			t.Errorf("summary %+v, want 1 line, 1 sent, none bad, and the interruption reported", s)
		}
	case <-time.After(produceStopGrace + 5*time.Second):
		t.Fatal("Produce did not return after the stop while its input was open and idle")
	}
}

// TestProduceErrorsEscapeTerminalControls: a bad line's error repeats a
// property's name (decoded: "\u001b" in the JSON is ESC), and `meterline
// produce` writes it to a terminal. An ESC, a C1 control or a
// bidirectional control there would start an escape sequence (colours, an
// OSC 8 hyperlink) or reorder what the line shows; they are written as
// \uXXXX text instead.
func TestProduceErrorsEscapeTerminalControls(t *testing.T) {
	_, brokers := testenv.KFake(t, kfake.SeedTopics(1, "usage.events"))
	ts := time.Now().Add(-time.Minute).UTC().Format(time.RFC3339Nano)
	ev := func(props string) string {
		return `{"event_id":"e","customer_id":"acme","meter":"api_calls","quantity":1,"event_time":"` + ts + `","properties":` + props + `}`
	}
	osc := `x\u001b]8;;https://evil.example/\u001b\\y`
	in := ev(`{"`+osc+`":"1","`+osc+`":"2"}`) + "\n" +
		ev("{\"n\u009b31m\u202e\":\"1\",\"n\u009b31m\u202e\":\"2\"}") + "\n"
	_, _, stderr := run(t, in, "produce", "--brokers", brokers[0])
	for _, r := range []rune{0x1b, 0x9b, 0x202e} {
		if strings.ContainsRune(stderr, r) {
			t.Errorf("stderr holds U+%04X as it is: %q", r, stderr)
		}
	}
	for _, want := range []string{
		`line 1: properties.x\u001b]8;;https://evil.example/\u001b\y: appears twice`,
		`line 2: properties.n\u009b31m\u202e: appears twice`,
	} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr lacks %q:\n%q", want, stderr)
		}
	}
}
