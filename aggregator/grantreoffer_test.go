package aggregator

import (
	"fmt"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/schemas"
)

// TestEntitlementsGrantReofferedCaughtUpOrBehind: a grant that paid for an
// event expires; long after its window has passed (more than 2W, W one hour
// here) the customer gets a record again, then the grant's id is offered
// anew with a later expiry, and an event draws from it. The same input
// gives the same decisions whether the aggregator is caught up or behind
// (docs/entitlements.md, The ordering rule: broker time), and an id offered
// again after its window has been past for W is a new grant
// (docs/entitlements.md, Credits), so the event is paid.
//
// Caught up, the customer's records are read once the watermark has moved
// on; behind, the entitlements partition is read ahead of usage.deduped,
// while the watermark is still at 0. Either way g's generation is given
// by the records alone: the re-offer is read more than W after the latest
// expiry any record gave g, so it starts a new generation, and e2 draws
// from it (entitlements/generation.go).
func TestEntitlementsGrantReofferedCaughtUpOrBehind(t *testing.T) {
	liveRej, liveVals := grantReofferRun(t, true)
	lagRej, lagVals := grantReofferRun(t, false)
	t.Logf("caught up: rejected %s, values %s; behind: rejected %s, values %s", liveRej, liveVals, lagRej, lagVals)
	if liveRej != lagRej || liveVals != lagVals {
		t.Fatalf("decisions differ: caught up rejected %s (values %s), behind rejected %s (values %s)", liveRej, liveVals, lagRej, lagVals)
	}
}

func grantReofferRun(t *testing.T, live bool) (rejected, values string) {
	h := newEntHarness(t, nil, 1)
	t0 := time.Date(2026, 11, 10, 9, 0, 0, 0, time.UTC).UnixMilli()
	const minute, hour = int64(60_000), int64(3_600_000)
	plan := func(expires int64) *schemas.Entitlements {
		return &schemas.Entitlements{CustomerID: "acme", Plan: "prepaid", Overdraft: schemas.Overdraft{Policy: schemas.OverdraftDeny},
			Grants: []schemas.Grant{{ID: "g", Amount: 100, ExpiresAt: expires}}}
	}
	ev := func(id string, q, at int64) *kgo.Record {
		return h.dedupedEvent(0, &schemas.DedupedEvent{EventID: id, CustomerID: "acme", Meter: "api_calls", Quantity: q,
			EventTime: at, IngestTime: at})
	}
	tick := func(at int64) []*kgo.Record {
		return h.shared(1, schemas.TickKey, &schemas.Tick{InstanceID: "test"}, at)
	}
	// g pays 100 for e1 and expires half an hour later.
	first := append([]*kgo.Record{h.entitlement(1, plan(t0+30*minute), t0)},
		h.shared(1, schemas.RateCardKey, &schemas.RateCard{Versions: []schemas.RateVersion{
			{Rates: []schemas.Rate{{Meter: "api_calls", MicroCredits: 1, PerUnits: 1}}}}}, t0)...)
	first = append(first, tick(t0+minute)...)
	events := []*kgo.Record{ev("e1", 100, t0+10_000), h.watermark(0, 0, 1, t0+4*hour)}
	wmTick := tick(t0 + 4*hour + minute)
	// Four hours on: the customer's record again, then g offered anew.
	reoffer := []*kgo.Record{h.entitlement(1, plan(t0+30*minute), t0+4*hour+2*minute),
		h.entitlement(1, plan(t0+10*hour), t0+4*hour+3*minute)}
	later := []*kgo.Record{ev("e2", 50, t0+4*hour+4*minute)}
	lastTick := tick(t0 + 4*hour + 5*minute)
	reg := prometheus.NewRegistry()
	cfg := h.entConfig("a", vfs.NewMem())
	cfg.EntitlementsTick = -1
	cfg.Window = time.Hour
	cfg.Stream.Registerer = reg
	var run *aggRunning
	if live {
		run = h.start(cfg)
		h.produce(first...)
		h.produce(events...)
		h.produce(wmTick...)
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			if v, _ := gaugeOf(reg, "meterline_aggregate_watermark_seconds", "partition", "0"); v == float64(t0+4*hour)/1000 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the watermark did not pass")
			}
		}
		h.produce(reoffer...)
		h.produce(later...)
		h.produce(lastTick...)
	} else {
		h.produce(first...)
		h.produce(wmTick...)
		h.produce(reoffer...)
		h.produce(lastTick...)
		h.produce(events...)
		h.produce(later...)
		run = h.start(cfg)
	}
	h.caughtUp()
	awaitDecided(t, h, 2)
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprint(rejectedReasons(t, h)), fmt.Sprint(openValues(t, h))
}
