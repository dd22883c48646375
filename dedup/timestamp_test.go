package dedup

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
)

// TestNewRefusesCreateTimeEvents: dedup takes a usage.events record's
// timestamp as its arrival (docs/design.md, Time). With CreateTime that is
// the producer's clock, so New refuses the topic with an error naming it,
// the setting and the fix, unless AllowCreateTime is set (then it warns
// once at start); a LogAppendTime topic needs no allowance.
func TestNewRefusesCreateTimeEvents(t *testing.T) { onBrokers(t, testNewRefusesCreateTimeEvents) }

func testNewRefusesCreateTimeEvents(t *testing.T, brokers []string) {
	h := newHarness(t, brokers, 1) // usage.events with CreateTime
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	testenv.CreateTimeRefused(t, h.names.EventsTopic(), func(allow bool, log *zap.Logger) error {
		cfg := h.config("i1", vfs.NewMem())
		cfg.AllowCreateTime, cfg.Stream.Logger = allow, log
		_, err := New(ctx, cfg)
		return err
	})

	prod := newHarnessWith(t, brokers, 1, "LogAppendTime")
	cfg := prod.config("i1", vfs.NewMem())
	cfg.AllowCreateTime = false
	if _, err := New(ctx, cfg); err != nil {
		t.Fatalf("New on a LogAppendTime events topic: %v", err)
	}
}

// TestNewRefusesShortChangelog: dedup may need a key up to W + S + B
// after its first arrival, and a restore reads it from the changelog; New
// refuses a changelog whose retention deletes it sooner (docs/operations.md,
// Topics).
func TestNewRefusesShortChangelog(t *testing.T) {
	onBrokers(t, func(t *testing.T, brokers []string) {
		h := newHarness(t, brokers, 1)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		cfg := h.config("i1", vfs.NewMem())
		cfg.Window, cfg.Skew, cfg.Bucket = 48*time.Hour, time.Hour, 2*time.Hour
		testenv.ShortChangelogRefused(t, h.brokers, h.names.DedupChangelogTopic(), 51*time.Hour, func() error {
			_, err := New(ctx, cfg)
			return err
		})
	})
}

// TestNewRefusesCompactedEvents: dedup must read every record of
// usage.events; with compaction in its cleanup.policy the brokers keep only
// the last copy of each identity, so a dedup that lags would accept a later,
// conflicting copy in place of the first, and the tick of each instance
// only once. New refuses it with an error naming the topic, the setting and
// the fix (docs/operations.md, Topics).
func TestNewRefusesCompactedEvents(t *testing.T) {
	onBrokers(t, func(t *testing.T, brokers []string) {
		h := newHarnessWith(t, brokers, 1, "LogAppendTime")
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for _, policy := range []string{"compact", "compact,delete"} {
			testenv.AlterTopicConfigs(t, h.brokers, h.names.EventsTopic(), map[string]string{"cleanup.policy": policy})
			_, err := New(ctx, h.config("i1", vfs.NewMem()))
			var ce *topics.CompactedEventLogError
			if !errors.As(err, &ce) || ce.Topic != h.names.EventsTopic() {
				t.Fatalf("cleanup.policy=%s: New returned %v, want a *topics.CompactedEventLogError naming %s", policy, err, h.names.EventsTopic())
			}
			for _, want := range []string{h.names.EventsTopic(), "cleanup.policy=" + policy, "kafka-configs.sh", "cleanup.policy=delete"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not say %q", err, want)
				}
			}
		}
		testenv.AlterTopicConfigs(t, h.brokers, h.names.EventsTopic(), map[string]string{"cleanup.policy": "delete"})
		if _, err := New(ctx, h.config("i1", vfs.NewMem())); err != nil {
			t.Fatalf("New on a delete events topic: %v", err)
		}
	})
}

// TestRunStopsOnCreateTimeAfterStart: New checks usage.events' timestamp
// type once; an operator who sets it to CreateTime while dedup runs would
// hand every producer its records' arrival (the brokers bound it only an
// hour ahead, message.timestamp.after.max.ms, and not at all behind): an
// event stamped as arriving three days ago would be accepted with that
// arrival, which decides whether it is late, the period its adjustment is
// booked into (one already invoiced) and the entitlements that decide
// and price it. Once a partition has
// given a LogAppendTime record, a CreateTime record after it stops the
// stage before it is decided, naming the topic and the fix. On the real
// broker only: kfake keeps a record's CreateTime whatever the topic's
// message.timestamp.type.
func TestRunStopsOnCreateTimeAfterStart(t *testing.T) {
	h := newHarnessWith(t, testenv.RealKafka(t), 1, "LogAppendTime")
	r := h.start(h.config("i1", vfs.NewMem()))
	now := time.Now().UnixMilli()
	h.produce(h.event("c1", "api_calls", "honest", 1, now-hour, 0))
	h.caughtUp()

	testenv.AlterTopicConfigs(t, h.brokers, h.names.EventsTopic(), map[string]string{"message.timestamp.type": "CreateTime"})
	time.Sleep(2 * time.Second) // the brokers apply the change
	forged := now - 3*day
	h.produce(h.event("c1", "api_calls", "hostile", 1000, forged, forged+60_000))

	err, stopped := r.wait(30 * time.Second)
	if !stopped {
		t.Fatalf("dedup still runs after a CreateTime record in %s; deduped events %v", h.names.EventsTopic(), h.outputs().byID())
	}
	var te *topics.TimestampTypeError
	if !errors.As(err, &te) || te.Topic != h.names.EventsTopic() || te.Have != "CreateTime" {
		t.Fatalf("Run = %v, want a *topics.TimestampTypeError naming %s", err, h.names.EventsTopic())
	}
	for _, want := range []string{"partition 0 offset", "changed while dedup ran", "message.timestamp.type=LogAppendTime"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if got := h.outputs().byID(); got["hostile"] != 0 || got["honest"] != 1 {
		t.Fatalf("deduped events %v, want honest once and hostile never", got)
	}

	// Set back, the records written meanwhile keep their CreateTime: a
	// dedup started again, restoring its state from the changelog, stops
	// at them too.
	testenv.AlterTopicConfigs(t, h.brokers, h.names.EventsTopic(), map[string]string{"message.timestamp.type": "LogAppendTime"})
	r = h.start(h.config("i1", vfs.NewMem()))
	if err, stopped = r.wait(30 * time.Second); !stopped || !errors.As(err, &te) {
		t.Fatalf("dedup started again: stopped %v with %v, want a *topics.TimestampTypeError", stopped, err)
	}
	if got := h.outputs().byID(); got["hostile"] != 0 {
		t.Fatalf("deduped events %v after a restart, want hostile never", got)
	}
}
