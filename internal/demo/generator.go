package demo

import (
	"context"
	"fmt"
	"math/rand"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/entitlements/entref"
	"github.com/meterline/meterline/producer"
	"github.com/meterline/meterline/schemas"
)

var (
	customers = []string{"acme", "globex", "initech", "umbrella", "hooli", "stark", "wayne", "wonka"}
	meters    = []string{"api_calls", "tokens", "storage_mb"}
	services  = []string{"api-gateway", "llm-proxy", "blob-store"}
	// buggySource is the source of the demo's misbehaving producer.
	buggySource = "buggy-client"
)

// truth is what the generator sent, the ground truth the report checks the
// pipeline's committed output against.
type truth struct {
	mu       sync.Mutex
	sent     atomic.Int64 // every record sent: events, copies, bad ones
	failed   atomic.Int64 // sends the broker did not acknowledge
	unique   int64
	copies   int64
	conflict int64
	late     int64
	bad      map[string]int64            // reason → count
	totals   map[string]map[string]int64 // customer → meter → quantity accepted
	// ent decides each unique event as the aggregator must (nil: the
	// demo runs without entitlements); entRejected counts the events it
	// rejects by reason, drawn the micro-credits grants paid, charged
	// every micro-credit accepted events cost (grants and overdraft).
	ent         *entref.Model
	entRejected map[string]int64
	drawn       int64
	charged     int64
}

func newTruth(ent *entref.Model) *truth {
	return &truth{bad: map[string]int64{}, totals: map[string]map[string]int64{}, ent: ent, entRejected: map[string]int64{}}
}

// decide decides an event of the generator's with the reference model and
// reports whether it is counted; the caller holds mu.
func (t *truth) decide(e producer.Event, arrival time.Time) bool {
	if t.ent == nil {
		return true
	}
	d := t.ent.Decide(e.CustomerID, entref.Event{Meter: e.Meter, Aggregation: "SUM", Quantity: e.Quantity,
		EventTime: e.EventTime.UnixMilli(), Arrival: arrival.UnixMilli()})
	if d.Outcome != entref.Accepted {
		t.entRejected[d.Outcome]++
		return false
	}
	for _, dr := range d.Draws {
		t.drawn += dr.Amount
	}
	t.charged += d.Cost
	return true
}

// badTotal is how many bad records were sent, of every reason; the caller
// holds mu.
func (t *truth) badTotal() int64 {
	var n int64
	for _, c := range t.bad {
		n += c
	}
	return n
}

// customers are the customers with usage, sorted; the caller holds mu.
func (t *truth) customers() []string {
	cs := make([]string, 0, len(t.totals))
	for c := range t.totals {
		cs = append(cs, c)
	}
	sort.Strings(cs)
	return cs
}

type sentEvent struct {
	e producer.Event
}

// generator produces realistic usage: a few customers with very different
// volumes, several meters and services, about 3% copies (a third of them
// conflicting), about 2% late events and a few bad records.
type generator struct {
	p      *producer.Producer
	topic  string
	rate   int
	rng    *rand.Rand
	truth  *truth
	recent []sentEvent
	seq    int64
}

func (g *generator) run(ctx context.Context) error {
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	carry := 0.0
	for {
		select {
		case <-ctx.Done():
			return g.p.Flush(context.WithoutCancel(ctx))
		case <-t.C:
		}
		carry += float64(g.rate) / 100
		for ; carry >= 1; carry-- {
			if err := g.one(); err != nil {
				return err
			}
		}
	}
}

func (g *generator) customer() string {
	// Zipf-like: acme is busiest, wonka quietest.
	for i := range customers {
		if g.rng.Float64() < 0.35 {
			return customers[i]
		}
	}
	return customers[len(customers)-1]
}

func (g *generator) one() error {
	now := time.Now()
	r := g.rng.Float64()
	switch {
	case r < 0.03 && len(g.recent) > 0:
		return g.copy()
	case r < 0.035:
		return g.bad(now)
	}
	g.seq++
	c, m := g.customer(), meters[g.rng.Intn(len(meters))]
	qty := int64(1)
	switch m {
	case "tokens":
		qty = int64(50 + g.rng.Intn(2000))
	case "storage_mb":
		qty = int64(1 + g.rng.Intn(100))
	}
	et := now.Add(-time.Duration(g.rng.Intn(20_000)) * time.Millisecond)
	if planned(c) {
		// Reported at once, so that the rate card, written just before
		// the run, prices every one (see entitlements.go).
		et = now
	}
	// No late events for the customers with a plan: see entitlements.go.
	late := r > 0.98 && !planned(c)
	if late {
		// Usage reported long after its hour closed: an adjustment.
		et = now.Add(-2*time.Hour - time.Duration(g.rng.Intn(3600))*time.Second)
	}
	svc := services[g.rng.Intn(len(services))]
	e := producer.Event{EventID: producer.EventID(svc, fmt.Sprintf("req-%d-%d", now.UnixNano(), g.seq)), CustomerID: c, Meter: m,
		Quantity: qty, EventTime: et, Source: svc, Properties: map[string]string{"region": []string{"eu-west-1", "us-east-1"}[g.rng.Intn(2)]}}
	rec, err := g.p.Record(e)
	if err != nil {
		return fmt.Errorf("demo generator: %w", err)
	}
	g.send(rec)
	g.truth.mu.Lock()
	g.truth.unique++
	if g.truth.decide(e, now) {
		if late {
			g.truth.late++
		}
		if g.truth.totals[c] == nil {
			g.truth.totals[c] = map[string]int64{}
		}
		g.truth.totals[c][m] += qty
	}
	g.truth.mu.Unlock()
	if len(g.recent) < 2000 {
		g.recent = append(g.recent, sentEvent{e})
	} else {
		g.recent[g.rng.Intn(len(g.recent))] = sentEvent{e}
	}
	return nil
}

// copy re-sends an earlier event, as a retrying service would; a third of
// the copies carry a different quantity (a producer bug: a conflict).
func (g *generator) copy() error {
	e := g.recent[g.rng.Intn(len(g.recent))].e
	conflict := g.rng.Intn(3) == 0
	if conflict {
		e.Quantity++
	}
	rec, err := g.p.Record(e)
	if err != nil {
		return err
	}
	g.send(rec)
	g.truth.mu.Lock()
	g.truth.copies++
	if conflict {
		g.truth.conflict++
	}
	g.truth.mu.Unlock()
	return nil
}

// bad sends a record the pipeline must reject: the producer library would
// refuse these, so they are built by hand, as a buggy client would.
func (g *generator) bad(now time.Time) error {
	g.seq++
	id := fmt.Sprintf("bad-%d-%d", now.UnixNano(), g.seq)
	ue := &schemas.UsageEvent{EventID: id, CustomerID: g.customer(), Meter: "api_calls", Quantity: 1, EventTime: now.UnixMilli(), Source: buggySource}
	var reason string
	var value []byte
	switch g.rng.Intn(4) {
	case 0:
		reason, ue.Quantity = schemas.ReasonInvalid, -5
	case 1:
		reason, ue.EventTime = schemas.ReasonTooOld, now.Add(-40*24*time.Hour).UnixMilli()
	case 2:
		reason, ue.EventTime = schemas.ReasonInFuture, now.Add(3*time.Hour).UnixMilli()
	default:
		reason, value = schemas.ReasonUndecodable, []byte(`{"event_id":"`+id+`","quantity":1}`)
	}
	if value == nil {
		value = schemas.MustEncode(ue)
	}
	g.send(&kgo.Record{Topic: g.topic, Key: ue.Identity().Key(), Value: value})
	g.truth.mu.Lock()
	g.truth.bad[reason]++
	g.truth.mu.Unlock()
	return nil
}

func (g *generator) send(r *kgo.Record) {
	g.truth.sent.Add(1)
	g.p.ProduceRecord(r, func(err error) {
		if err != nil {
			g.truth.failed.Add(1)
		}
	})
}
