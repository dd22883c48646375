package aggregator

import (
	"fmt"
	"math/rand"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/entitlements/entref"
	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/internal/testenv/oracle"
	"github.com/meterline/meterline/schemas"
)

// The property test with entitlements (runPropertyWith): seeds 1–3 on
// kfake, 101 on the real broker.

func TestPropertyEntitlementsKFake(t *testing.T) {
	for seed := int64(1); seed <= 3; seed++ {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			runPropertyWith(t, nil, seed, propKFake, true)
		})
	}
}

func TestPropertyEntitlementsRealKafka(t *testing.T) {
	brokers := testenv.RealKafka(t)
	t.Run("seed=101", func(t *testing.T) { runPropertyWith(t, brokers, 101, propReal, true) })
}

// entProp writes a property run's usage.entitlements: random plans
// (caps on the SUM and COUNT meters, grants with windows, overdraft
// policies, the odd unmetered customer and deletion), a default plan and
// rate cards, at broker times between the ticks it appends after each
// chunk of steps, so that every partition's times are non-decreasing.
type entProp struct {
	r      *rand.Rand
	h      *aggHarness
	n      int32
	ent    oracle.Entitlements
	ticked int64
	start  int64
	span   int64
	custs  []string
	last   int64 // the latest time of the chunk being sent
}

func newEntProp(r *rand.Rand, h *aggHarness, n int32, st *pStream) *entProp {
	start := st.events[0].Arrival
	ep := &entProp{r: r, h: h, n: n, ent: oracle.Entitlements{Partitions: n, Window: time.Duration(pWindow) * time.Millisecond}, ticked: start - pDay,
		start: start, span: st.final - start, custs: []string{"acme", "globex", "initech"}}
	ep.ent.Nudge = ep.nudge
	return ep
}

func (ep *entProp) plan(customer string) *schemas.Entitlements {
	r := ep.r
	e := &schemas.Entitlements{CustomerID: customer, Plan: []string{"free", "team", "prepaid"}[r.Intn(3)]}
	switch r.Intn(3) {
	case 0:
		e.Overdraft = schemas.Overdraft{Policy: schemas.OverdraftDeny}
	case 1:
		e.Overdraft = schemas.Overdraft{Policy: schemas.OverdraftAllow, Limit: 1 + r.Int63n(3000)}
	default:
		e.Overdraft = schemas.Overdraft{Policy: schemas.OverdraftAllow}
	}
	if r.Intn(12) == 0 {
		e.Unmetered = true
	}
	onLimit := func() schemas.OnLimit {
		if r.Intn(4) == 0 {
			return schemas.OnLimitAllow
		}
		return schemas.OnLimitReject
	}
	if r.Intn(3) > 0 {
		e.Caps = append(e.Caps, schemas.Cap{Meter: "s", Limit: 50 + r.Int63n(400), OnLimit: onLimit()})
	}
	if r.Intn(2) == 0 {
		e.Caps = append(e.Caps, schemas.Cap{Meter: "c", Limit: 1 + r.Int63n(6), OnLimit: onLimit()})
	}
	if r.Intn(3) == 0 {
		e.Caps = append(e.Caps, schemas.Cap{Meter: "x", Limit: 30 + r.Int63n(200), OnLimit: onLimit()})
	}
	for i, id := range []string{"welcome", "topup", "promo"} {
		if r.Intn(2) == 0 {
			continue
		}
		g := schemas.Grant{ID: id, Amount: 200 + r.Int63n(3000), Priority: int32(r.Intn(2))}
		if i > 0 && r.Intn(2) == 0 { // windows of their own, same for every version of the id
			g.EffectiveFrom = ep.start + int64(i)*pDay
			g.ExpiresAt = g.EffectiveFrom + int64(1+i)*pDay
		}
		e.Grants = append(e.Grants, g)
	}
	return e
}

func (ep *entProp) card() *schemas.RateCard {
	r := ep.r
	c := &schemas.RateCard{}
	for v := range 1 + r.Intn(3) {
		from := int64(0)
		if v > 0 {
			from = ep.start + int64(v)*pDay + r.Int63n(pDay)
		}
		var rates []schemas.Rate
		for _, m := range []string{"s", "c", "x"} {
			if r.Intn(4) > 0 {
				rates = append(rates, schemas.Rate{Meter: m, MicroCredits: r.Int63n(30), PerUnits: 1 + r.Int63n(3)})
			}
		}
		c.Versions = append(c.Versions, schemas.RateVersion{EffectiveFrom: from, Rates: rates})
	}
	return c
}

// write produces one record at broker time at and records it for the
// model.
func (ep *entProp) write(at int64, key string, m schemas.Message, ps ...int32) {
	var recs []*kgo.Record
	var v []byte
	if m != nil {
		v = schemas.MustEncode(m)
	}
	for _, p := range ps {
		recs = append(recs, &kgo.Record{Topic: ep.h.names.EntitlementsTopic(), Partition: p, Key: []byte(key), Value: v, Timestamp: time.UnixMilli(at)})
		rec := entref.Record{Key: key, Written: at}
		switch m := m.(type) {
		case *schemas.Entitlements:
			rec.Ent = m
		case *schemas.RateCard:
			rec.Card = m
		}
		if c, err := schemas.ParseCustomerKey([]byte(key)); err == nil {
			rec.Key = c
		}
		ep.ent.Records = append(ep.ent.Records, oracle.EntRecord{Partition: p, Record: rec})
	}
	ep.h.produce(recs...)
}

func (ep *entProp) all() []int32 {
	ps := make([]int32, ep.n)
	for i := range ps {
		ps[i] = int32(i)
	}
	return ps
}

// before writes the records of a chunk: at the first chunk every
// customer's plan, the default plan and a card; then now and then a
// customer's new plan (scheduled for later, or effective at once), a
// deletion, a new default plan or card, each at a broker time between the
// last tick and the chunk's latest time.
func (ep *entProp) before(steps []pStep) {
	r := ep.r
	ep.last = ep.ticked
	for _, s := range steps {
		if s.ev != nil {
			ep.last = max(ep.last, s.ev.Arrival)
		} else {
			ep.last = max(ep.last, s.wm.Watermark)
		}
	}
	at := func() int64 { return ep.ticked + r.Int63n(ep.last-ep.ticked+1) }
	first := len(ep.ent.Records) == 0
	if first {
		t := ep.ticked
		ep.write(t, schemas.RateCardKey, ep.card(), ep.all()...)
		d := ep.plan("")
		d.Caps = d.Caps[:0]
		ep.write(t, schemas.DefaultPlanKey, d, ep.all()...)
		for _, c := range ep.custs[:2] {
			ep.write(t, string(schemas.CustomerKey(c)), ep.plan(c), schemas.Partition(schemas.CustomerKey(c), ep.n))
		}
		return
	}
	switch k := r.Intn(10); {
	case k < 3:
		c := ep.custs[r.Intn(len(ep.custs))]
		key := schemas.CustomerKey(c)
		t := at()
		if r.Intn(8) == 0 {
			ep.write(t, string(key), nil, schemas.Partition(key, ep.n))
			break
		}
		pl := ep.plan(c)
		if r.Intn(2) == 0 {
			pl.EffectiveFrom = t + r.Int63n(pDay)
		}
		ep.write(t, string(key), pl, schemas.Partition(key, ep.n))
	case k < 4:
		ep.write(at(), schemas.RateCardKey, ep.card(), ep.all()...)
	case k < 5:
		ep.write(at(), schemas.DefaultPlanKey, ep.plan(""), ep.all()...)
	}
}

// after appends a tick just past the chunk's latest time to every
// partition: the gate lets through the records of times before it.
// nudge appends ticks two seconds of broker time after the last ones:
// the balances still pending when the input ends go out
// (oracle.Entitlements.Nudge).
func (ep *entProp) nudge() {
	ep.last = ep.ticked + 2000
	ep.after()
}

func (ep *entProp) after() {
	if ep.last < ep.ticked {
		return
	}
	ep.ticked = ep.last + 1
	var recs []*kgo.Record
	for _, p := range ep.all() {
		recs = append(recs, &kgo.Record{Topic: ep.h.names.EntitlementsTopic(), Partition: p, Key: []byte(schemas.TickKey),
			Value: schemas.MustEncode(&schemas.Tick{InstanceID: "prop"}), Timestamp: time.UnixMilli(ep.ticked)})
	}
	ep.h.produce(recs...)
}
