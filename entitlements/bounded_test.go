package entitlements

import (
	"fmt"
	"testing"
	"time"

	"github.com/meterline/meterline/schemas"
)

// TestStateStaysBounded: a year of daily usage by 40 customers whose
// records, grants (a new one each month, expiring after two) and rate card
// change every month, pruned daily at the horizon of the day's arrivals:
// the state holds about the window's worth, the same in December as in
// March.
func TestStateStaysBounded(t *testing.T) {
	const day = 24 * hourMs
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixMilli()
	l, err := New(Config{Prefix: []byte("e"), Period: monthBounds, Window: 35 * 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	st := newMemStore()
	apply := func(key []byte, m schemas.Message, at int64) {
		v, _ := schemas.Encode(m)
		rec, err := ParseRecord(key, v, at)
		if err == nil {
			err = l.Apply(st, rec)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	sizes := map[int]int{}
	for d := 0; d < 365; d++ {
		now := base + int64(d)*day
		month := time.UnixMilli(now).UTC().Month()
		if time.UnixMilli(now).UTC().Day() == 1 {
			var versions []schemas.RateVersion
			for m := 0; m <= d/30; m++ { // the card grows a version a month, history included
				versions = append(versions, schemas.RateVersion{EffectiveFrom: base + int64(m)*30*day,
					Rates: []schemas.Rate{{Meter: "api_calls", MicroCredits: int64(1000 + m), PerUnits: 1}}})
			}
			apply([]byte(schemas.RateCardKey), &schemas.RateCard{Versions: versions}, now)
			for c := 0; c < 40; c++ {
				cust := fmt.Sprintf("c%d", c)
				apply(schemas.CustomerKey(cust), &schemas.Entitlements{CustomerID: cust, Plan: "pro",
					Caps:      []schemas.Cap{{Meter: "api_calls", Limit: 1_000_000, OnLimit: schemas.OnLimitReject}},
					Grants:    []schemas.Grant{{ID: fmt.Sprintf("monthly-%d", month), Amount: 50_000_000, ExpiresAt: now + 60*day}},
					Overdraft: schemas.Overdraft{Policy: schemas.OverdraftAllow}}, now)
			}
		}
		for c := 0; c < 40; c++ {
			for _, m := range []string{"api_calls", "tokens"} {
				if _, err := l.Decide(st, fmt.Sprintf("c%d", c), Event{Meter: m, Aggregation: "SUM", Quantity: 10,
					EventTime: now - day, Arrival: now}); err != nil {
					t.Fatal(err)
				}
			}
		}
		if err := l.PruneShared(st, now); err != nil {
			t.Fatal(err)
		}
		for c := 0; c < 40; c++ {
			if err := l.PruneCustomer(st, fmt.Sprintf("c%d", c), now); err != nil {
				t.Fatal(err)
			}
		}
		for more := true; more; {
			if more, err = l.PrunePeriods(st, now, 100); err != nil {
				t.Fatal(err)
			}
		}
		if time.UnixMilli(now).UTC().Day() == 15 {
			sizes[int(month)] = st.bytes()
		}
	}
	t.Logf("state bytes on the 15th of each month: %v", sizes)
	if sizes[12] > sizes[3]*13/10 {
		t.Fatalf("state grows: %d bytes in March, %d in December", sizes[3], sizes[12])
	}
}
