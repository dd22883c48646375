package dedup

import (
	"fmt"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/schemas"
)

// TestKeptFiltersThroughRebalance: a partition revoked by a rebalance and
// assigned straight back to the same instance opens with the Bloom
// filters it had (no scan of every key), and those filters hold the keys
// another owner stored meanwhile: the restore replays the changelog's
// tail through them. Here the other owner's writes are identity records
// appended to the changelog past the instance's checkpoint while it owns
// the partition and is idle, which its next restore replays just as it
// replays a later owner's transactions. A copy of each of those keys is
// then dropped as a duplicate. The partition that moved to the other
// instance keeps nothing on the first (docs/operations.md, Rebalances
// that give a partition back).
func TestKeptFiltersThroughRebalance(t *testing.T) {
	keptFiltersThroughRebalance(t, nil)
}

// TestRealKeptFiltersThroughRebalance is TestKeptFiltersThroughRebalance
// on the real broker of METERLINE_TEST_KAFKA.
func TestRealKeptFiltersThroughRebalance(t *testing.T) {
	keptFiltersThroughRebalance(t, testenv.RealKafka(t))
}

func keptFiltersThroughRebalance(t *testing.T, brokers []string) {
	h := newHarness(t, brokers, 2)
	regA, regB := prometheus.NewRegistry(), prometheus.NewRegistry()
	cfg := func(id string, reg *prometheus.Registry) Config {
		c := h.config(id, vfs.NewMem())
		c.TickInterval = time.Hour // idle between the test's records
		c.Stream.Registerer = reg
		return c
	}
	arr := t0 + 10*day
	var first []*kgo.Record
	for i := range 40 {
		first = append(first, h.event("c", "m", fmt.Sprintf("first-%02d", i), 1, arr-hour, arr))
	}
	a := h.start(cfg("a", regA))
	h.produce(first...)
	h.caughtUp()
	if n := metricSum(t, regA, "meterline_dedup_filter_load_seconds"); n != 2 {
		t.Fatalf("a built the filters of %v partitions from their state, want 2 (its first restores)", n)
	}

	// Keys stored by another owner: identity records past a's
	// checkpoints, in both partitions.
	var others, copies []*kgo.Record
	for i := 0; len(others) < 20; i++ {
		r := h.event("c", "m", fmt.Sprintf("other-%02d", i), 1, arr-hour, arr+1000)
		e, err := schemas.Decode(r.Value)
		if err != nil {
			t.Fatal(err)
		}
		k, v := IdentityRecord(e.(*schemas.UsageEvent), arr+1000, DefaultBucket, 1_000_000+int64(i))
		others = append(others, &kgo.Record{Topic: h.names.DedupChangelogTopic(), Partition: r.Partition, Key: k, Value: v})
		copies = append(copies, r)
	}
	h.produce(others...)

	b := h.start(cfg("b", regB))
	waitOwned(t, "one partition each", func() bool { return owned(a.stage) == 1 && owned(b.stage) == 1 })
	if n := metricSum(t, regA, "meterline_dedup_filter_load_seconds"); n != 2 {
		t.Errorf("a built the filters of %v partitions from their state, want only the 2 of its first restores: the partition given back must open with its kept filters", n-2)
	}
	if n := metricValues(t, regA, "meterline_stream_partition_opens_total")["stage=dedup,warm=kept"]; n < 1 {
		t.Errorf("a opened %v partitions with kept warm state, want the one given back", n)
	}
	// Nothing of the partition that moved to b stays on a.
	if n := metricValues(t, regA, "meterline_stream_kept_warm_partitions")["stage=dedup"]; n != 0 {
		t.Errorf("a keeps the warm state of %v partitions after the rebalance", n)
	}

	// New events first: the first transactions after a rebalance may be
	// refused (and a copy processed again after an abort would be found
	// through the Bloom bits the aborted attempt left, whatever the
	// restore did).
	var after []*kgo.Record
	for i := range 10 {
		after = append(after, h.event("c", "m", fmt.Sprintf("after-%02d", i), 1, arr-hour, arr+2000))
	}
	h.produce(after...)
	h.caughtUp()
	aborted := metricValues(t, regA, "meterline_stream_transactions_total")["outcome=aborted,stage=dedup"]
	h.produce(copies...)
	h.caughtUp()
	if n := metricValues(t, regA, "meterline_stream_transactions_total")["outcome=aborted,stage=dedup"]; n != aborted {
		t.Logf("a aborted %v transactions with the copies: the check below may pass on Bloom bits an aborted attempt left", n-aborted)
	}
	o := h.outputs()
	for id, n := range o.byID() {
		if id[:5] == "other" {
			t.Errorf("%s, stored by another owner, forwarded %d times", id, n)
		} else if n != 1 {
			t.Errorf("%s forwarded %d times", id, n)
		}
	}
	if len(o.duplicates) != len(copies) {
		t.Errorf("%d duplicates, want the %d copies of keys another owner stored", len(o.duplicates), len(copies))
	}
}

// owned counts the partitions st owns with their restore done.
func owned(st *Stage) int {
	n := 0
	st.rt.EachPartitionStatus(func(_ int32, restoring bool, _ int64, _, _ string) {
		if !restoring {
			n++
		}
	})
	return n
}

func waitOwned(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
