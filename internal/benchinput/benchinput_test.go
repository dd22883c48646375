package benchinput

import (
	"testing"
	"time"
)

// TestEveryCustomerMeetsItsCapNearTheEnd: with any number of customers,
// each customer's 40 events of a capped meter add up to about 2,000, so
// that every customer reaches Plan's caps late, and the aggregator with
// entitlements refuses only the last few events of each, as the plan's
// documentation says. When every event of a customer had the same
// quantity (1 + i%100 with customers a multiple of 100), half of the
// customers passed the cap twice over and the others never reached it.
func TestEveryCustomerMeetsItsCapNearTheEnd(t *testing.T) {
	caps := map[string]int64{}
	for _, c := range Plan().Caps {
		caps[c.Meter] = c.Limit
	}
	now := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	for _, customers := range []int{5000, 1000, 777, 3} {
		type cm struct {
			cust  string
			meter string
		}
		sums := map[cm]int64{}
		for i := range customers * 40 * len(MeterNames) {
			e := Event(i, i%customers, customers, now)
			if e.Quantity < 1 || e.Quantity > 100 {
				t.Fatalf("%d customers: event %d: quantity %d, want 1 to 100", customers, i, e.Quantity)
			}
			if _, capped := caps[e.Meter]; capped {
				sums[cm{e.CustomerID, e.Meter}] += e.Quantity
			}
		}
		if want := customers * len(caps); len(sums) != want {
			t.Fatalf("%d customers: %d customer-meters capped, want %d", customers, len(sums), want)
		}
		for k, sum := range sums {
			if limit := caps[k.meter]; sum < limit || sum > limit+limit/4 {
				t.Errorf("%d customers: %s %s: 40 events add up to %d, want %d to %d", customers, k.cust, k.meter, sum, limit, limit+limit/4)
			}
		}
	}
}
