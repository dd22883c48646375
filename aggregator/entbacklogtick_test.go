package aggregator

import (
	"fmt"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/schemas"
)

// TestBacklogAppendsNoTicks: an aggregator catching up on records that
// arrived before the last tick it has read (a backlog: the gate lets
// them through as they come) appends no tick of its own. A tick there
// would let nothing through: every tick it appends widens its
// transactions by the entitlements partitions, and catching up on a
// backlog with ticks cost bench aggregate about a fifth of its rate
// (docs/benchmarks.md, Aggregate).
func TestBacklogAppendsNoTicks(t *testing.T) {
	const n = 20
	h := newEntHarness(t, nil, 1)
	T := time.Now().UnixMilli()
	h.produce(h.shared(1, schemas.TickKey, &schemas.Tick{InstanceID: "test"}, T)...)
	var evs []*kgo.Record
	for i := range n {
		at := T - 2000 + int64(i)
		evs = append(evs, h.dedupedEvent(0, &schemas.DedupedEvent{EventID: fmt.Sprint("e", i), CustomerID: "acme",
			Meter: "api_calls", Quantity: 1, EventTime: at, IngestTime: at}))
	}
	h.produce(evs...)
	cfg := h.entConfig("a", vfs.NewMem())
	cfg.BalanceInterval = BalanceEveryTransaction // no balance left pending
	h.start(cfg)
	awaitDecided(t, h, n)
	time.Sleep(50 * cfg.EntitlementsTick)
	if ticks := countTicks(t, h); ticks != 1 {
		t.Fatalf("%d ticks appended while catching up on records the test's tick let through, want none", ticks-1)
	}
}

// countTicks counts the ticks in the harness's entitlements topic, the
// test's own included.
func countTicks(t testing.TB, h *aggHarness) int {
	c := 0
	for _, r := range testenv.ReadAll(t, h.brokers, h.names.EntitlementsTopic()) {
		if string(r.Key) == schemas.TickKey {
			c++
		}
	}
	return c
}
