// Package benchinput is the input of bench aggregate (internal/bench) and
// of the aggregator's Go benchmarks, which cannot import internal/bench (it
// imports the aggregator): its meters, its events and the default plan and
// rate card of its aggregator with entitlements (docs/entitlements.md,
// Plans and caps; docs/entitlements.md, The rate card).
package benchinput

import (
	"fmt"
	"time"

	"github.com/meterline/meterline/schemas"
)

// Meters is the meters file of the input's five meters: every aggregation.
const Meters = `meters:
  - {name: api_calls, aggregation: SUM, group_by: [region]}
  - {name: tokens, aggregation: SUM}
  - {name: storage_bytes, aggregation: MAX}
  - {name: active_users, aggregation: UNIQUE_COUNT, property: user}
  - {name: seats, aggregation: LATEST}
`

// MeterNames are the meters of Meters, in the order events take them.
var MeterNames = []string{"api_calls", "tokens", "storage_bytes", "active_users", "seats"}

// EventSpread is how far before its arrival (now) an event of the input
// can have its event_time: the event times are spread over
// [now-EventSpread, now), so that a rate card written at least EventSpread
// before now prices every event (a card prices only event times at or
// after its broker time, docs/entitlements.md, The rate card).
const EventSpread = time.Second

// Event is event i of the input, of customer cust of customers, arriving
// at now: customer cust's meter changes every customers events, its
// quantity is 1 to 100. The quantities of a customer's meter go round
// 1 to 100 in steps of 37 from an offset of the customer's own, so that
// its first 40 events add up to about 2,000 whatever the number of
// customers (Plan).
func Event(i, cust, customers int, now time.Time) *schemas.DedupedEvent {
	k := i / customers // the customer's k-th event, when cust is i%customers
	meter := k % len(MeterNames)
	quantity := 1 + (cust+37*(k/len(MeterNames)))%100
	return &schemas.DedupedEvent{
		EventID:    fmt.Sprintf("bench-%d", i),
		CustomerID: fmt.Sprintf("cust-%05d", cust),
		Meter:      MeterNames[meter],
		Quantity:   int64(quantity),
		EventTime:  now.Add(-EventSpread).Add(time.Duration(i%int(EventSpread/time.Millisecond)) * time.Millisecond).UnixMilli(),
		IngestTime: now.UnixMilli(),
		Source:     "bench",
		Properties: []schemas.Property{{Name: "region", Value: []string{"eu-west-1", "us-east-1"}[i%2]},
			{Name: "user", Value: fmt.Sprintf("user-%d", i%50)}},
	}
}

// Plan is the default plan of the aggregator with entitlements: every
// customer capped on its two SUM meters and paying from a grant, with no
// overdraft. An input of 40 events of each meter a customer (quantities
// 1 to 100, about 2,000 a meter) passes the caps of 1,900; Rates prices
// api_calls at 1 micro-credit a unit and tokens at 15 per 1,000, which
// the grant pays.
func Plan() *schemas.Entitlements {
	return &schemas.Entitlements{Plan: "bench",
		Caps: []schemas.Cap{{Meter: "api_calls", Limit: 1900, OnLimit: schemas.OnLimitReject},
			{Meter: "tokens", Limit: 1900, OnLimit: schemas.OnLimitReject}},
		Grants:    []schemas.Grant{{ID: "bench", Amount: 1_000_000}},
		Overdraft: schemas.Overdraft{Policy: schemas.OverdraftDeny}}
}

// Rates is the rate card of the aggregator with entitlements (Plan).
func Rates() *schemas.RateCard {
	return &schemas.RateCard{Versions: []schemas.RateVersion{{Rates: []schemas.Rate{
		{Meter: "api_calls", MicroCredits: 1, PerUnits: 1}, {Meter: "tokens", MicroCredits: 15, PerUnits: 1000}}}}}
}
