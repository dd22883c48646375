package aggregator

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/meterline/meterline/internal/stream"
	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/internal/topics"
	"github.com/meterline/meterline/schemas"
)

// TestNewRefusesCreateTimeEntitlements: with entitlements, an event is
// decided by the entitlements in effect at its arrival, by the broker
// timestamps of usage.entitlements (docs/entitlements.md, The ordering
// rule: broker time). With CreateTime those are their writers' clocks, so
// New refuses the topic with an error naming it, the setting and the fix,
// unless AllowCreateTime is set (then it warns once at start). Without
// entitlements the topic is not read, and a LogAppendTime topic needs no
// allowance. On kfake and, when METERLINE_TEST_KAFKA is set, on the real
// broker.
func TestNewRefusesCreateTimeEntitlements(t *testing.T) {
	t.Run("kfake", func(t *testing.T) {
		_, brokers := testenv.KFake(t)
		testNewRefusesCreateTimeEntitlements(t, brokers)
	})
	t.Run("real", func(t *testing.T) { testNewRefusesCreateTimeEntitlements(t, testenv.RealKafka(t)) })
}

func testNewRefusesCreateTimeEntitlements(t *testing.T, brokers []string) {
	h := newEntHarness(t, brokers, 1) // usage.entitlements with CreateTime
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	testenv.CreateTimeRefused(t, h.names.EntitlementsTopic(), func(allow bool, log *zap.Logger) error {
		cfg := h.entConfig("a", vfs.NewMem())
		cfg.AllowCreateTime, cfg.Stream.Logger = allow, log
		_, err := New(ctx, cfg)
		return err
	})

	cfg := h.config("a", vfs.NewMem()) // entitlements off
	cfg.AllowCreateTime = false
	if _, err := New(ctx, cfg); err != nil {
		t.Fatalf("New without entitlements: %v", err)
	}

	prod := newAggHarness(t, brokers, 1) // LogAppendTime, as in production
	cfg = prod.config("a", vfs.NewMem())
	cfg.Entitlements = true
	if _, err := New(ctx, cfg); err != nil {
		t.Fatalf("New on a LogAppendTime entitlements topic: %v", err)
	}

	// The deduped topic's timestamps bound the times of its records
	// (EntitlementsMaxAhead): with CreateTime they would be dedup's clock.
	testenv.AlterTopicConfigs(t, brokers, prod.names.DedupedTopic(), map[string]string{"message.timestamp.type": "CreateTime"})
	testenv.CreateTimeRefused(t, prod.names.DedupedTopic(), func(allow bool, log *zap.Logger) error {
		cfg := prod.config("a", vfs.NewMem())
		cfg.Entitlements, cfg.AllowCreateTime, cfg.Stream.Logger = true, allow, log
		_, err := New(ctx, cfg)
		return err
	})
}

// TestEntitlementsDedupClockBehind: dedup writes usage.deduped with its
// host's clock in the records' timestamps, here two hours behind the
// brokers, more than EntitlementsMaxAhead. The topic, created from the
// specs, uses LogAppendTime, so the broker stamps the records with its
// own time and the aggregator with entitlements decides the event and the
// watermark (docs/design.md: decisions use broker time, never a stage's
// wall clock) instead of rejecting them as too far ahead. On the real
// broker only: kfake keeps a record's CreateTime whatever the topic's
// message.timestamp.type.
func TestEntitlementsDedupClockBehind(t *testing.T) {
	brokers := testenv.RealKafka(t)
	testenv.InOneMonth(t, entMonthBefore, entMonthAfter)
	h := newAggHarness(t, brokers, 1) // the production layout: LogAppendTime
	now := time.Now()
	dedupClock := now.Add(-2 * time.Hour)
	ev := h.dedupedEvent(0, &schemas.DedupedEvent{EventID: "e1", CustomerID: "acme", Meter: "api_calls", Quantity: 1,
		EventTime: now.UnixMilli() - 500, IngestTime: now.UnixMilli()})
	ev.Timestamp = dedupClock
	wm := h.watermark(0, 0, 1, now.UnixMilli())
	wm.Timestamp = dedupClock
	h.produce(ev, wm)
	run := h.start(h.entConfig("a", vfs.NewMem()))
	h.caughtUp()
	deadline := time.Now().Add(20 * time.Second)
	for openValues(t, h)["acme/api_calls"] != 1 && len(readRejected(t, h)) == 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}
	for _, r := range readRejected(t, h) {
		t.Errorf("rejected %s (%s): %s", r.Reason, r.Stage, r.Detail)
	}
	if v := openValues(t, h)["acme/api_calls"]; v != 1 {
		t.Errorf("acme counted %d, want the event decided (1)", v)
	}
}

// TestNewRefusesDeletingChangelog: the aggregator's state (open
// aggregates, final periods, accounts) lives as long as its keys, so New
// refuses a changelog whose cleanup policy deletes records after a finite
// retention.
func TestNewRefusesDeletingChangelog(t *testing.T) {
	for _, c := range []struct {
		name    string
		brokers func(t testing.TB) []string
	}{
		{"kfake", func(t testing.TB) []string { _, b := testenv.KFake(t); return b }},
		{"real", testenv.RealKafka},
	} {
		t.Run(c.name, func(t *testing.T) {
			b := c.brokers(t)
			h := newAggHarness(t, b, 1)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			testenv.ShortChangelogRefused(t, b, h.names.AggregateChangelogTopic(), 0, func() error {
				_, err := New(ctx, h.config("a", vfs.NewMem()))
				return err
			})
		})
	}
}

// TestNewRefusesCompactedDeduped: usage.deduped is keyed by customer, so
// with compaction in its cleanup.policy the brokers keep only a customer's
// last event; an aggregator that lags, or reads the topic again after a
// reset, would bill the others as never sent. New refuses it with an error
// naming the topic, the setting and the fix (docs/operations.md, Topics).
func TestNewRefusesCompactedDeduped(t *testing.T) {
	t.Run("kfake", func(t *testing.T) {
		_, brokers := testenv.KFake(t)
		testNewRefusesCompactedDeduped(t, brokers)
	})
	t.Run("real", func(t *testing.T) { testNewRefusesCompactedDeduped(t, testenv.RealKafka(t)) })
}

func testNewRefusesCompactedDeduped(t *testing.T, brokers []string) {
	h := newAggHarness(t, brokers, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, policy := range []string{"compact", "delete,compact"} {
		testenv.AlterTopicConfigs(t, brokers, h.names.DedupedTopic(), map[string]string{"cleanup.policy": policy})
		_, err := New(ctx, h.config("a", vfs.NewMem()))
		var ce *topics.CompactedEventLogError
		if !errors.As(err, &ce) || ce.Topic != h.names.DedupedTopic() || ce.Stage != "aggregator" {
			t.Fatalf("cleanup.policy=%s: New returned %v, want a *topics.CompactedEventLogError naming %s", policy, err, h.names.DedupedTopic())
		}
		for _, want := range []string{h.names.DedupedTopic(), "cleanup.policy=" + policy, "kafka-configs.sh"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("error %q does not say %q", err, want)
			}
		}
	}
	testenv.AlterTopicConfigs(t, brokers, h.names.DedupedTopic(), map[string]string{"cleanup.policy": "delete"})
	if _, err := New(ctx, h.config("a", vfs.NewMem())); err != nil {
		t.Fatalf("New on a delete deduped topic: %v", err)
	}
}

// TestRunStopsOnCreateTimeAfterStart: New checks the message.timestamp.type
// of usage.deduped and usage.entitlements once; an operator who sets
// either to CreateTime while the aggregator runs would hand every writer
// the broker times of its records: an entitlement stamped three days back
// would decide events that arrived before it was written, an event's
// record would bound its time by dedup's clock. Once a partition of a
// topic has given a LogAppendTime record, a CreateTime record of it stops
// the stage before it is gated, decided or applied, naming the topic, the
// record and the fix, as dedup does; the state keeps that the partition
// had LogAppendTime records, so the stage started again (restored from the
// changelog on an empty store) stops at the same records after the
// setting is put back. On the real broker only: kfake keeps a record's
// CreateTime whatever the topic's message.timestamp.type
// (TestCheckArrivalLocal runs the check without a broker).
func TestRunStopsOnCreateTimeAfterStart(t *testing.T) {
	brokers := testenv.RealKafka(t)
	for _, topic := range []string{"deduped", "entitlements"} {
		t.Run(topic, func(t *testing.T) { testRunStopsOnCreateTime(t, brokers, topic == "deduped") })
	}
}

func testRunStopsOnCreateTime(t *testing.T, brokers []string, deduped bool) {
	testenv.InOneMonth(t, entMonthBefore, entMonthAfter)
	h := newAggHarness(t, brokers, 1) // LogAppendTime, as in production
	now := time.Now().UnixMilli()
	allow := schemas.Overdraft{Policy: schemas.OverdraftAllow}
	honest := []*kgo.Record{h.entitlement(1, &schemas.Entitlements{CustomerID: "acme", Plan: "free", Overdraft: allow}, now)}
	forged := h.entitlement(1, &schemas.Entitlements{CustomerID: "acme", Plan: "free", Overdraft: allow}, now-3*24*3600_000)
	topic := h.names.EntitlementsTopic()
	if deduped {
		honest = []*kgo.Record{h.dedupedEvent(0, &schemas.DedupedEvent{EventID: "honest", CustomerID: "acme", Meter: "api_calls", Quantity: 1,
			EventTime: now - 500, IngestTime: now}), h.watermark(0, 0, 1, now)}
		forged = h.dedupedEvent(0, &schemas.DedupedEvent{EventID: "forged", CustomerID: "acme", Meter: "api_calls", Quantity: 1000,
			EventTime: now - 500, IngestTime: now})
		forged.Timestamp = time.UnixMilli(now - 3*24*3600_000)
		topic = h.names.DedupedTopic()
	}
	r := h.start(h.entConfig("a", vfs.NewMem()))
	h.produce(honest...) // the broker stamps them LogAppendTime
	testenv.WaitCaughtUp(t, brokers, h.group, topic, time.Minute)
	testenv.AlterTopicConfigs(t, brokers, topic, map[string]string{"message.timestamp.type": "CreateTime"})
	time.Sleep(2 * time.Second) // the brokers apply the change
	h.produce(forged)

	wantStop := func(r *aggRunning, what string) {
		t.Helper()
		select {
		case <-r.done:
		case <-time.After(30 * time.Second):
			t.Fatalf("%s: the aggregator still runs after a CreateTime record in %s; open values %v", what, topic, openValues(t, h))
		}
		var te *topics.TimestampTypeError
		if !errors.As(r.err, &te) || te.Topic != topic || te.Have != "CreateTime" || te.Stage != "aggregator" {
			t.Fatalf("%s: Run = %v, want a *topics.TimestampTypeError naming %s", what, r.err, topic)
		}
		for _, want := range []string{"partition 0 offset", "changed while aggregator ran", "message.timestamp.type=LogAppendTime"} {
			if !strings.Contains(r.err.Error(), want) {
				t.Errorf("%s: error %q does not say %q", what, r.err, want)
			}
		}
		if v := openValues(t, h)["acme/api_calls"]; v >= 1000 {
			t.Errorf("%s: acme counted %d, want the forged event never counted", what, v)
		}
	}
	wantStop(r, "running")

	// Put back, the records written meanwhile keep their CreateTime.
	testenv.AlterTopicConfigs(t, brokers, topic, map[string]string{"message.timestamp.type": "LogAppendTime"})
	wantStop(h.start(h.entConfig("a", vfs.NewMem())), "started again")
}

// TestCheckArrivalLocal: the check of the records' timestamp types, on
// partition 0 of a stage with entitlements on stream.Local. A topic's
// CreateTime records pass until the partition has given one of its
// records stamped LogAppendTime (a topic set to LogAppendTime after it was
// created with CreateTime); a CreateTime record of that topic after it is
// a *topics.TimestampTypeError, whatever the other topic gives. The mark
// follows the committed state: set in a transaction that aborts, it is
// gone (the record that set it is read again), and it is committed with
// the transaction that set it. AllowCreateTime checks nothing.
func TestCheckArrivalLocal(t *testing.T) {
	names := topics.DefaultNames()
	names.Prefix = "local."
	for _, allow := range []bool{false, true} {
		pr := procBenchProcessor(t, names, true)
		pr.cfg.AllowCreateTime = allow
		o := &openCapture{processor: pr}
		l, err := stream.NewLocal(o, 0, names.DedupedTopic())
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		off := map[string]int64{}
		rec := func(topic string, logAppend bool) *kgo.Record {
			var v []byte
			if topic == names.DedupedTopic() {
				v = schemas.MustEncode(&schemas.Watermark{SourcePartition: 0, SourcePartitions: 1, Watermark: procBenchNow.UnixMilli()})
			} else {
				v = schemas.MustEncode(&schemas.Tick{})
			}
			r := &kgo.Record{Topic: topic, Offset: off[topic], Value: v, Timestamp: procBenchNow}
			if logAppend {
				r.Attrs = kgo.NewRecordAttrs(kgo.RecordAttrsOpts{TimestampType: 1})
			}
			off[topic]++
			return r
		}
		process := func(what string, r *kgo.Record, wantStop bool) {
			t.Helper()
			err := l.Process([]*kgo.Record{r})
			var te *topics.TimestampTypeError
			switch stop := wantStop && !allow; {
			case stop && (!errors.As(err, &te) || te.Topic != r.Topic || te.Record != fmt.Sprintf("partition 0 offset %d", r.Offset)):
				t.Fatalf("allow %v: %s: Process = %v, want a *topics.TimestampTypeError naming %s and offset %d", allow, what, err, r.Topic, r.Offset)
			case !stop && err != nil:
				t.Fatalf("allow %v: %s: Process = %v, want nil", allow, what, err)
			}
		}
		ent, ded := names.EntitlementsTopic(), names.DedupedTopic()
		process("CreateTime before any LogAppendTime", rec(ent, false), false)
		process("CreateTime before any LogAppendTime", rec(ded, false), false)
		process("LogAppendTime", rec(ent, true), false)
		process("CreateTime of the other topic", rec(ded, false), false)
		if err := l.Commit(); err != nil {
			t.Fatal(err)
		}
		process("LogAppendTime, aborted", rec(ded, true), false)
		l.Abort()
		process("CreateTime after an aborted LogAppendTime", rec(ded, false), false)
		process("CreateTime after a committed LogAppendTime", rec(ent, false), true)
		l.Abort()
		process("LogAppendTime", rec(ded, true), false)
		if err := l.Commit(); err != nil {
			t.Fatal(err)
		}
		process("CreateTime after a committed LogAppendTime", rec(ded, false), true)
	}
}
