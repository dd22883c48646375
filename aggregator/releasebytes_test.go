package aggregator

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/schemas"
)

// TestArrivalReleaseBoundedInBytes: a release of held events
// (EntitlementsOrderArrival) goes in chunks bounded in bytes as well as in
// events (Config.FinalChunkBytes). 200 events of about 8 KiB (a customer
// ID of schemas.MaxIdentityFieldBytes, a property of 7 KiB), held until a
// watermark passes them all, are about 1.6 MB of held events: with the
// chunk of Config.FinalChunk events alone their decisions would all be one
// transaction.
func TestArrivalReleaseBoundedInBytes(t *testing.T) { bigGatedRun(t, true) }

// TestGateDrainBoundedInBytes is TestArrivalReleaseBoundedInBytes for the
// records waiting in the gate for the entitlements partition to be read
// past them (drain, drainAhead): the 200 events wait for a tick, which
// lets them all through.
func TestGateDrainBoundedInBytes(t *testing.T) { bigGatedRun(t, false) }

// bigGatedRun runs TestArrivalReleaseBoundedInBytes, or without arrival
// TestGateDrainBoundedInBytes.
func bigGatedRun(t *testing.T, arrival bool) {
	const n, chunkBytes = 200, 64 << 10
	h := newEntHarness(t, nil, 1)
	t0 := time.Now().Add(-90 * time.Second).UnixMilli()
	tick := func(at int64) *kgo.Record {
		return h.shared(1, schemas.TickKey, &schemas.Tick{InstanceID: "test"}, at)[0]
	}
	plan := &schemas.Entitlements{Plan: "free", Overdraft: schemas.Overdraft{Policy: schemas.OverdraftAllow}}
	recs := append(h.shared(1, schemas.DefaultPlanKey, plan, t0-10_000), tick(t0-5000))
	prop := strings.Repeat("p", 7<<10)
	for i := range n {
		c := fmt.Sprintf("%05d-%s", i, strings.Repeat("c", schemas.MaxIdentityFieldBytes-6))
		at := t0 + int64(i)
		recs = append(recs, h.dedupedEvent(0, &schemas.DedupedEvent{EventID: fmt.Sprint(i), CustomerID: c, Meter: "api_calls",
			Quantity: 1, EventTime: at, IngestTime: at, SourceOffset: int64(i), Properties: []schemas.Property{{Name: "p", Value: prop}}}))
	}
	if arrival {
		// The gate lets them through at once: they wait for the
		// watermark in the hold.
		recs = append(recs, tick(t0+n+1000))
	}
	h.produce(recs...)
	meter := newTxnMeter(h.names)
	cfg := h.entConfig("a", vfs.NewMem())
	cfg.EntitlementsTick, cfg.FinalChunkBytes = -1, chunkBytes
	if arrival {
		cfg.EntitlementsOrder = EntitlementsOrderArrival
	}
	cfg.Stream.Registerer = prometheus.NewRegistry()
	cfg.Stream.ClientOptions = []kgo.Opt{kgo.WithHooks(meter)}
	run := h.start(cfg)
	h.caughtUp()
	if got := len(readAggregates(t, h)); got != 0 {
		t.Fatalf("%d aggregates before the events could be decided", got)
	}
	meter.reset()
	if arrival {
		h.produce(h.watermark(0, 0, 1, t0+n+2000), tick(t0+n+3000))
	} else {
		h.produce(tick(t0 + n + 1000))
	}
	awaitDecided(t, h, n)
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}
	rep := meter.report()
	t.Logf("%d transactions; the largest %d records, %d bytes", len(rep.spans), rep.max.records, rep.max.bytes)
	// What a chunk writes is a few times what it reads.
	const limit = 8 * chunkBytes
	if rep.max.bytes > limit {
		t.Errorf("a transaction wrote %d bytes, more than %d", rep.max.bytes, limit)
	}
}
