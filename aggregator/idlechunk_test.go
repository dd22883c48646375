package aggregator

import (
	"fmt"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/schemas"
)

// TestFinalChunksAfterAbortedChunkWhileIdle: a period decided final goes
// out in chunks, one per transaction (Worker); a chunk's transaction is
// aborted (its TxnOffsetCommit fails as in a rebalance) after some FINAL
// revisions are out, and no input follows. The remaining chunks still go
// out: the partition's work does not wait for new input.
func TestFinalChunksAfterAbortedChunkWhileIdle(t *testing.T) {
	c, brokers := testenv.KFake(t)
	h := newAggHarnessSources(t, brokers, 1, 1)
	cfg := h.config("a", vfs.NewMem())
	cfg.Stream.Logger = zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel)).Named("a")
	cfg.Period, cfg.Grace = Day, time.Hour
	setFinalChunk(&cfg, 2)
	reg := prometheus.NewRegistry()
	cfg.Stream.Registerer = reg
	h.start(cfg)

	day := ms(t, "2026-05-04")
	const dayMs, hourMs = 24 * 3600 * 1000, 3600 * 1000
	const customers = 20
	for i := 0; i < customers; i++ {
		h.produce(h.dedupedEvent(0, &schemas.DedupedEvent{EventID: fmt.Sprint("e", i), CustomerID: fmt.Sprintf("c%02d", i), Meter: "m",
			Quantity: 1, EventTime: day + 1000, IngestTime: day + 2000}))
	}
	h.caughtUp()

	// Abort a chunk transaction once FINAL revisions went out: the
	// events are offsets 0–19 and the watermark 20, so the transactions
	// that commit past offset 20 are the one that decides the period
	// final and then one per chunk (and nothing else: no input follows).
	// The first two commit (the decision and at least one chunk of FINAL
	// revisions), the third is refused, and more chunks follow it (10 of
	// 2 revisions). Counted by the broker, not polled: a poll of the
	// output can see the last chunk before it arms.
	refused := testenv.RefuseCommitsPastSkipping(c, h.group, "", [16]byte{}, customers, 2, 1)
	h.produce(h.watermark(0, 0, 1, day+dayMs+hourMs+1))

	finals := func() int {
		n := 0
		for _, r := range readAggregates(t, h) {
			if r.Status == schemas.StatusFinal {
				n++
			}
		}
		return n
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		n := finals()
		if n == customers {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d FINAL revisions after 20s with no new input (commits refused: %v)", n, customers,
				counterOf(reg, "meterline_stream_commits_refused_total"))
		}
	}
	if refused() != 1 {
		t.Fatalf("%d commits refused, want 1: the test did not exercise an abort between chunks", refused())
	}
	if n := counterOf(reg, "meterline_stream_commits_refused_total"); n < 1 {
		t.Fatalf("no transaction was aborted (%v): the test did not exercise the abort", n)
	}
}
