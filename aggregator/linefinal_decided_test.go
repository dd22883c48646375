package aggregator

import (
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/meterline/meterline/internal/benchinput"
	"github.com/meterline/meterline/internal/stream"
	"github.com/meterline/meterline/internal/topics"
	"github.com/meterline/meterline/schemas"
)

// lineFinalProcessor is the aggregator's processor of one partition, daily
// periods, an hour of grace and FINAL revisions two a transaction.
func lineFinalProcessor(t *testing.T, names topics.Names) *processor {
	t.Helper()
	cat, err := ParseMeters([]byte(benchinput.Meters))
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Topics: names, Meters: cat, Period: Day, Grace: time.Hour, FinalChunk: 2}
	cfg.EnsureDefaults()
	return &processor{cfg: cfg, aggregatesTopic: cfg.Topics.AggregatesTopic(), log: zap.NewNop(),
		counts: partitionCountsT{events: 1, deduped: 1, aggregates: 1, adjustments: 1, rejected: 1, entitlements: 1, balances: 1},
		m:      newMetrics(prometheus.NewRegistry()), now: time.Now}
}

// TestLineFinalUpdatedAtIsTheDecision: a line with no usage of its own in
// a period P (only an adjustment booked into it, by an event of P − 1
// that arrived in P and is processed once P is final: a re-routed event,
// or a broker clock stepped back) gets its FINAL revision as of the
// watermark that decided P final, like P's other FINAL revisions, however
// far P's FINAL revisions had got in their chunks when the event came,
// and across a restart: the output of the same input is the same. The
// line's FINAL carried the watermark of the moment it was booked when P's
// FINALs were already out, and the decision's when they were still going.
func TestLineFinalUpdatedAtIsTheDecision(t *testing.T) {
	names := topics.DefaultNames()
	names.Prefix = "linefinal."
	topic := names.DedupedTopic()
	const dayMs, hourMs = 24 * 3600 * 1000, 3600 * 1000
	p := ms(t, "2026-05-04")
	rec := func(key []byte, m schemas.Message, at int64) *kgo.Record {
		return &kgo.Record{Topic: topic, Key: key, Value: schemas.MustEncode(m), Timestamp: time.UnixMilli(at)}
	}
	wm := func(w int64) *kgo.Record {
		return rec(nil, &schemas.Watermark{SourcePartition: 0, SourcePartitions: 1, Watermark: w}, w)
	}
	decided, later := p+dayMs+hourMs+1, p+dayMs+2*hourMs
	var usage []*kgo.Record
	for i := range 6 {
		c := fmt.Sprintf("c%d", i)
		usage = append(usage, rec(schemas.CustomerKey(c), &schemas.DedupedEvent{EventID: c, CustomerID: c, Meter: "tokens",
			Quantity: 1, EventTime: p + 1000, IngestTime: p + 2000}, p+2000))
	}
	late := rec(schemas.CustomerKey("late"), &schemas.DedupedEvent{EventID: "late", CustomerID: "late", Meter: "tokens",
		Quantity: 7, EventTime: p - dayMs + 1000, IngestTime: p + 5000}, later)

	run := func(t *testing.T, drain, restart bool) int64 {
		l, err := stream.NewLocal(lineFinalProcessor(t, names), 0, topic)
		if err != nil {
			t.Fatal(err)
		}
		l.Keep()
		step := func(recs ...*kgo.Record) {
			t.Helper()
			if err := l.Process(recs); err != nil {
				t.Fatal(err)
			}
			if err := l.Commit(); err != nil {
				t.Fatal(err)
			}
		}
		step(usage...)
		step(wm(decided)) // P final: its first chunk of FINALs
		step(wm(later))
		for drain && l.HasWork() {
			if _, err := l.Work(); err != nil {
				t.Fatal(err)
			}
			if err := l.Commit(); err != nil {
				t.Fatal(err)
			}
		}
		if restart {
			changelog := l.Changelog()
			l.Keep()
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			if l, err = stream.RestoreLocal(lineFinalProcessor(t, names), 0, topic, changelog); err != nil {
				t.Fatal(err)
			}
		}
		defer l.Close()
		step(late)
		for l.HasWork() {
			if _, err := l.Work(); err != nil {
				t.Fatal(err)
			}
			if err := l.Commit(); err != nil {
				t.Fatal(err)
			}
		}
		var at []int64
		for _, r := range l.TakeOutput() {
			if r.Topic != names.AggregatesTopic() {
				continue
			}
			m, err := schemas.Decode(r.Value)
			if err != nil {
				t.Fatal(err)
			}
			if a, ok := m.(*schemas.Aggregate); ok && a.CustomerID == "late" && a.PeriodStart == p && a.Status == schemas.StatusFinal {
				at = append(at, a.UpdatedAt)
			}
		}
		if len(at) != 1 {
			t.Fatalf("%d FINAL revisions of the line, want 1", len(at))
		}
		return at[0]
	}
	for _, c := range []struct {
		name           string
		drain, restart bool
	}{{"FINALs going out", false, false}, {"FINALs out", true, false}, {"FINALs out, restarted", true, true}} {
		t.Run(c.name, func(t *testing.T) {
			if got := run(t, c.drain, c.restart); got != decided {
				t.Errorf("the line's FINAL is as of %s, want %s (the watermark that decided the period)", msTime(got), msTime(decided))
			}
		})
	}
}
