package aggregator

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/schemas"
)

func mustMeters(t testing.TB, yaml string) *Catalog {
	t.Helper()
	c, err := ParseMeters([]byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// awaitStopped waits for run to stop on its own (an error at a partition's
// load); false if it still runs after d, the input then caught up.
func awaitStopped(h *aggHarness, run *aggRunning, d time.Duration) bool {
	select {
	case <-run.done:
		return true
	case <-time.After(d):
		h.caughtUp()
		return false
	}
}

// awaitRefused waits for run to stop with ErrMeterChanged and returns its
// error; what says what it runs with.
func awaitRefused(t *testing.T, run *aggRunning, what string) error {
	t.Helper()
	select {
	case <-run.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("the aggregator runs with %s", what)
	}
	if !errors.Is(run.err, ErrMeterChanged) {
		t.Fatalf("Run = %v, want ErrMeterChanged", run.err)
	}
	return run.err
}

// goesOn waits until the aggregator caught up and fails if it stopped.
func goesOn(t *testing.T, h *aggHarness, run *aggRunning, what string) {
	t.Helper()
	h.caughtUp()
	select {
	case <-run.done:
		t.Fatalf("the aggregator stopped %s: %v", what, run.err)
	default:
	}
}

// TestMeterChangeRefused: an OPEN aggregate's working state means what the
// meter's aggregation made of its events: a MAX state holds the largest
// quantity so far, a SUM the total. An aggregator restarted with the meter
// declared SUM on state built while it was MAX would add the next event
// to the largest quantity so far and emit it as the SUM (5 and 7 as MAX,
// then 3 as SUM: 10, when the sum of the period is 15 and its MAX 7). It
// stops with ErrMeterChanged before it counts anything, naming the meter
// and both definitions; restarted with the definition the state was built
// with, it goes on.
func TestMeterChangeRefused(t *testing.T) {
	h := newAggHarness(t, nil, 1)
	fs := vfs.NewMem()
	cfg := h.config("a", fs)
	cfg.Period = Month
	cfg.Meters = mustMeters(t, "meters:\n  - {name: peak, aggregation: MAX}\n")
	may := ms(t, "2026-05-01")
	ev := func(id string, q int64) *schemas.DedupedEvent {
		et := may + 3600_000
		return &schemas.DedupedEvent{EventID: id, CustomerID: "acme", Meter: "peak", Quantity: q, EventTime: et, IngestTime: et + 1000}
	}
	run := h.start(cfg)
	h.produce(h.dedupedEvent(0, ev("e1", 5)), h.dedupedEvent(0, ev("e2", 7)))
	h.caughtUp()
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}
	before := len(readAggregates(t, h))

	h.produce(h.dedupedEvent(0, ev("e3", 3)))
	sum := cfg
	sum.Meters = mustMeters(t, "meters:\n  - {name: peak, aggregation: SUM}\n")
	run = h.start(sum)
	stopped := awaitStopped(h, run, 10*time.Second)
	for _, a := range readAggregates(t, h)[before:] {
		t.Errorf("with the meter changed to SUM: %s revision %d, aggregation %s, value %d of %d events",
			a.Status, a.Revision, a.Aggregation, a.Value, a.EventCount)
	}
	if !stopped {
		t.Fatal("the aggregator runs with meter peak declared SUM on state built with it MAX")
	}
	if !errors.Is(run.err, ErrMeterChanged) {
		t.Fatalf("Run = %v, want ErrMeterChanged", run.err)
	}
	for _, want := range []string{"peak", `{"aggregation":"MAX"}`, `{"aggregation":"SUM"}`, "new meter name", "2026-05-01T00:00:00Z"} {
		if !strings.Contains(run.err.Error(), want) {
			t.Errorf("the error does not say %q: %v", want, run.err)
		}
	}
	t.Log(run.err)

	// With the definition the state was built with, it goes on.
	run = h.start(cfg)
	goesOn(t, h, run, "with the meter as its state was built")
	all := readAggregates(t, h)
	last := all[len(all)-1]
	if last.Value != 7 || last.EventCount != 3 || last.Aggregation != string(Max) || last.Status != schemas.StatusOpen {
		t.Errorf("last revision %+v, want OPEN MAX 7 of 3 events", last)
	}
}

// restartWith runs the aggregator on meters before, counts one event of
// meter m, stops it, and starts it again on the same state with meters
// after (either may be empty: no meters file), one more event waiting. It
// returns the second run once it either stopped (refused) or caught up.
func restartWith(t *testing.T, before, after string, afterCfg ...func(*Config)) (*aggHarness, *aggRunning, bool) {
	t.Helper()
	h := newAggHarness(t, nil, 1)
	cfg := h.config("a", vfs.NewMem())
	cfg.Period = Month
	catalog := func(s string) *Catalog {
		if s == "" {
			return nil
		}
		return mustMeters(t, "meters:\n  - "+s+"\n")
	}
	may := ms(t, "2026-05-01")
	ev := func(id string) *kgo.Record {
		et := may + 3600_000
		return h.dedupedEvent(0, &schemas.DedupedEvent{EventID: id, CustomerID: "acme", Meter: "m", Quantity: 2,
			EventTime: et, IngestTime: et + 1000, Properties: []schemas.Property{{Name: "user", Value: "u1"},
				{Name: "session", Value: "s1"}, {Name: "model", Value: "x"}}})
	}
	cfg.Meters = catalog(before)
	run := h.start(cfg)
	h.produce(ev("e1"))
	h.caughtUp()
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}
	h.produce(ev("e2"))
	cfg.Meters = catalog(after)
	for _, f := range afterCfg {
		f(&cfg)
	}
	run = h.start(cfg)
	select {
	case <-run.done:
		return h, run, true
	case <-time.After(30 * time.Second):
		t.Fatal("the aggregator neither stopped nor caught up in 30s")
	case <-caughtUp(h):
	}
	select {
	case <-run.done:
		return h, run, true
	default:
		return h, run, false
	}
}

// caughtUp closes its channel once the aggregator's group caught up.
func caughtUp(h *aggHarness) <-chan struct{} {
	c := make(chan struct{})
	go func() {
		defer close(c)
		deadline := time.Now().Add(time.Minute)
		for time.Now().Before(deadline) {
			if ok, err := testenv.CaughtUp(h.brokers, h.group, h.names.DedupedTopic()); err == nil && ok {
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()
	return c
}

// TestMeterDefinitionChanges: what a meter's definition may change while
// it has state, and what is refused (ErrMeterChanged, naming the meter and
// what the meters file now says). Documentation and the CloudEvents that
// feed a meter may change, a meter may be added, and one may be removed or
// declared if undeclared it counts as it did (a SUM without groups);
// what a quantity is and how quantities combine may not.
func TestMeterDefinitionChanges(t *testing.T) {
	const ingest = "event_type: prompt, value_property: $.tokens"
	cases := []struct {
		name, before, after string
		want                string // "": goes on; else refused, the error saying it
	}{
		{"unit, description, event_type and group_by paths changed, a meter added",
			"{name: m, aggregation: SUM, unit: tokens, " + ingest + ", group_by: {model: $.model}}",
			"{name: m, aggregation: SUM, unit: ktokens, description: thousands, event_type: chat, value_property: $.tokens, group_by: {model: $.meta.model}}\n  - {name: other, aggregation: MAX}",
			""},
		{"aggregation", "{name: m, aggregation: SUM}", "{name: m, aggregation: COUNT}", `now declares {"aggregation":"COUNT"}`},
		{"group_by added", "{name: m}", "{name: m, group_by: [model]}", `{"aggregation":"SUM","group_by":["model"]}`},
		{"group_by removed", "{name: m, group_by: [model]}", "{name: m}", `now declares {"aggregation":"SUM"}`},
		{"UNIQUE_COUNT property", "{name: m, aggregation: UNIQUE_COUNT, property: user}", "{name: m, aggregation: UNIQUE_COUNT, property: session}",
			`{"aggregation":"UNIQUE_COUNT","property":"session"}`},
		{"value_property", "{name: m, " + ingest + "}", "{name: m, event_type: prompt, value_property: $.output_tokens}",
			`{"aggregation":"SUM","value_property":"$.output_tokens"}`},
		// A meter fed by producers that name it gets an event_type (the
		// HTTP ingest feeds it too), or loses it: value_property comes
		// and goes with it.
		{"event_type added", "{name: m, aggregation: SUM}", "{name: m, aggregation: SUM, " + ingest + "}", ""},
		{"event_type removed", "{name: m, aggregation: SUM, " + ingest + "}", "{name: m, aggregation: SUM}", ""},
		{"event_type removed with its scale", "{name: m, " + ingest + ", scale: 2}", "{name: m}", `now declares {"aggregation":"SUM"}`},
		{"scale", "{name: m, " + ingest + "}", "{name: m, " + ingest + ", scale: 3}", `{"aggregation":"SUM","value_property":"$.tokens","scale":3}`},
		{"a SUM removed", "{name: m, aggregation: SUM, unit: tokens}", "{name: other}", ""},
		{"a SUM the HTTP ingest fed removed", "{name: m, aggregation: SUM, " + ingest + "}", "{name: other}", ""},
		{"a MAX removed", "{name: m, aggregation: MAX}", "{name: other}", `no longer declares it, and an undeclared meter counts as {"aggregation":"SUM"}`},
		{"declared as it counted undeclared", "", "{name: m, aggregation: SUM}", ""},
		{"declared otherwise", "", "{name: m, aggregation: COUNT}", `now declares {"aggregation":"COUNT"}`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h, run, stopped := restartWith(t, c.before, c.after)
			if c.want == "" {
				if stopped {
					t.Fatalf("refused: %v", run.err)
				}
				all := readAggregates(t, h)
				if last := all[len(all)-1]; last.EventCount != 2 || last.Value != 4 {
					t.Errorf("last revision %+v, want SUM 4 of 2 events", last)
				}
				return
			}
			if !stopped {
				t.Fatalf("the aggregator runs with %s on state built with %s", c.after, c.before)
			}
			if !errors.Is(run.err, ErrMeterChanged) {
				t.Fatalf("Run = %v, want ErrMeterChanged", run.err)
			}
			for _, want := range []string{`meter "m"`, c.want} {
				if !strings.Contains(run.err.Error(), want) {
					t.Errorf("the error does not say %s: %v", want, run.err)
				}
			}
		})
	}
}

// awaitNoStateOf waits until the committed changelog holds no live key of
// period start (its state expired, definitions and marker included).
func awaitNoStateOf(t *testing.T, h *aggHarness, start int64) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		keys := liveStateKeys(t, h, start)
		if len(keys) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("period %s still has %d live keys, such as %q", msTime(start), len(keys), keys[0])
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestMeterChangeAfterExpiry: a final period's working state is kept for
// adjustments until end + W + B + S, and measured by the meter's definition:
// the change stays refused until then (the error says the period is final
// and when its state expires). Once the state of every period of the
// meter expired, the definition record went with it, and the new
// definition counts the next period.
func TestMeterChangeAfterExpiry(t *testing.T) {
	h := newAggHarness(t, nil, 1)
	fs := vfs.NewMem()
	cfg := h.config("a", fs)
	cfg.Period, cfg.Grace, cfg.Window, cfg.Bucket = Day, time.Hour, time.Hour, time.Hour
	maxM := mustMeters(t, "meters:\n  - {name: peak, aggregation: MAX}\n")
	sumM := mustMeters(t, "meters:\n  - {name: peak, aggregation: SUM}\n")
	cfg.Meters = maxM
	day := ms(t, "2026-05-04")
	ev := func(id string, et, q int64) *kgo.Record {
		return h.dedupedEvent(0, &schemas.DedupedEvent{EventID: id, CustomerID: "acme", Meter: "peak", Quantity: q,
			EventTime: et, IngestTime: et + 1000})
	}
	run := h.start(cfg)
	h.produce(ev("e1", day+3600_000, 5), h.watermark(0, 0, 1, day+25*3600_000+1800_000))
	if aggs := awaitFinals(t, h, 1, 20*time.Second); aggs[len(aggs)-1].Status != schemas.StatusFinal {
		t.Fatalf("no FINAL: %+v", aggs[len(aggs)-1])
	}
	h.caughtUp()
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}

	// Final, its state kept until 05-05 03:00 (W, B and S 1 hour each):
	// refused.
	sum := cfg
	sum.Meters = sumM
	run = h.start(sum)
	err := awaitRefused(t, run, "meter peak declared SUM on a final period's state built with it MAX")
	for _, want := range []string{"(final, its working state kept for adjustments)", "not before 2026-05-05T03:00:00Z"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error does not say %q: %v", want, err)
		}
	}

	// The watermark reaches end + W + B + S: the period's state expires.
	run = h.start(cfg)
	h.produce(h.watermark(0, 0, 1, day+27*3600_000))
	h.caughtUp()
	awaitNoStateOf(t, h, day)
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}

	// No state of the meter is left: the new definition counts 05-06.
	run = h.start(sum)
	next := day + 2*24*3600_000
	h.produce(ev("e2", next+1000, 3), ev("e3", next+2000, 4))
	goesOn(t, h, run, "with no state of the meter left")
	all := readAggregates(t, h)
	if last := all[len(all)-1]; last.Value != 7 || last.Aggregation != string(Sum) || last.PeriodStart != next {
		t.Errorf("last revision %+v, want 05-06 SUM 7", last)
	}
}

// TestMeterDefsLegacyState: state restored from a changelog without
// definitions (written before they were recorded) gets the configured
// definition of each period and meter it holds in its next transaction,
// although no aggregate of the meter is new; from then on a change is
// refused.
func TestMeterDefsLegacyState(t *testing.T) {
	h := newAggHarness(t, nil, 1)
	cfg := h.config("a", vfs.NewMem())
	cfg.Period = Month
	cfg.Meters = mustMeters(t, "meters:\n  - {name: peak, aggregation: MAX}\n")
	may := ms(t, "2026-05-01")
	ev := func(id string, q int64) *kgo.Record {
		et := may + 3600_000
		return h.dedupedEvent(0, &schemas.DedupedEvent{EventID: id, CustomerID: "acme", Meter: "peak", Quantity: q,
			EventTime: et, IngestTime: et + 1000})
	}
	run := h.start(cfg)
	h.produce(ev("e1", 5))
	h.caughtUp()
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}
	defKey := periodKey(pfxMeterDef, may, []byte("peak"))
	live := func() map[string][]byte {
		m := map[string][]byte{}
		for _, r := range testenv.ReadAll(t, h.brokers, h.names.AggregateChangelogTopic()) {
			if r.Value == nil {
				delete(m, string(r.Key))
			} else {
				m[string(r.Key)] = r.Value
			}
		}
		return m
	}
	if v := live()[string(defKey)]; string(v) != `{"aggregation":"MAX"}` {
		t.Fatalf("the changelog records %q for peak in May, want the MAX definition", v)
	}
	// What earlier versions left: no definitions.
	h.produce(&kgo.Record{Topic: h.names.AggregateChangelogTopic(), Partition: 0, Key: defKey},
		&kgo.Record{Topic: h.names.AggregateChangelogTopic(), Partition: 0, Key: bytes.Clone(keyMeterDefs)})
	if st := live(); st[string(defKey)] != nil || st[string(keyMeterDefs)] != nil {
		t.Fatal("the definitions are still in the changelog")
	}

	cfg.Stream.FS = vfs.NewMem() // restored from the changelog
	run = h.start(cfg)
	h.produce(ev("e2", 3)) // the same aggregate: nothing new of the meter
	h.caughtUp()
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}
	st := live()
	if v := st[string(defKey)]; string(v) != `{"aggregation":"MAX"}` {
		t.Errorf("the next transaction recorded %q for peak in May, want the MAX definition", v)
	}
	if st[string(keyMeterDefs)] == nil {
		t.Error("the next transaction did not record that definitions are recorded")
	}

	sum := cfg
	sum.Meters = mustMeters(t, "meters:\n  - {name: peak, aggregation: SUM}\n")
	awaitRefused(t, h.start(sum), "meter peak declared SUM on state built with it MAX")
}

// TestMeterRemovedUnderStrictMeters: with StrictMeters an undeclared
// meter's events are rejected, so the refusal of a removed MAX meter does
// not say that it counts as a SUM, only how its state would be treated.
func TestMeterRemovedUnderStrictMeters(t *testing.T) {
	_, run, stopped := restartWith(t, "{name: m, aggregation: MAX}", "{name: other}", func(c *Config) { c.StrictMeters = true })
	if !stopped || !errors.Is(run.err, ErrMeterChanged) {
		t.Fatalf("stopped %v, Run = %v; want ErrMeterChanged", stopped, run.err)
	}
	msg := run.err.Error()
	if strings.Contains(msg, "counts as") || !strings.Contains(msg, `no longer declares it (its state would be finalized and adjusted as an undeclared meter's, {"aggregation":"SUM"})`) {
		t.Fatalf("the error under StrictMeters: %v", run.err)
	}
}
