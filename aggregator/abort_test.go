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

// gaugeOf returns the value of a gauge with the given label, or false.
func gaugeOf(reg *prometheus.Registry, name, label, value string) (float64, bool) {
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value && m.GetGauge() != nil {
					return m.GetGauge().GetValue(), true
				}
			}
		}
	}
	return 0, false
}

// customersByPartition returns one customer whose key (usage.deduped is
// keyed by customer) lands in each of n partitions.
func customersByPartition(t testing.TB, n int32) []string {
	t.Helper()
	out := make([]string, n)
	found := int32(0)
	for i := 0; found < n && i < 10000; i++ {
		c := fmt.Sprintf("cust-%d", i)
		p := schemas.Partition(schemas.CustomerKey(c), n)
		if out[p] == "" {
			out[p] = c
			found++
		}
	}
	if found < n {
		t.Fatal("no customer for some partition")
	}
	return out
}

// TestFinalAfterAbortedTransaction: a transaction that decided FINAL is
// aborted while its partition stays with the instance (here: a second
// instance joins and the cooperative rebalance takes the other partition,
// which fails the open transaction). The input is re-consumed from the
// committed offset, so the same watermark record is processed again and
// must decide FINAL again (docs/design.md, Exactly-once, "Crash windows",
// the aggregator between deciding FINAL and commit: the watermark is
// re-read and FINAL decided again). Exactly one FINAL per key, on both
// partitions, with no further watermark.
func TestFinalAfterAbortedTransaction(t *testing.T) {
	h := newAggHarnessSources(t, nil, 2, 1) // one dedup source partition
	cfg := h.config("a", vfs.NewMem())
	cfg.Stream.Logger = zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel)).Named("a")
	cfg.Period, cfg.Grace = Day, time.Hour
	// A long transaction, so the rebalance lands inside it.
	cfg.Stream.CommitInterval = 2 * time.Second
	reg := prometheus.NewRegistry()
	cfg.Stream.Registerer = reg
	h.start(cfg)

	day0 := ms(t, "2026-03-10")
	const dayMs = 24 * 3600 * 1000
	final := day0 + dayMs + 3600*1000 + 1 // past end + grace
	custs := customersByPartition(t, 2)
	for p, c := range custs {
		h.produce(h.dedupedEvent(int32(p), &schemas.DedupedEvent{EventID: "e-" + c, CustomerID: c, Meter: "m", Quantity: 5,
			EventTime: day0 + 1000, IngestTime: day0 + 2000}), h.watermark(int32(p), 0, 1, final))
	}
	// Wait until the open transaction has processed the watermark on both
	// partitions (the gauge is set in Process, before the commit).
	deadline := time.Now().Add(20 * time.Second)
	for {
		v0, ok0 := gaugeOf(reg, "meterline_aggregate_watermark_seconds", "partition", "0")
		v1, ok1 := gaugeOf(reg, "meterline_aggregate_watermark_seconds", "partition", "1")
		if ok0 && ok1 && int64(v0*1000) == final && int64(v1*1000) == final {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the watermark was not processed")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// A second instance joins inside that transaction.
	cfgB := h.config("b", vfs.NewMem())
	cfgB.Stream.Logger = zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel)).Named("b")
	cfgB.Period, cfgB.Grace = Day, time.Hour
	h.start(cfgB)
	h.caughtUp()
	if n := counterOf(reg, "meterline_stream_commits_refused_total"); n < 1 {
		t.Fatalf("instance a had no transaction aborted by the rebalance (%v); the test did not exercise the abort", n)
	}

	// The FINAL revisions go out in chunks after the input (Worker), in
	// transactions of their own: caught up on the input does not mean
	// they are committed yet (after an eager rebalance the partition is
	// restored first).
	var finals map[string]int
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		finals = map[string]int{}
		for _, r := range readAggregates(t, h) {
			if r.Status == schemas.StatusFinal {
				finals[r.CustomerID]++
			}
		}
		all := true
		for _, c := range custs {
			all = all && finals[c] > 0
		}
		if all || time.Now().After(deadline) {
			break
		}
	}
	for _, c := range custs {
		if finals[c] != 1 {
			t.Errorf("customer %s (partition %d): %d FINAL revisions, want 1", c,
				schemas.Partition(schemas.CustomerKey(c), 2), finals[c])
		}
	}
}

func counterOf(reg *prometheus.Registry, name string) float64 {
	mfs, _ := reg.Gather()
	v := 0.0
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				v += m.GetCounter().GetValue()
			}
		}
	}
	return v
}

func readAggregates(t testing.TB, h *aggHarness) []*schemas.Aggregate {
	return readTopic[schemas.Aggregate](t, h.brokers, h.names.AggregatesTopic())
}

// readTopic decodes every committed record of topic as a T.
func readTopic[T any, PT interface {
	*T
	schemas.Message
}](t testing.TB, brokers []string, topic string) []PT {
	t.Helper()
	var out []PT
	for _, r := range testenv.ReadAll(t, brokers, topic) {
		m := PT(new(T))
		if err := schemas.DecodeInto(r.Value, m); err != nil {
			t.Fatalf("%s offset %d/%d: %v", topic, r.Partition, r.Offset, err)
		}
		out = append(out, m)
	}
	return out
}
