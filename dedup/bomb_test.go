package dedup

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/meterline/meterline/internal/fault"
	"github.com/meterline/meterline/internal/stream"
	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/schemas"
)

// TestDecompressionBomb: a batch that decompresses past the client's bound
// (stream.Config.MaxDecompressBatchBytes; a real broker accepts a 229 KB
// zstd batch of 1.1 GB) is bad input, not a stop (docs/design.md, Bad
// input): dedup rejects it as oversized, naming its offsets, and goes on
// past it.
func TestDecompressionBomb(t *testing.T) {
	h := newHarness(t, nil, 1)
	testenv.ProduceBatch(t, h.brokers, h.names.EventsTopic(), 0, testenv.ZstdBomb(t, 4<<20))
	arr := time.Now().UnixMilli()
	h.produce(h.event("acme", "api_calls", "after-the-batch", 1, arr-hour, arr))
	r := h.start(bombConfig(h))
	waitBombCaughtUp(t, h, r)
	checkBomb(t, h, 0)
}

// TestDecompressionBombAborted: the transaction that rejects the batch and
// skips it does not commit, twice (an abortable TxnOffsetCommit error, as
// in a rebalance), on a partition the group has no offset of yet, and on
// one it has. The skip commits only with the rejection: the batch is
// fetched and rejected again, and in the end the rejection is there once
// and the event after it forwarded once.
func TestDecompressionBombAborted(t *testing.T) {
	for _, committed := range []bool{false, true} {
		t.Run(fmt.Sprintf("committed=%v", committed), func(t *testing.T) {
			c, brokers := testenv.KFake(t)
			h := newHarness(t, brokers, 1)
			arr := time.Now().UnixMilli()
			var at int64 // the batch's offset
			reg := prometheus.NewRegistry()
			cfg := untickedBombConfig(h)
			cfg.Stream.Registerer = reg
			r := h.start(cfg)
			if committed {
				h.produce(h.event("acme", "api_calls", "before-the-batch", 1, arr-hour, arr))
				waitBombCaughtUp(t, h, r)
				at = 1
			}
			refused := refuseCommitsPast(c, h, at, 2)
			testenv.ProduceBatch(t, h.brokers, h.names.EventsTopic(), 0, testenv.ZstdBomb(t, 4<<20))
			h.produce(h.event("acme", "api_calls", "after-the-batch", 1, arr-hour, arr))
			waitBombCaughtUp(t, h, r)
			if n := refused(); n != 2 {
				t.Errorf("%d commits past the batch refused, want 2", n)
			}
			checkBomb(t, h, at)
			if got := metricValues(t, reg, "meterline_rejected_total")["reason=oversized,stage=dedup"]; got != 1 {
				t.Errorf("meterline_rejected_total{stage=dedup,reason=oversized} = %v, want 1", got)
			}
		})
	}
}

// TestDecompressionBombLast: a batch past the bound with nothing after it,
// on a partition whose group has an offset: its transaction commits the
// offset past it (the state's), and a restart on the state finds the two
// agree (docs/design.md, Exactly-once, 6).
func TestDecompressionBombLast(t *testing.T) {
	h := newHarness(t, nil, 1)
	fs := vfs.NewMem()
	cfg := untickedBombConfig(h)
	cfg.Stream.FS = fs
	r := h.start(cfg)
	arr := time.Now().UnixMilli()
	h.produce(h.event("acme", "api_calls", "before-the-batch", 1, arr-hour, arr))
	waitBombCaughtUp(t, h, r)
	testenv.ProduceBatch(t, h.brokers, h.names.EventsTopic(), 0, testenv.ZstdBomb(t, 4<<20))
	waitBombCaughtUp(t, h, r)
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	h.produce(h.event("acme", "api_calls", "after-the-batch", 1, arr-hour, arr))
	waitBombCaughtUp(t, h, h.start(cfg))
	checkBomb(t, h, 1)
}

// TestDecompressionBombsAborted: two batches past the bound, one after the
// other, on a partition the group has no offset of, and three commits past
// the first refused: each batch rejected once, the event after them
// forwarded once.
func TestDecompressionBombsAborted(t *testing.T) {
	c, brokers := testenv.KFake(t)
	h := newHarness(t, brokers, 1)
	refused := refuseCommitsPast(c, h, 0, 3)
	testenv.ProduceBatch(t, h.brokers, h.names.EventsTopic(), 0, testenv.ZstdBomb(t, 4<<20))
	testenv.ProduceBatch(t, h.brokers, h.names.EventsTopic(), 0, testenv.ZstdBomb(t, 4<<20))
	arr := time.Now().UnixMilli()
	h.produce(h.event("acme", "api_calls", "after-the-batches", 1, arr-hour, arr))
	waitBombCaughtUp(t, h, h.start(bombConfig(h)))
	if n := refused(); n != 3 {
		t.Errorf("%d commits past the first batch refused, want 3", n)
	}
	o := h.outputs()
	if n := o.byID()["after-the-batches"]; n != 1 {
		t.Errorf("the event after the batches forwarded %d times, want 1", n)
	}
	if len(o.rejected) != 2 || o.rejected[0].SourceOffset != 0 || o.rejected[1].SourceOffset != 1 {
		t.Errorf("rejected %s, want the batches at offsets 0 and 1, once each", rejections(o.rejected))
	}
}

// rejections describes rejections by offset and reason, for a failure
// message.
func rejections(rs []*schemas.Rejected) string {
	var b strings.Builder
	for _, r := range rs {
		fmt.Fprintf(&b, "[offset %d %s: %s]", r.SourceOffset, r.Reason, r.Detail)
	}
	return b.String()
}

// refuseCommitsPast refuses, as in a rebalance, the first n
// TxnOffsetCommits of h's group that commit partition 0 past offset at
// (testenv.RefuseCommitsPast).
func refuseCommitsPast(c *kfake.Cluster, h *harness, at int64, n int) func() int {
	return testenv.RefuseCommitsPast(c, h.group, "", [16]byte{}, at, n)
}

// TestDecompressionBombCrash: the stage crashes before the commit of its
// first and of its second transaction, and restarts on its state: the
// batch is rejected once and the event after it forwarded once.
func TestDecompressionBombCrash(t *testing.T) { testBombCrash(t, nil, "CreateTime") }

// TestRealDecompressionBombCrash is TestDecompressionBombCrash on a real
// broker (a LogAppendTime topic, as usage.events is), whose next session
// aborts the crashed one's open transaction.
func TestRealDecompressionBombCrash(t *testing.T) {
	testBombCrash(t, testenv.RealKafka(t), "LogAppendTime")
}

func testBombCrash(t *testing.T, brokers []string, ts string) {
	fault.SetHandler(fault.CrashHandler)
	t.Cleanup(func() { fault.SetHandler(nil); _ = fault.Arm("") })
	for _, hit := range []string{"@1", "@2"} {
		t.Run(hit, func(t *testing.T) {
			h := newHarnessWith(t, brokers, 1, ts)
			testenv.ProduceBatch(t, h.brokers, h.names.EventsTopic(), 0, testenv.ZstdBomb(t, 4<<20))
			arr := time.Now().UnixMilli()
			h.produce(h.event("acme", "api_calls", "after-the-batch", 1, arr-hour, arr))
			if err := fault.Arm(fault.BeforeCommit + hit); err != nil {
				t.Fatal(err)
			}
			fs := vfs.NewMem()
			cfg := bombConfig(h)
			cfg.Stream.FS = fs
			a := h.start(cfg)
			if err, done := a.wait(time.Minute); !done || !errors.Is(err, stream.ErrCrashed) {
				t.Fatalf("the stage did not crash before the commit (err %v)", err)
			}
			_ = fault.Arm("")
			cfg = bombConfig(h)
			cfg.Stream.FS = fs
			waitBombCaughtUp(t, h, h.start(cfg))
			checkBomb(t, h, 0)
		})
	}
}

// TestZstdLargeWindow: an event in a zstd frame that declares a window of
// 2^27 bytes (the largest the reference decoder accepts by default) is
// forwarded at the default bound: the zstd decoder refuses a frame whose
// window exceeds the bound with an error of its own, not as a batch past
// the bound, and that would stop the stage.
func TestZstdLargeWindow(t *testing.T) {
	h := newHarness(t, nil, 1)
	arr := time.Now().UnixMilli()
	ev := h.event("acme", "api_calls", "in-a-large-window", 1, arr-hour, arr)
	testenv.ProduceBatch(t, h.brokers, h.names.EventsTopic(), ev.Partition, testenv.ZstdRecordBatch(testenv.ZstdFrame(27, testenv.EncodeRecord(ev.Key, ev.Value))))
	r := h.start(h.config("a", vfs.NewMem()))
	waitBombCaughtUp(t, h, r)
	o := h.outputs()
	if n := o.byID()["in-a-large-window"]; n != 1 || len(o.rejected) != 0 {
		t.Errorf("the event forwarded %d times, %d rejections; want it forwarded once", n, len(o.rejected))
	}
}

// bombConfig is dedup's config with a decompression bound of 1 MiB.
func bombConfig(h *harness) Config {
	cfg := h.config("a", vfs.NewMem())
	cfg.Stream.MaxDecompressBatchBytes = 1 << 20
	return cfg
}

// untickedBombConfig is bombConfig with only the test's records on
// usage.events, for a stage started before the batch is written: a tick
// (appended every TickInterval, docs/design.md, Time) that lands before
// the batch moves it past the offset the test names and refuses commits
// past, and one after it leaves the batch not last.
func untickedBombConfig(h *harness) Config {
	cfg := bombConfig(h)
	cfg.TickInterval = time.Hour
	return cfg
}

// waitBombCaughtUp waits until the group has committed the end of
// usage.events, or fails if the stage stopped.
func waitBombCaughtUp(t *testing.T, h *harness, r *running) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		ok, err := testenv.CaughtUp(h.brokers, h.group, h.names.EventsTopic())
		if err == nil && ok {
			return
		}
		if err, done := r.wait(0); done {
			t.Fatalf("dedup stopped: %v", err)
		}
		if time.Now().After(deadline) {
			t.Fatal("dedup did not catch up")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// checkBomb checks the outputs: the batch at offset at rejected once as
// oversized, naming its offsets and the bound, and the event after it
// forwarded once.
func checkBomb(t *testing.T, h *harness, at int64) {
	t.Helper()
	o := h.outputs()
	if n := o.byID()["after-the-batch"]; n != 1 {
		t.Errorf("the event after the batch forwarded %d times, want 1", n)
	}
	if len(o.rejected) != 1 || o.rejected[0].Reason != schemas.ReasonOversized || o.rejected[0].SourceOffset != at {
		t.Fatalf("rejected %s, want the batch at offset %d as %s", rejections(o.rejected), at, schemas.ReasonOversized)
	}
	rej := o.rejected[0]
	want := fmt.Sprintf("record batch at offsets %d to %d decompresses to more than 1048576 bytes with its decoded records; not decoded, skipped", at, at)
	if rej.Stage != "dedup" || rej.SourceTopic != h.names.EventsTopic() || rej.SourcePartition != 0 || rej.Detail != want {
		t.Errorf("rejection %+v, want stage dedup, source %s/0 and detail %q", rej, h.names.EventsTopic(), want)
	}
}

// TestRealDecompressionBomb: on a real broker (a LogAppendTime topic, as
// usage.events is), a zstd batch of a few KB that decompresses to 256 MiB
// is accepted, and dedup at its default bound rejects it and forwards the
// event after it.
func TestRealDecompressionBomb(t *testing.T) {
	h := newHarnessWith(t, testenv.RealKafka(t), 1, "LogAppendTime")
	bomb := testenv.ZstdBomb(t, 256<<20)
	t.Logf("the batch is %d bytes", len(bomb))
	testenv.ProduceBatch(t, h.brokers, h.names.EventsTopic(), 0, bomb)
	arr := time.Now().UnixMilli()
	h.produce(h.event("acme", "api_calls", "after-the-batch", 1, arr-hour, arr))
	r := h.start(h.config("a", vfs.NewMem()))
	waitBombCaughtUp(t, h, r)
	o := h.outputs()
	if n := o.byID()["after-the-batch"]; n != 1 {
		t.Errorf("the event after the batch forwarded %d times, want 1", n)
	}
	want := fmt.Sprintf("record batch at offsets 0 to 0 decompresses to more than %d bytes with its decoded records; not decoded, skipped", stream.DefaultMaxDecompressBatchBytes)
	if len(o.rejected) != 1 || o.rejected[0].Reason != schemas.ReasonOversized || o.rejected[0].SourceOffset != 0 || o.rejected[0].Detail != want {
		t.Fatalf("rejected %+v, want the batch at offset 0 as %s", o.rejected, schemas.ReasonOversized)
	}
}
