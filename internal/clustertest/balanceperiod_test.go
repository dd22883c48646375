package clustertest

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"
)

// TestReconcileBalancesByBrokerTime: the check of the capped customers'
// last balances takes their period from the broker times of the run
// (balancePeriod), not from the wall clock when it runs: a load that ended
// just before midnight UTC on the last day of a year and is checked after
// midnight, on another day altogether, or one that ran across midnight,
// reconciles; a last balance of the day before the one the run ended in
// does not; nor does the arrival of a refused event, which changes no
// account. No services: the balances are rows of a fake query.
func TestReconcileBalancesByBrokerTime(t *testing.T) {
	day := time.Date(2025, 12, 31, 0, 0, 0, 0, time.UTC).UnixMilli()
	next := day + dayMs
	at := func(base int64, clock string) int64 {
		d, err := time.ParseDuration(clock)
		if err != nil {
			t.Fatal(err)
		}
		return base + d.Milliseconds()
	}
	// The last arrivals of initech and umbrella, and the final watermark
	// of every partition.
	cases := []struct {
		name          string
		lastArrival   int64
		refusedAt     int64 // the arrival of a refused event of initech's, if not 0
		watermark     int64
		balanceDay    int64
		wantProblem   string
		usageInitech  []int64
		usageUmbrella []int64
	}{
		{name: "ended before midnight", lastArrival: at(day, "23h59m58s"), watermark: at(day, "23h59m59s"), balanceDay: day,
			usageInitech: []int64{60, 30000}, usageUmbrella: []int64{50, 2400}},
		{name: "ran across midnight", lastArrival: at(next, "3s"), watermark: at(next, "4s"), balanceDay: next,
			usageInitech: []int64{9, 250}, usageUmbrella: []int64{4, 80}},
		{name: "an arrival after midnight ahead of the watermark", lastArrival: at(next, "1s"), watermark: at(day, "23h59m59s"), balanceDay: next,
			usageInitech: []int64{9, 250}, usageUmbrella: []int64{4, 80}},
		{name: "a refused event after midnight", lastArrival: at(day, "23h59m58s"), refusedAt: at(next, "1s"), watermark: at(day, "23h59m59s"),
			balanceDay: day, usageInitech: []int64{60, 30000}, usageUmbrella: []int64{50, 2400}},
		{name: "a balance of the day before the run's last", lastArrival: at(next, "3s"), watermark: at(next, "4s"), balanceDay: day,
			usageInitech: []int64{60, 30000}, usageUmbrella: []int64{50, 2400}, wantProblem: "is of the period 2025-12-31, want 2026-01-01"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := &suite{t: t, watermarks: map[int32]int64{}}
			for p := range int32(partitions) {
				s.watermarks[p] = c.watermark
			}
			tr := &truth{idents: map[string]*ident{
				"i1": {cust: "initech", meter: "api_calls", qty: 3, et: at(day, "12h"), arrival: at(day, "12h")},
				"i2": {cust: "initech", meter: "tokens", qty: 250, et: c.lastArrival - 500, arrival: c.lastArrival},
				"u1": {cust: "umbrella", meter: "tokens", qty: 40, et: c.lastArrival - 700, arrival: c.lastArrival},
				"w1": {cust: creditCustomer, meter: creditMeter, qty: creditQty, et: at(day, "13h"), arrival: at(day, "13h")},
			}}
			refused := map[string]bool{}
			if c.refusedAt != 0 {
				tr.idents["i3"] = &ident{cust: "initech", meter: "api_calls", qty: 3, et: c.refusedAt - 300, arrival: c.refusedAt}
				refused["i3"] = true
			}
			accepted := map[aggKey]sumCount{
				{cust: "initech", meter: "api_calls", period: day}:   {20, 60},
				{cust: "initech", meter: "tokens", period: day}:      {120, 30000},
				{cust: "umbrella", meter: "api_calls", period: day}:  {25, 50},
				{cust: "umbrella", meter: "tokens", period: day}:     {60, 2400},
				{cust: "initech", meter: "api_calls", period: next}:  {3, 9},
				{cust: "initech", meter: "tokens", period: next}:     {1, 250},
				{cust: "umbrella", meter: "api_calls", period: next}: {2, 4},
				{cust: "umbrella", meter: "tokens", period: next}:    {2, 80},
				entKey(creditCustomer, creditMeter, 0):               {10, 10 * creditQty},
			}
			start := uint32(c.balanceDay / 1000)
			drawn := int64(10 * creditCost)
			rows := [][]any{
				{"initech", start, []string{"api_calls", "tokens"}, c.usageInitech, []string(nil), []int64(nil), []int64(nil), "allow", int64(0)},
				{"umbrella", start, []string{"api_calls", "tokens"}, c.usageUmbrella, []string(nil), []int64(nil), []int64(nil), "allow", int64(0)},
				{creditCustomer, uint32(day / 1000), []string(nil), []int64(nil), []string{"trial"}, []int64{drawn}, []int64{creditGrant - drawn}, "deny", int64(0)},
				{"acme", uint32(day / 1000), []string(nil), []int64(nil), []string(nil), []int64(nil), []int64(nil), "allow", int64(0)},
			}
			query := func(_ string, scan func(...any) error, dest ...any) {
				for _, row := range rows {
					for i, v := range row {
						reflect.ValueOf(dest[i]).Elem().Set(reflect.ValueOf(v))
					}
					if err := scan(dest...); err != nil {
						t.Fatal(err)
					}
				}
			}
			var problems []string
			s.reconcileBalances(tr, refused, accepted, query, func(format string, args ...any) {
				problems = append(problems, fmt.Sprintf(format, args...))
			})
			switch {
			case c.wantProblem == "" && len(problems) > 0:
				t.Errorf("problems %q, want none", problems)
			case c.wantProblem != "" && (len(problems) != 2 || !strings.Contains(problems[0], c.wantProblem) || !strings.Contains(problems[1], c.wantProblem)):
				t.Errorf("problems %q, want one for each capped customer: %s", problems, c.wantProblem)
			}
		})
	}
}
