package aggregator

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/schemas"
)

// TestDecompressionBombInInputs: a batch of usage.entitlements or of
// usage.deduped that decompresses past the bound is bad input, not a stop
// (docs/design.md, Bad input): the aggregator rejects it as oversized,
// naming its topic and offsets, skips it in the same transaction and goes
// on: the customer's plan written before the batch of usage.entitlements
// still decides its events, and the events after the batch of
// usage.deduped are counted once.
//
// Each case runs twice: the batch of usage.entitlements is fetched after
// the one of usage.deduped is skipped in about half of the runs, and
// skipping it must not drop the other's error (oversized.go in
// internal/stream).
func TestDecompressionBombInInputs(t *testing.T) {
	for _, run := range []struct{ aborts, round int }{{0, 1}, {0, 2}, {2, 1}, {2, 2}} {
		aborts := run.aborts
		t.Run(fmt.Sprintf("aborts=%d/%d", aborts, run.round), func(t *testing.T) {
			c, brokers := testenv.KFake(t)
			testBombInInputs(t, brokers, func(h *aggHarness) func() int { return refuseAggCommitsPast(c, h, 0, aborts) }, aborts)
		})
	}
}

// TestRealDecompressionBombInInputs is TestDecompressionBombInInputs on a
// real broker, which accepts both batches.
func TestRealDecompressionBombInInputs(t *testing.T) {
	testBombInInputs(t, testenv.RealKafka(t), nil, 0)
}

// TestDecompressionBombWithoutEntitlements: the aggregator without
// entitlements rejects a batch of usage.deduped past the bound and counts
// the events after it once.
func TestDecompressionBombWithoutEntitlements(t *testing.T) {
	h := newAggHarness(t, nil, 1)
	testenv.ProduceBatch(t, h.brokers, h.names.DedupedTopic(), 0, testenv.ZstdBomb(t, 4<<20))
	h.produce(h.acmeEvents(0, "m1", 0, 8)...)
	cfg := h.config("a", vfs.NewMem())
	cfg.Stream.MaxDecompressBatchBytes = 1 << 20
	run := h.start(cfg)
	waitAggCaughtUp(t, h, run)
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}
	if got := openValues(t, h)["acme/m1"]; got != 8 {
		t.Errorf("acme counted %d, want 8", got)
	}
	rej := readRejected(t, h)
	if len(rej) != 1 || rej[0].Reason != schemas.ReasonOversized || rej[0].SourceOffset != 0 || rej[0].SourceTopic != h.names.DedupedTopic() {
		t.Errorf("rejected %+v, want the batch at offset 0 of usage.deduped as oversized", rej)
	}
}

// testBombInInputs writes acme's plan (a cap of 5), a batch past the bound
// to each input and 8 events, and runs the aggregator with a bound of 1
// MiB; refuse, if not nil, makes the first aborts commits past the batch of
// usage.deduped abort.
func testBombInInputs(t *testing.T, brokers []string, refuse func(*aggHarness) func() int, aborts int) {
	h := newEntHarness(t, brokers, 1)
	t0 := time.Now().UnixMilli()
	h.produce(h.entitlement(1, acmeCap(5), t0))
	// usage.entitlements is compacted: a broker takes keyed records only.
	testenv.ProduceBatch(t, h.brokers, h.names.EntitlementsTopic(), 0, testenv.ZstdBombKey(t, schemas.CustomerKey("acme"), 4<<20))
	testenv.ProduceBatch(t, h.brokers, h.names.DedupedTopic(), 0, testenv.ZstdBomb(t, 4<<20))
	refused := func() int { return 0 }
	if refuse != nil {
		refused = refuse(h)
	}
	h.produce(h.acmeEvents(0, "m1", 0, 8)...)
	reg := prometheus.NewRegistry()
	cfg := h.entConfig("a", vfs.NewMem())
	cfg.Stream.Registerer = reg
	cfg.Stream.MaxDecompressBatchBytes = 1 << 20
	run := h.start(cfg)
	waitAggCaughtUp(t, h, run)
	awaitDecided(t, h, 8+2)
	if n := refused(); n != aborts {
		t.Errorf("%d commits past the batches refused, want %d", n, aborts)
	}
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}
	if got := openValues(t, h)["acme/m1"]; got != 5 {
		t.Errorf("acme counted %d, want 5 (its plan's cap)", got)
	}
	want := map[string]string{
		h.names.EntitlementsTopic(): "record batch at offsets 1 to 1 decompresses to more than 1048576 bytes with its decoded records; not decoded, skipped",
		h.names.DedupedTopic():      "record batch at offsets 0 to 0 decompresses to more than 1048576 bytes with its decoded records; not decoded, skipped",
	}
	over := 0
	for _, r := range readRejected(t, h) {
		switch r.Reason {
		case schemas.ReasonOverLimit:
			over++
		case schemas.ReasonOversized:
			if w, ok := want[r.SourceTopic]; !ok || r.Detail != w || r.Stage != "aggregator" || r.SourcePartition != 0 || r.SourceTimestamp != 0 {
				t.Errorf("rejection %+v, want stage aggregator and detail %q", r, w)
			}
			delete(want, r.SourceTopic)
		default:
			t.Errorf("rejected %+v", r)
		}
	}
	if over != 3 || len(want) != 0 {
		t.Errorf("%d over_limit (want 3); batches not rejected once: %v", over, want)
	}
	if got := labelledCounter(t, reg, "meterline_rejected_total", "stage", "aggregator", "reason", schemas.ReasonOversized); got != 2 {
		t.Errorf("meterline_rejected_total{stage=aggregator,reason=oversized} = %v, want 2", got)
	}
}

// waitAggCaughtUp waits until h's group has committed the end of
// usage.deduped, or fails if the stage stopped.
func waitAggCaughtUp(t *testing.T, h *aggHarness, r *aggRunning) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		if ok, err := testenv.CaughtUp(h.brokers, h.group, h.names.DedupedTopic()); err == nil && ok {
			return
		}
		select {
		case <-r.done:
			t.Fatalf("the aggregator stopped: %v", r.err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the aggregator did not catch up")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// refuseAggCommitsPast refuses, as in a rebalance, the first n
// TxnOffsetCommits of h's group that commit partition 0 of usage.deduped
// past offset at (testenv.RefuseCommitsPast).
func refuseAggCommitsPast(c *kfake.Cluster, h *aggHarness, at int64, n int) func() int {
	cl, err := kgo.NewClient(kgo.SeedBrokers(h.brokers...))
	if err != nil {
		h.t.Fatal(err)
	}
	defer cl.Close()
	td, err := kadm.NewClient(cl).ListTopics(context.Background(), h.names.DedupedTopic())
	if err != nil {
		h.t.Fatal(err)
	}
	return testenv.RefuseCommitsPast(c, h.group, h.names.DedupedTopic(), td[h.names.DedupedTopic()].ID, at, n)
}

// labelledCounter is the value of the counter name whose labels are the
// pairs given (0 if there is none).
func labelledCounter(t testing.TB, reg *prometheus.Registry, name string, pairs ...string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metrics:
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			for i := 0; i+1 < len(pairs); i += 2 {
				if labels[pairs[i]] != pairs[i+1] {
					continue metrics
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}
