package aggregator

import (
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/schemas"
)

// TestEntitlementsPeriodRollNotOverwritten: the work of a period start
// (every customer with usage in a period that ended gets a balance of the
// new period, in chunks of FinalChunk) is neither dropped nor cut short
// when the watermark enters yet another period before it is done, and a
// period the watermark skipped (no watermark record fell in it, but
// events did) gets its customers' balances too. Each customer's last
// balance must say usage 0 in the watermark's period, whatever period its
// usage was in.
func TestEntitlementsPeriodRollNotOverwritten(t *testing.T) {
	d := time.Date(2026, 11, 10, 0, 0, 0, 0, time.UTC).UnixMilli()
	day := int64(24 * time.Hour / time.Millisecond)
	for _, tc := range []struct {
		name string
		// wms: the watermarks the partition gets, in one batch, once every
		// customer's balance is out.
		wms []int64
	}{
		{"two period starts in one batch", []int64{d + day + 5000, d + 2*day + 5000}},
		{"a period skipped", []int64{d + 2*day + 5000}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newEntHarness(t, nil, 1)
			var recs []*kgo.Record
			recs = append(recs, h.shared(1, schemas.DefaultPlanKey, &schemas.Entitlements{Plan: "free",
				Overdraft: schemas.Overdraft{Policy: schemas.OverdraftAllow},
				Caps:      []schemas.Cap{{Meter: "api_calls", Limit: 100, OnLimit: schemas.OnLimitReject}}}, d-day)...)
			recs = append(recs, h.watermark(0, 0, 1, d+1))
			// On day d: 5 customers (3 chunks of 2). On day d+1, while the
			// watermark is still on day d (their arrival is ahead of it): 3.
			want := map[string]int64{}
			for i, c := range []string{"a1", "a2", "a3", "a4", "a5", "b1", "b2", "b3"} {
				at := d + 1000 + int64(i)
				if c[0] == 'b' {
					at += day
				}
				want[c], _ = dayBounds(at)
				recs = append(recs, h.dedupedEvent(0, &schemas.DedupedEvent{EventID: c, CustomerID: c, Meter: "api_calls",
					Quantity: 3, EventTime: at, IngestTime: at}))
			}
			h.produce(recs...)
			cfg := h.entConfig("a", vfs.NewMem())
			cfg.Period = Day
			setFinalChunk(&cfg, 2)
			run := h.start(cfg)
			awaitBalances(t, h, "usage 3 in each customer's own period", func(bs map[string]*schemas.Balance) bool {
				for c, start := range want {
					if b := bs[c]; b == nil || b.PeriodStart != start || len(b.Meters) != 1 || b.Meters[0].Usage != 3 {
						return false
					}
				}
				return true
			})
			recs = recs[:0]
			for _, at := range tc.wms {
				recs = append(recs, h.watermark(0, 0, 1, at))
			}
			h.produce(recs...)
			last := tc.wms[len(tc.wms)-1]
			start, _ := dayBounds(last)
			deadline := time.Now().Add(20 * time.Second)
			var bs map[string]*schemas.Balance
			for {
				bs = latestBalances(t, h)
				done := 0
				for c := range want {
					if b := bs[c]; b != nil && b.PeriodStart == start {
						done++
					}
				}
				if done == len(want) || time.Now().After(deadline) {
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
			if err := run.stop(); err != nil {
				t.Fatal(err)
			}
			for c := range want {
				b := bs[c]
				if b == nil || b.PeriodStart != start || len(b.Meters) != 1 || b.Meters[0].Usage != 0 {
					t.Errorf("%s's last balance %+v, want usage 0 in the period of %s (the watermark's)", c, b, msTime(start))
				}
			}
		})
	}
}

// dayBounds is the UTC day of ms.
func dayBounds(ms int64) (start, end int64) {
	day := int64(24 * time.Hour / time.Millisecond)
	start = ms - ms%day
	return start, start + day
}
