package aggregator

import (
	"fmt"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/entitlements"
	"github.com/meterline/meterline/schemas"
)

// TestEntitlementsPeriodStartBalancesBoundedInBytes: a period start's
// balances go out in chunks bounded in bytes as well as in customers
// (docs/design.md, Exactly-once, 9). The default plan caps
// entitlements.MaxCaps meters and holds MaxGrants grants, so a customer's
// balance is tens of kilobytes; 1,500 customers with usage in the day
// that ended are tens of megabytes of balances, which the chunk of 10,000
// customers alone would put in one transaction.
func TestEntitlementsPeriodStartBalancesBoundedInBytes(t *testing.T) {
	const custs = 1500
	h := newEntHarness(t, nil, 1)
	d := time.Date(2026, 11, 10, 0, 0, 0, 0, time.UTC).UnixMilli()
	const day = int64(24 * time.Hour / time.Millisecond)
	plan := &schemas.Entitlements{Plan: "wide", Overdraft: schemas.Overdraft{Policy: schemas.OverdraftAllow}}
	for i := range entitlements.MaxCaps {
		plan.Caps = append(plan.Caps, schemas.Cap{Meter: fmt.Sprintf("meter-%03d-%040d", i, 0), Limit: 1000, OnLimit: schemas.OnLimitReject})
	}
	for i := range entitlements.MaxGrants {
		plan.Grants = append(plan.Grants, schemas.Grant{ID: fmt.Sprintf("grant-%03d-%040d", i, 0), Amount: 1000})
	}
	recs := h.shared(1, schemas.DefaultPlanKey, plan, d-day)
	recs = append(recs, h.watermark(0, 0, 1, d+1))
	for i := range custs {
		c := fmt.Sprintf("c%05d", i)
		at := d + 1000 + int64(i)
		recs = append(recs, h.dedupedEvent(0, &schemas.DedupedEvent{EventID: c, CustomerID: c, Meter: plan.Caps[0].Meter, Quantity: 1,
			EventTime: at, IngestTime: at}))
	}
	h.produce(recs...)
	meter := newTxnMeter(h.names)
	cfg := h.entConfig("a", vfs.NewMem())
	cfg.Period = Day
	cfg.Stream.Registerer = prometheus.NewRegistry()
	cfg.Stream.ClientOptions = []kgo.Opt{kgo.WithHooks(meter)}
	run := h.start(cfg)
	h.caughtUp()
	awaitBalancesOf := func(start int64) {
		t.Helper()
		deadline := time.Now().Add(time.Minute)
		for {
			done := 0
			for _, b := range latestBalances(t, h) {
				if b.PeriodStart == start {
					done++
				}
			}
			if done == custs {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d of %d customers got their balance of the period of %s", done, custs, msTime(start))
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	awaitBalancesOf(d)
	meter.reset()
	h.produce(h.watermark(0, 0, 1, d+day+5000))
	awaitBalancesOf(d + day)
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}
	rep := meter.report()
	t.Logf("%d balances in %d transactions; the largest transaction %d records, %d bytes", rep.balances, rep.balanceTxs, rep.max.records, rep.max.bytes)
	const limit = 8 * DefaultFinalChunkBytes
	if rep.max.bytes > limit {
		t.Errorf("a transaction of the period start wrote %d bytes, more than %d", rep.max.bytes, limit)
	}
}
