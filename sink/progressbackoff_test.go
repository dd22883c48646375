package sink

import (
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/meterline/meterline/internal/testenv"
)

// TestProgressFailureBacksOff: ClickHouse cannot take a window's progress
// (sink_progress) while the window holds no row, as when it is down on a
// quiet night and only dedup's watermark records arrive. The sink backs
// off as it does for an INSERT of rows (docs/operations.md, Outages,
// "ClickHouse unavailable"): blocked, not ready, naming sink_progress,
// committing nothing, and it neither aborts a transaction at every commit
// interval nor logs a rebalance that did not happen. Once ClickHouse takes
// the progress again, the window commits.
func TestProgressFailureBacksOff(t *testing.T) {
	e := newEnv(t, 1)
	topic := e.names.DedupedTopic()
	e.produce(deduped(topic, 0, 0, base), deduped(topic, 0, 1, base.Add(time.Second)))
	core, logs := observer.New(zapcore.InfoLevel)
	r := e.start(func(c *Config) { c.Logger = zap.New(core) })
	e.waitCaughtUp(time.Minute, topic)
	e.exact(TableEvents, 2)

	e.exec("ALTER TABLE " + e.db + ".sink_progress ADD COLUMN poison UInt8 MATERIALIZED throwIf(next_offset > 0)")
	before := e.committed(topic)[0]
	e.produce(watermark(topic, 0, base.Add(2*time.Second)), watermark(topic, 0, base.Add(3*time.Second)))
	deadline := time.Now().Add(30 * time.Second)
	for metric(t, r.reg, "meterline_sink_blocked") != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("meterline_sink_blocked stayed 0 while sink_progress refused the window's progress; %v transactions aborted",
				metric(t, r.reg, "meterline_sink_transactions_total", "outcome", "aborted"))
		}
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(3 * time.Second) // ten commit intervals
	if err := r.w.Ready(); err == nil || !strings.Contains(err.Error(), "sink_progress") {
		t.Errorf("Ready() = %v, want it to name sink_progress", err)
	}
	if got := metric(t, r.reg, "meterline_sink_transactions_total", "outcome", "aborted"); got != 0 {
		t.Errorf("%v transactions aborted while the progress could not be recorded, want 0 (back off, commit nothing)", got)
	}
	if c := e.committed(topic)[0]; c != before {
		t.Fatalf("committed offset moved from %d to %d without its progress recorded", before, c)
	}
	for _, l := range logs.All() {
		if strings.Contains(l.Message, "rebalanced") {
			t.Errorf("logged %q, but the group did not rebalance", l.Message)
		}
	}

	e.exec("ALTER TABLE " + e.db + ".sink_progress DROP COLUMN poison")
	testenv.WaitCaughtUp(t, e.brokers, e.group, topic, time.Minute)
	deadline = time.Now().Add(30 * time.Second)
	for metric(t, r.reg, "meterline_sink_blocked") != 0 || r.w.Ready() != nil {
		if time.Now().After(deadline) {
			t.Fatalf("still blocked after sink_progress takes rows again: %v", r.w.Ready())
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	e.exact(TableEvents, 2)
}
