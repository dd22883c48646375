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
	wideBalancesRun(t, wideRoll)
}

// TestDefaultPlanSweepBoundedInBytes is
// TestEntitlementsPeriodStartBalancesBoundedInBytes for the balances a
// default-plan record sends to every customer with usage in the period
// (entsweep.go): the plan's caps raised, each of the 1,500 customers gets
// a balance with the new cap, in chunks of about DefaultFinalChunkBytes.
func TestDefaultPlanSweepBoundedInBytes(t *testing.T) {
	wideBalancesRun(t, wideSweep)
}

// TestPendingBalancesBoundedInBytes is
// TestEntitlementsPeriodStartBalancesBoundedInBytes for the emission of
// the pending customers (roundChunk): the 1,500 customers' first balances,
// pending once their usage is decided, go out in chunks of about
// DefaultFinalChunkBytes, not all in one transaction of 44 MB.
func TestPendingBalancesBoundedInBytes(t *testing.T) {
	wideBalancesRun(t, widePending)
}

// The balances wideBalancesRun measures.
const (
	widePending = iota // the pending customers' first balances
	wideRoll           // the next period's, at its start
	wideSweep          // those a default-plan record's sweep sends
)

// wideBalancesRun runs the test of
// TestEntitlementsPeriodStartBalancesBoundedInBytes, or with wideSweep that
// of TestDefaultPlanSweepBoundedInBytes, with widePending that of
// TestPendingBalancesBoundedInBytes.
func wideBalancesRun(t *testing.T, mode int) {
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
	tick := func(at int64) *kgo.Record {
		return h.shared(1, schemas.TickKey, &schemas.Tick{InstanceID: "test"}, at)[0]
	}
	// The test's ticks are the broker time: the customers' balances go out
	// once it is a balance interval past their usage.
	recs = append(recs, tick(d+1000+custs), tick(d+10_000))
	h.produce(recs...)
	meter := newTxnMeter(h.names)
	cfg := h.entConfig("a", vfs.NewMem())
	cfg.Period, cfg.EntitlementsTick = Day, -1
	cfg.Stream.Registerer = prometheus.NewRegistry()
	cfg.Stream.ClientOptions = []kgo.Opt{kgo.WithHooks(meter)}
	run := h.start(cfg)
	h.caughtUp()
	awaitBalancesOf := func(start int64, limit int64) {
		t.Helper()
		deadline := time.Now().Add(time.Minute)
		for {
			done := 0
			for _, b := range latestBalances(t, h) {
				if b.PeriodStart == start && len(b.Meters) > 0 && b.Meters[0].Limit == limit {
					done++
				}
			}
			if done == custs {
				return
			}
			if time.Now().After(deadline) {
				for _, b := range latestBalances(t, h) {
					t.Logf("%s %s %d meters", b.CustomerID, msTime(b.PeriodStart), len(b.Meters))
					break
				}
				t.Fatalf("%d of %d customers got their balance of the period of %s", done, custs, msTime(start))
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	awaitBalancesOf(d, 1000)
	if mode != widePending {
		meter.reset()
	}
	switch mode {
	case wideSweep:
		for i := range plan.Caps {
			plan.Caps[i].Limit = 2000
		}
		h.produce(append(h.shared(1, schemas.DefaultPlanKey, plan, d+day/2), tick(d+day/2+1))...)
		awaitBalancesOf(d, 2000)
	case wideRoll:
		h.produce(h.watermark(0, 0, 1, d+day+5000), tick(d+day+10_000))
		awaitBalancesOf(d+day, 1000)
	}
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}
	rep := meter.report()
	t.Logf("%d balances in %d transactions; the largest transaction %d records, %d bytes, %d of balances",
		rep.balances, rep.balanceTxs, rep.max.records, rep.max.bytes, rep.max.balanceBytes)
	const limit = 8 * DefaultFinalChunkBytes
	if rep.max.bytes > limit {
		t.Errorf("a transaction of the balances wrote %d bytes, more than %d", rep.max.bytes, limit)
	}
	// A chunk stops after the balance that reaches the bound; one balance
	// here is about 29 KB.
	const balanceLimit = DefaultFinalChunkBytes + 64<<10
	if rep.max.balanceBytes > balanceLimit {
		t.Errorf("a transaction emitted %d bytes of balances, more than %d", rep.max.balanceBytes, balanceLimit)
	}
}
