package dedup

import (
	"context"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"go.uber.org/zap"

	"github.com/meterline/meterline/internal/testenv"
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
