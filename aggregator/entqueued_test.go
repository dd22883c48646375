package aggregator

import (
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/schemas"
)

// TestEntitlementsQueuedRefusedAtBookingNotCharged: events late by their
// arrival while their period is not final yet (one source's watermark lags)
// are decided, charged and queued behind the period's FINALs. When they are
// booked, the aggregate refuses the first (a sum that would wrap, counted
// before entitlements were turned on) and takes the second; it refuses a
// third too, of a meter without a rate, which charged nothing. A rejected
// event consumes nothing (docs/entitlements.md, Plans and caps): the grant
// keeps the second's charge only, no charge of a queued event stays in
// the state, and the metrics count the two refused as refunded, with the
// first's credits.
func TestEntitlementsQueuedRefusedAtBookingNotCharged(t *testing.T) {
	_, brokers := testenv.KFake(t)
	names := testenv.Topics(t, brokers, "", testenv.TopicsOpts{Partitions: 1, Sources: 2, EventsTimestamp: "CreateTime"})
	h := &aggHarness{t: t, brokers: brokers, names: names, group: names.Prefix + "aggregate", createTime: true}
	day := ms(t, "2026-05-04")
	cutoff := day + 25*3600*1000 // the day's end + grace
	evOf := func(meter, id string, q, arrival int64) *kgo.Record {
		return h.dedupedEvent(0, &schemas.DedupedEvent{EventID: id, CustomerID: "paid", Meter: meter, Quantity: q,
			EventTime: day + 3600*1000, IngestTime: arrival})
	}
	ev := func(id string, q, arrival int64) *kgo.Record { return evOf("api_calls", id, q, arrival) }
	daily := func(cfg Config) Config {
		cfg.Period, cfg.Grace = Day, time.Hour
		return cfg
	}
	// Without entitlements: an aggregate 5 short of wrapping.
	run := h.start(daily(h.config("a", vfs.NewMem())))
	// storage has no rate: its events are accepted and charge nothing.
	h.produce(ev("big", math.MaxInt64-5, day+7200*1000), evOf("storage", "bigs", math.MaxInt64-5, day+7200*1000))
	h.caughtUp()
	awaitDecided(t, h, 2)
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}
	recs := []*kgo.Record{h.entitlement(1, &schemas.Entitlements{CustomerID: "paid", Plan: "prepaid",
		Grants: []schemas.Grant{{ID: "g1", Amount: 1000}}, Overdraft: schemas.Overdraft{Policy: schemas.OverdraftDeny}}, day)}
	recs = append(recs, h.shared(1, schemas.RateCardKey, &schemas.RateCard{Versions: []schemas.RateVersion{
		{EffectiveFrom: 0, Rates: []schemas.Rate{{Meter: "api_calls", MicroCredits: 1, PerUnits: 1}}}}}, day)...)
	recs = append(recs, h.shared(1, schemas.TickKey, &schemas.Tick{InstanceID: "test"}, cutoff+3600*1000)...)
	h.produce(recs...)
	// Source 0 is past the cutoff, source 1 lags: the events are late by
	// their arrival and the period is not final yet, so they are queued.
	h.produce(h.watermark(0, 0, 2, cutoff+100), h.watermark(0, 1, 2, day+3*3600*1000),
		ev("wraps", 10, cutoff+10), ev("fits", 3, cutoff+20), evOf("storage", "wraps-free", 10, cutoff+30))
	cfg := daily(h.entConfig("b", vfs.NewMem()))
	reg := prometheus.NewRegistry()
	cfg.Stream.Registerer = reg
	cfg.EntitlementsTick = -1
	cfg.BalanceInterval = BalanceEveryTransaction
	run = h.start(cfg)
	h.caughtUp()
	// Source 1 passes the cutoff: the period is final and the queued
	// events are booked.
	h.produce(h.watermark(0, 1, 2, cutoff+100))
	h.caughtUp()
	for deadline := time.Now().Add(30 * time.Second); len(readAdjustments(t, h)) == 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the queued events were not booked")
		}
	}
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}
	if reasons := rejectedReasons(t, h); fmt.Sprint(slices.Sorted(slices.Values(reasons))) != "[wraps-free:invalid wraps:invalid]" {
		t.Fatalf("rejected %v, want [wraps-free:invalid wraps:invalid]", reasons)
	}
	// The three were accepted when queued; the two refused at booking
	// are counted as refunded, with the 10 micro-credits wraps paid.
	for name, want := range map[string]float64{
		"meterline_aggregate_entitlement_decisions_total":  3,
		"meterline_aggregate_credits_consumed_micro_total": 13,
		"meterline_aggregate_entitlement_refunds_total":    2,
		"meterline_aggregate_credits_refunded_micro_total": 10,
	} {
		if got := counterWith(reg, name, "plan", "prepaid"); got != want {
			t.Errorf("%s{plan=prepaid} = %v, want %v", name, got, want)
		}
	}
	if adjs := readAdjustments(t, h); len(adjs) != 1 || adjs[0].EventID != "fits" || adjs[0].Delta != 3 {
		t.Fatalf("adjustments %+v, want fits +3", adjs)
	}
	b := latestBalances(t, h)["paid"]
	if b == nil || len(b.Grants) != 1 || b.Grants[0].Consumed != 3 {
		t.Fatalf("paid's balance %+v, want g1 consumed 3: the event counted, not the one rejected at its booking", b)
	}
	for _, k := range liveStateKeys(t, h, day) {
		if k[0] == pfxCharge || k[0] == pfxPending || k[0] == pfxQueuedSource {
			t.Errorf("state key %q left after the booking", k)
		}
	}
}
