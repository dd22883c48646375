package aggregator

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/internal/topics"
)

// TestNewRefusesCreateTimeEntitlements: with entitlements, an event is
// decided by the entitlements in effect at its arrival, by the broker
// timestamps of usage.entitlements (DESIGN §12). With CreateTime those are
// their writers' clocks, so New refuses the topic with an error naming it,
// the setting and the fix, unless AllowCreateTime is set (then it warns
// once at start). Without entitlements the topic is not read, and a
// LogAppendTime topic needs no allowance. On kfake and, when
// METERLINE_TEST_KAFKA is set, on the real broker.
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

	cfg := h.entConfig("a", vfs.NewMem())
	cfg.AllowCreateTime = false
	_, err := New(ctx, cfg)
	var te *topics.TimestampTypeError
	if !errors.As(err, &te) || te.Topic != h.names.EntitlementsTopic() || te.Have != "CreateTime" {
		t.Fatalf("New on a CreateTime entitlements topic: %v, want a *topics.TimestampTypeError naming %s", err, h.names.EntitlementsTopic())
	}
	for _, want := range []string{h.names.EntitlementsTopic(), "message.timestamp.type=CreateTime", "LogAppendTime", "--allow-create-time"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}

	cfg = h.config("a", vfs.NewMem()) // entitlements off
	cfg.AllowCreateTime = false
	if _, err := New(ctx, cfg); err != nil {
		t.Fatalf("New without entitlements: %v", err)
	}

	core, logs := observer.New(zap.WarnLevel)
	cfg = h.entConfig("a", vfs.NewMem())
	cfg.AllowCreateTime = true
	cfg.Stream.Logger = zap.New(core)
	if _, err := New(ctx, cfg); err != nil {
		t.Fatalf("New with AllowCreateTime: %v", err)
	}
	if n := logs.FilterField(zap.String("topic", h.names.EntitlementsTopic())).FilterMessageSnippet("LogAppendTime").Len(); n != 1 {
		t.Errorf("%d warnings naming the topic, want 1: %v", n, logs.All())
	}

	prod := newAggHarness(t, brokers, 1) // LogAppendTime, as in production
	cfg = prod.config("a", vfs.NewMem())
	cfg.Entitlements = true
	if _, err := New(ctx, cfg); err != nil {
		t.Fatalf("New on a LogAppendTime entitlements topic: %v", err)
	}
}
