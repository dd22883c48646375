package dedup

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/meterline/meterline/internal/topics"
)

// TestNewRefusesCreateTimeEvents: dedup takes a usage.events record's
// timestamp as its arrival (DESIGN §3). With CreateTime that is the
// producer's clock, so New refuses the topic with an error naming it, the
// setting and the fix, unless AllowCreateTime is set (then it warns once at
// start); a LogAppendTime topic needs no allowance.
func TestNewRefusesCreateTimeEvents(t *testing.T) { onBrokers(t, testNewRefusesCreateTimeEvents) }

func testNewRefusesCreateTimeEvents(t *testing.T, brokers []string) {
	h := newHarness(t, brokers, 1) // usage.events with CreateTime
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	cfg := h.config("i1", vfs.NewMem())
	cfg.AllowCreateTime = false
	_, err := New(ctx, cfg)
	var te *topics.TimestampTypeError
	if !errors.As(err, &te) || te.Topic != h.names.EventsTopic() || te.Have != "CreateTime" {
		t.Fatalf("New on a CreateTime events topic: %v, want a *topics.TimestampTypeError naming %s", err, h.names.EventsTopic())
	}
	for _, want := range []string{h.names.EventsTopic(), "message.timestamp.type=CreateTime", "LogAppendTime", "--allow-create-time"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}

	core, logs := observer.New(zap.WarnLevel)
	cfg = h.config("i1", vfs.NewMem())
	cfg.AllowCreateTime = true
	cfg.Stream.Logger = zap.New(core)
	if _, err := New(ctx, cfg); err != nil {
		t.Fatalf("New with AllowCreateTime: %v", err)
	}
	if n := logs.FilterField(zap.String("topic", h.names.EventsTopic())).FilterMessageSnippet("LogAppendTime").Len(); n != 1 {
		t.Errorf("%d warnings naming the topic, want 1: %v", n, logs.All())
	}

	prod := newHarnessWith(t, brokers, 1, "LogAppendTime")
	cfg = prod.config("i1", vfs.NewMem())
	cfg.AllowCreateTime = false
	if _, err := New(ctx, cfg); err != nil {
		t.Fatalf("New on a LogAppendTime events topic: %v", err)
	}
}
