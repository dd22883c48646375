package aggregator

import (
	"fmt"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/internal/fault"
	"github.com/meterline/meterline/schemas"
)

// TestEntitlementsPeriodRollCrashAcrossManyPeriods: hourly periods, and a
// watermark that jumps 130 of them at once (more than maxRollPeriods,
// so walking the skipped periods takes several chunks besides the
// customers' chunks of FinalChunk). The aggregator crashes before the
// commit of the third (sixth, …) transaction after the watermark, and starts again on state
// rebuilt from the changelog (an empty store). Every customer with usage
// in a skipped period gets exactly one balance of the watermark's period,
// with usage 0: none lost with the aborted chunk, none repeated.
func TestEntitlementsPeriodRollCrashAcrossManyPeriods(t *testing.T) {
	for _, n := range []int{3, 12} {
		t.Run(fmt.Sprint("crash at commit ", n), func(t *testing.T) { testRollCrash(t, n) })
	}
}

func testRollCrash(t *testing.T, crashAt int) {
	h := newEntHarness(t, nil, 1)
	hour := int64(time.Hour / time.Millisecond)
	h0 := time.Date(2026, 11, 10, 0, 0, 0, 0, time.UTC).UnixMilli()
	var recs []*kgo.Record
	recs = append(recs, h.shared(1, schemas.DefaultPlanKey, &schemas.Entitlements{Plan: "free",
		Overdraft: schemas.Overdraft{Policy: schemas.OverdraftAllow},
		Caps:      []schemas.Cap{{Meter: "api_calls", Limit: 100, OnLimit: schemas.OnLimitReject}}}, h0-hour)...)
	recs = append(recs, h.watermark(0, 0, 1, h0+1))
	const customers = 14
	hourOf := map[string]int64{}
	for i := range customers {
		c := fmt.Sprintf("c%02d", i)
		at := h0 + int64(i*9)*hour + 1000 // hours 0 to 117, ahead of the watermark
		hourOf[c] = at - at%hour
		recs = append(recs, h.dedupedEvent(0, &schemas.DedupedEvent{EventID: c, CustomerID: c, Meter: "api_calls",
			Quantity: 3, EventTime: at, IngestTime: at}))
	}
	h.produce(recs...)
	cfg := func(fs vfs.FS) Config {
		c := h.entConfig("a", fs)
		c.Period = Hour
		setFinalChunk(&c, 2)
		return c
	}
	run := h.start(cfg(vfs.NewMem()))
	awaitBalances(t, h, "usage 3 in each customer's own hour", func(bs map[string]*schemas.Balance) bool {
		for c, start := range hourOf {
			if b := bs[c]; b == nil || b.PeriodStart != start || len(b.Meters) != 1 || b.Meters[0].Usage != 3 {
				return false
			}
		}
		return true
	})
	before := map[string]int{}
	for c := range hourOf {
		before[c] = len(balancesOf(t, h, c))
	}

	fault.SetHandler(fault.CrashHandler)
	t.Cleanup(func() { fault.SetHandler(nil); _ = fault.Arm("") })
	if err := fault.Arm(fmt.Sprint(fault.BeforeCommit, "@", crashAt)); err != nil {
		t.Fatal(err)
	}
	last := h0 + 130*hour + 5000
	h.produce(h.watermark(0, 0, 1, last))
	run.awaitCrash(t, "the aggregator did not crash")
	_ = fault.Arm("")
	start := last - last%hour
	mid := 0
	for c := range hourOf {
		if b := latestBalances(t, h)[c]; b != nil && b.PeriodStart == start {
			mid++
		}
	}
	t.Logf("%d of %d customers had their balance of the watermark's hour at the crash", mid, customers)

	run = h.start(cfg(vfs.NewMem()))
	deadline := time.Now().Add(30 * time.Second)
	for {
		done := 0
		bs := latestBalances(t, h)
		for c := range hourOf {
			if b := bs[c]; b != nil && b.PeriodStart == start {
				done++
			}
		}
		if done == customers || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond) // a repeat, if any, goes out meanwhile
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}
	for c := range hourOf {
		bs := balancesOf(t, h, c)
		checkRevisions(t, bs)
		var ofLast []*schemas.Balance
		for _, b := range bs[before[c]:] {
			if b.PeriodStart == start {
				ofLast = append(ofLast, b)
			}
		}
		switch {
		case len(ofLast) != 1:
			t.Errorf("%s: %d balances of the watermark's hour %s, want 1 (%d balances in all)", c, len(ofLast), msTime(start), len(bs))
		case len(ofLast[0].Meters) != 1 || ofLast[0].Meters[0].Usage != 0:
			t.Errorf("%s: balance of the watermark's hour %+v, want usage 0", c, ofLast[0])
		}
		if l := bs[len(bs)-1]; l.PeriodStart != start {
			t.Errorf("%s: last balance of %s, want the watermark's hour %s", c, msTime(l.PeriodStart), msTime(start))
		}
	}
}
