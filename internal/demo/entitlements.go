package demo

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/aggregator"
	"github.com/meterline/meterline/entitlements/entref"
	"github.com/meterline/meterline/internal/topics"
	"github.com/meterline/meterline/schemas"
)

// The demo's entitlements (docs/entitlements.md): a free-tier customer
// capped on api_calls, and a prepaid customer whose grant runs out, both
// sized from the rate and the duration so that the cap is hit and the grant
// spent about half-way through the run. Every other customer has no plan
// and is never capped or refused. The rate card prices api_calls only.
//
// The generator's truth decides each event with the entitlements
// reference model (entitlements/entref), in the order it sends them. The
// aggregator decides them in its input order, which interleaves the
// customers' events across partitions of usage.events differently; the
// demo makes the counts the report checks independent of that order: the
// two customers with a plan send no late events, their capped and priced
// meter is api_calls (a quantity of 1, one rate), so within a period
// exactly min(events, cap) are accepted, and exactly as many as the grant
// pays for. Their events carry their send time as event time: a rate card
// prices no event whose event time is before the card was written, and
// the other customers' event times go back up to 20 s.
const (
	freeCustomer    = "hooli"
	prepaidCustomer = "stark"
	freePlan        = "free"
	prepaidPlan     = "prepaid"
	prepaidGrant    = "starter"
	// apiCallRate is the price of an api_call: 1,000 micro-credits.
	apiCallRate = 1000
)

// demoShare is the share of the generated events that are api_calls of
// the customer at index i of customers: the generator's Zipf-like choice,
// a third of its events on each meter, less its copies and bad records.
func demoShare(i int) float64 {
	return 0.35 * math.Pow(0.65, float64(i)) * 0.965 / 3
}

// nominalRun is the length of a run without a duration that the plans are
// sized for.
const nominalRun = time.Minute

// entSetup is what the demo writes to usage.entitlements.
type entSetup struct {
	freeCap    int64 // api_calls an hour
	grantCalls int64 // api_calls the grant pays for
	free, paid *schemas.Entitlements
	rates      *schemas.RateCard
	reference  *entref.Model
	partitions int32
	entTopic   string
}

// newEntSetup sizes the plans for cfg's rate and duration.
func newEntSetup(cfg Config, names topics.Names) *entSetup {
	d := cfg.Duration
	if d <= 0 {
		d = nominalRun
	}
	half := func(customer string) int64 {
		i := 0
		for k, c := range customers {
			if c == customer {
				i = k
			}
		}
		return max(5, int64(math.Round(float64(cfg.Rate)*demoShare(i)*d.Seconds()/2)))
	}
	s := &entSetup{freeCap: half(freeCustomer), grantCalls: half(prepaidCustomer), partitions: partitions, entTopic: names.EntitlementsTopic()}
	s.free = &schemas.Entitlements{CustomerID: freeCustomer, Plan: freePlan,
		Caps:      []schemas.Cap{{Meter: "api_calls", Limit: s.freeCap, OnLimit: schemas.OnLimitReject}},
		Overdraft: schemas.Overdraft{Policy: schemas.OverdraftAllow}}
	s.paid = &schemas.Entitlements{CustomerID: prepaidCustomer, Plan: prepaidPlan,
		Grants:    []schemas.Grant{{ID: prepaidGrant, Amount: s.grantCalls * apiCallRate}},
		Overdraft: schemas.Overdraft{Policy: schemas.OverdraftDeny}}
	s.rates = &schemas.RateCard{Versions: []schemas.RateVersion{{Rates: []schemas.Rate{
		{Meter: "api_calls", MicroCredits: apiCallRate, PerUnits: 1}}}}}
	return s
}

// model reads back the records write wrote and returns the reference
// model of them, each at its broker time. The times matter: a rate card
// prices no event whose event time is before the card was written, and the
// generator's event times go back 20 s, so the first events of the run
// cost nothing.
func (s *entSetup) model(ctx context.Context, brokers []string) (*entref.Model, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	recs, err := topics.ReadCommitted(ctx, brokers, s.entTopic, nil)
	if err != nil {
		return nil, fmt.Errorf("demo: read back the entitlements: %w", err)
	}
	written := map[string]int64{}
	paidPartition := schemas.Partition(schemas.CustomerKey(prepaidCustomer), s.partitions)
	for _, r := range recs {
		switch {
		case string(r.Key) == schemas.RateCardKey && r.Partition == paidPartition:
			written[schemas.RateCardKey] = r.Timestamp.UnixMilli()
		case string(r.Key) == string(schemas.CustomerKey(freeCustomer)):
			written[freeCustomer] = r.Timestamp.UnixMilli()
		case string(r.Key) == string(schemas.CustomerKey(prepaidCustomer)):
			written[prepaidCustomer] = r.Timestamp.UnixMilli()
		}
	}
	if len(written) != 3 {
		return nil, fmt.Errorf("demo: read back %d of the 3 entitlements records", len(written))
	}
	// Only the prepaid customer's partition's card decides anything: the
	// other customers overdraw without limit.
	m := entref.New(aggregator.Hour.Bounds)
	m.Add(entref.Record{Key: freeCustomer, Written: written[freeCustomer], Ent: s.free})
	m.Add(entref.Record{Key: prepaidCustomer, Written: written[prepaidCustomer], Ent: s.paid})
	m.Add(entref.Record{Key: schemas.RateCardKey, Written: written[schemas.RateCardKey], Card: s.rates})
	return m, nil
}

// planned reports whether customer has a plan of the demo's (and so no
// late events).
func planned(customer string) bool { return customer == freeCustomer || customer == prepaidCustomer }

// write writes the two customers' records to their partitions and the
// rate card to every partition, as `meterline entitlements set` and
// `set-rates` do, in one transaction, before the generator starts.
func (s *entSetup) write(ctx context.Context, brokers []string) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.TransactionalID("meterline-demo-entitlements"))
	if err != nil {
		return err
	}
	defer cl.Close()
	var recs []*kgo.Record
	for _, e := range []*schemas.Entitlements{s.free, s.paid} {
		v, err := schemas.Encode(e)
		if err != nil {
			return fmt.Errorf("demo: encode the entitlements of %s: %w", e.CustomerID, err)
		}
		key := schemas.CustomerKey(e.CustomerID)
		recs = append(recs, &kgo.Record{Topic: s.entTopic, Partition: schemas.Partition(key, s.partitions), Key: key, Value: v})
	}
	v, err := schemas.Encode(s.rates)
	if err != nil {
		return fmt.Errorf("demo: encode the rate card: %w", err)
	}
	for p := int32(0); p < s.partitions; p++ {
		recs = append(recs, &kgo.Record{Topic: s.entTopic, Partition: p, Key: []byte(schemas.RateCardKey), Value: v})
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := cl.BeginTransaction(); err != nil {
		return fmt.Errorf("demo: entitlements: %w", err)
	}
	perr := cl.ProduceSync(ctx, recs...).FirstErr()
	commit := kgo.TryCommit
	if perr != nil {
		commit = kgo.TryAbort
	}
	if err := cl.EndTransaction(ctx, commit); err != nil && perr == nil {
		perr = err
	}
	if perr != nil {
		return fmt.Errorf("demo: write the entitlements: %w", perr)
	}
	return nil
}

// describe is the line the demo prints about its plans.
func (s *entSetup) describe() string {
	return fmt.Sprintf("entitlements: %s on plan %s (cap %d api_calls an hour, then over_limit); %s on plan %s (a grant of %d api_calls at %d micro-credits each, no overdraft, then no_credit)",
		freeCustomer, freePlan, s.freeCap, prepaidCustomer, prepaidPlan, s.grantCalls, apiCallRate)
}
