package dedup

import (
	"encoding/binary"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/internal/fault"
	"github.com/meterline/meterline/internal/stream"
	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/schemas"
)

// forgedBatch is an uncompressed batch of one record whose offset delta,
// 5, points past the batch: Kafka stores it as written, and the Kafka
// client reads its record at its offset + 5, dropping the 5 records after
// it, which other producers wrote (docs/design.md, Bad input).
func forgedBatch() []byte {
	body := []byte{0}                   // attributes
	body = binary.AppendVarint(body, 0) // timestamp delta
	body = binary.AppendVarint(body, 5) // offset delta
	body = binary.AppendVarint(body, -1)
	body = binary.AppendVarint(body, 7)
	body = append(body, "hostile"...)
	body = binary.AppendVarint(body, 0)
	return testenv.RecordBatch(kgo.CodecNone, append(binary.AppendVarint(nil, int64(len(body))), body...))
}

// forgedAfter is how many events follow the forged batch.
const forgedAfter = 6

// produceForged writes the forged batch at offset 1 of partition 0,
// after one event, and forgedAfter events after it; wait, when set, is
// called after each write (a stage that reads as they come).
func produceForged(t *testing.T, h *harness, wait func()) {
	arr := time.Now().UnixMilli()
	h.produce(h.event("acme", "api_calls", "before-the-batch", 1, arr-hour, arr))
	wait()
	testenv.ProduceBatch(t, h.brokers, h.names.EventsTopic(), 0, forgedBatch())
	wait()
	for i := range forgedAfter {
		h.produce(h.event("acme", "api_calls", fmt.Sprintf("after-%d", i), 1, arr-hour, arr))
	}
}

// checkForged checks the outputs: the forged batch at offset 1 rejected
// once as undecodable, naming its offsets and what is wrong, and every
// event around it forwarded once.
func checkForged(t *testing.T, h *harness) {
	t.Helper()
	o := h.outputs()
	ids := o.byID()
	for _, id := range []string{"before-the-batch", "after-0", "after-1", "after-2", "after-3", "after-4", "after-5"} {
		if ids[id] != 1 {
			t.Errorf("%s forwarded %d times, want 1 (forwarded: %v)", id, ids[id], ids)
		}
	}
	if len(o.rejected) != 1 || o.rejected[0].Reason != schemas.ReasonUndecodable || o.rejected[0].SourceOffset != 1 {
		t.Fatalf("rejected %s, want the batch at offset 1 as %s", rejections(o.rejected), schemas.ReasonUndecodable)
	}
	const want = "record batch ending at offset 1 is malformed: record 0 has offset delta 5 (the batch's deltas run from 0 to 0); its records from offset 1 not decoded, skipped"
	if rej := o.rejected[0]; rej.Stage != "dedup" || rej.SourceTopic != h.names.EventsTopic() || rej.SourcePartition != 0 || rej.Detail != want {
		t.Errorf("rejection %+v, want stage dedup, source %s/0 and detail %q", rej, h.names.EventsTopic(), want)
	}
}

// TestForgedOffsetDelta: a producer's uncompressed batch whose record's
// offset delta points past it, written before dedup starts, and while it
// reads at the end of the log (where the Kafka client asked next for an
// offset past the log's end, and the stage stopped on OFFSET_OUT_OF_RANGE)
// is rejected as undecodable, and every event after it, which the client
// dropped, is forwarded once.
func TestForgedOffsetDelta(t *testing.T) { onBrokers(t, testForgedOffsetDelta) }

func testForgedOffsetDelta(t *testing.T, brokers []string) {
	for _, running := range []bool{false, true} {
		t.Run(fmt.Sprintf("running=%v", running), func(t *testing.T) {
			h := newHarnessWith(t, brokers, 1, "LogAppendTime")
			if brokers == nil {
				h = newHarness(t, nil, 1)
			}
			cfg := untickedBombConfig(h)
			if !running {
				produceForged(t, h, func() {})
				waitBombCaughtUp(t, h, h.start(cfg))
				checkForged(t, h)
				return
			}
			r := h.start(cfg)
			produceForged(t, h, func() { waitBombCaughtUp(t, h, r) })
			waitBombCaughtUp(t, h, r)
			checkForged(t, h)
		})
	}
}

// TestForgedOffsetDeltaAborted: the transaction that rejects the forged
// batch and skips it does not commit, twice: the batch is found and
// rejected again, and in the end the rejection is there once and each
// event forwarded once.
func TestForgedOffsetDeltaAborted(t *testing.T) {
	c, brokers := testenv.KFake(t)
	h := newHarness(t, brokers, 1)
	reg := prometheus.NewRegistry()
	cfg := untickedBombConfig(h)
	cfg.Stream.Registerer = reg
	r := h.start(cfg)
	refused := refuseCommitsPast(c, h, 1, 2)
	produceForged(t, h, func() { waitBombCaughtUp(t, h, r) })
	waitBombCaughtUp(t, h, r)
	if n := refused(); n != 2 {
		t.Errorf("%d commits past the batch refused, want 2", n)
	}
	checkForged(t, h)
	if got := metricValues(t, reg, "meterline_rejected_total")["reason=undecodable,stage=dedup"]; got != 1 {
		t.Errorf("meterline_rejected_total{stage=dedup,reason=undecodable} = %v, want 1", got)
	}
}

// TestRealForgedOffsetDeltaCrash: on a real broker, dedup crashes at each
// crash point of the transaction that rejects the forged batch and skips
// it (before and after its commit, while and after its state is applied)
// and restarts on its state: the forged batch is rejected once and each
// event forwarded once.
func TestRealForgedOffsetDeltaCrash(t *testing.T) {
	brokers := testenv.RealKafka(t)
	fault.SetHandler(fault.CrashHandler)
	t.Cleanup(func() { fault.SetHandler(nil); _ = fault.Arm("") })
	for _, point := range []string{fault.BeforeCommit, fault.AfterCommit, fault.DuringApply, fault.AfterApply} {
		t.Run(point, func(t *testing.T) {
			h := newHarnessWith(t, brokers, 1, "LogAppendTime")
			produceForged(t, h, func() {})
			if err := fault.Arm(point + "@1"); err != nil {
				t.Fatal(err)
			}
			fs := vfs.NewMem()
			cfg := untickedBombConfig(h)
			cfg.Stream.FS = fs
			a := h.start(cfg)
			if err, done := a.wait(time.Minute); !done || !errors.Is(err, stream.ErrCrashed) {
				t.Fatalf("the stage did not crash at %s (err %v)", point, err)
			}
			_ = fault.Arm("")
			cfg = untickedBombConfig(h)
			cfg.Stream.FS = fs
			waitBombCaughtUp(t, h, h.start(cfg))
			checkForged(t, h)
		})
	}
}
