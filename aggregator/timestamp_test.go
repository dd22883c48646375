package aggregator

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"go.uber.org/zap"

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
