package aggregator

import (
	"cmp"
	"fmt"
	"math/rand"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/entitlements/entref"
	"github.com/meterline/meterline/internal/clock"
	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/internal/testenv/oracle"
	"github.com/meterline/meterline/schemas"
)

// The property test with entitlements (runPropertyWith): seeds 1–4, 8
// and 10 on kfake, 101, 102 and 105 on the real broker, each with some of
// the generators of entGen switched on: seeds 1 and 101 interleaved, with
// broker times that step back and customers' records on a wrong
// partition; 2 and 102 interleaved and behind, with step-backs, compared
// event by event (runBothWays; a copy of a misplaced record lands when
// the aggregator reads its original, so behind and interleaved need not
// agree with them); 3 behind, with step-backs; 4 misplaced records alone;
// 8 and 105 as 1, 10 as 2, decided in arrival order with the events
// reaching usage.deduped source by source (a dedup backlog), which input
// order decides otherwise.
// METERLINE_PROPERTY_SEEDS=n adds n kfake seeds from 1000 (misplaced
// records, step-backs in every other), n from 2000 run both ways, and n
// real-broker seeds from 5000.

func TestPropertyEntitlementsKFake(t *testing.T) {
	t.Run("seed=1", func(t *testing.T) { runPropertyWith(t, nil, 1, propKFake, &entGen{stepBack: true, misplaced: true}) })
	// Behind and caught up alike (docs/entitlements.md, The ordering rule:
	// broker time): the same run with the aggregator reading the
	// entitlements of the whole run first, then the events, and with both
	// interleaved.
	t.Run("seed=2", func(t *testing.T) { runBothWays(t, nil, 2, propKFake, entGen{stepBack: true}) })
	// Behind, over three days of broker time (for the run time).
	short := propKFake
	short.days = 3
	t.Run("seed=3", func(t *testing.T) { runPropertyWith(t, nil, 3, short, &entGen{stepBack: true, behind: true}) })
	// Misplaced records alone, over three days of broker time.
	t.Run("seed=4", func(t *testing.T) { runPropertyWith(t, nil, 4, short, &entGen{misplaced: true}) })
	// Decided in arrival order, the events reaching usage.deduped source
	// by source: with step-backs and misplaced records (two sources); and
	// caught up and behind alike (three sources).
	t.Run("seed=8", func(t *testing.T) {
		runPropertyWith(t, nil, 8, short, &entGen{stepBack: true, misplaced: true, arrival: true, lagged: true})
	})
	t.Run("seed=10", func(t *testing.T) {
		runBothWays(t, nil, 10, short, entGen{stepBack: true, arrival: true, lagged: true})
	})
	n := int64(testenv.PropertySeeds())
	for seed := int64(1000); seed < 1000+n; seed++ {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			runPropertyWith(t, nil, seed, short, &entGen{stepBack: seed%2 == 0, misplaced: true})
		})
	}
	// And as many compared caught up and behind, with step-backs.
	for seed := int64(2000); seed < 2000+n; seed++ {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) { runBothWays(t, nil, seed, propKFake, entGen{stepBack: true}) })
	}
}

func TestPropertyEntitlementsRealKafka(t *testing.T) {
	brokers := testenv.RealKafka(t)
	t.Run("seed=101", func(t *testing.T) {
		runPropertyWith(t, brokers, 101, propReal, &entGen{stepBack: true, misplaced: true})
	})
	t.Run("seed=102", func(t *testing.T) { runBothWays(t, brokers, 102, propReal, entGen{stepBack: true}) })
	t.Run("seed=105", func(t *testing.T) { // three sources
		runPropertyWith(t, brokers, 105, propReal, &entGen{stepBack: true, misplaced: true, arrival: true, lagged: true})
	})
	// METERLINE_PROPERTY_SEEDS=n adds n seeds from 5000, taking turns:
	// step-backs and misplaced records; both ways with step-backs;
	// misplaced records alone.
	for seed := int64(5000); seed < 5000+int64(testenv.PropertySeeds()); seed++ {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			switch seed % 3 {
			case 0:
				runPropertyWith(t, brokers, seed, propReal, &entGen{stepBack: true, misplaced: true})
			case 1:
				runBothWays(t, brokers, seed, propReal, entGen{stepBack: true})
			default:
				runPropertyWith(t, brokers, seed, propReal, &entGen{misplaced: true})
			}
		})
	}
}

// entGen switches on the generators of a property run with entitlements
// (runPropertyWith); with none, every record is on its customer's
// partition, each partition's broker times are non-decreasing, and the
// records and ticks of each chunk are written just before and after its
// events.
type entGen struct {
	// stepBack: now and then a record stamped behind the latest broker
	// time of its partition (a broker clock that went back; the topic is
	// CreateTime in tests), by up to three hours or, rarely, two days. It
	// applies from the time the partition was read up to when it is read
	// (entref.Model.Add), for the aggregator as for the model.
	stepBack bool
	// misplaced: now and then a customer's record written to another
	// partition than its customer's (a client with another partitioner),
	// before or after other records of its customer. The aggregator
	// re-produces it to the customer's partition, stamped with its clock
	// (brokerClock: the run's broker times); the model decides from the
	// topic which copies apply there, and expects the customer's record in
	// effect restated after a stale one (oracle.Entitlements.FromTopic,
	// docs/entitlements.md, The aggregator, step 1).
	misplaced bool
	// behind: every record of usage.entitlements, ticks included, is
	// written, and read by the aggregator, before the first event.
	behind bool
	// arrival: the aggregator decides in arrival order
	// (EntitlementsOrderArrival), the model in the order
	// pStream.arrivalOrder gives.
	arrival bool
	// lagged: the events between two watermark records reach
	// usage.deduped source by source, as after a dedup backlog
	// (pStream.bySource).
	lagged bool
	// outcomes, when set, gets each event's outcome read from
	// usage.rejected (by identity; the rejected ones only) once the run
	// settled, before it is checked against the model (runBothWays).
	outcomes *map[string]string
}

func (g entGen) String() string {
	var on []string
	for _, s := range []struct {
		on   bool
		name string
	}{{g.stepBack, "step-back"}, {g.misplaced, "misplaced"}, {g.behind, "behind"}, {g.arrival, "arrival order"}, {g.lagged, "lagged"}} {
		if s.on {
			on = append(on, s.name)
		}
	}
	if len(on) == 0 {
		return "none"
	}
	return strings.Join(on, ", ")
}

// runBothWays runs a seed with the entitlements interleaved with the
// events and with the aggregator behind (entGen.behind), and compares the
// two runs' outcomes event by event: they must be identical whatever the
// model says.
func runBothWays(t *testing.T, brokers []string, seed int64, p propParams, gen entGen) {
	var got [2]map[string]string
	for i, behind := range []bool{false, true} {
		g := gen
		g.behind, g.outcomes = behind, &got[i]
		t.Run(map[bool]string{false: "interleaved", true: "behind"}[behind], func(t *testing.T) {
			runPropertyWith(t, brokers, seed, p, &g)
		})
	}
	if got[0] == nil || got[1] == nil {
		t.Fatal("a run ended before its outcomes were read: nothing to compare")
	}
	var diff []string
	for id := range got[0] {
		if got[1][id] != got[0][id] {
			diff = append(diff, fmt.Sprintf("%s: interleaved %s, behind %s", id, got[0][id], orAccepted(got[1][id])))
		}
	}
	for id := range got[1] {
		if _, ok := got[0][id]; !ok {
			diff = append(diff, fmt.Sprintf("%s: interleaved accepted, behind %s", id, got[1][id]))
		}
	}
	if len(diff) > 0 {
		sort.Strings(diff)
		t.Fatalf("seed %d decided %d events differently behind than interleaved (docs/entitlements.md, The ordering rule: broker time):\n  %s", seed, len(diff), strings.Join(diff, "\n  "))
	}
	t.Logf("seed %d: behind and interleaved rejected the same %d events alike", seed, len(got[0]))
}

func orAccepted(reason string) string {
	if reason == "" {
		return entref.Accepted
	}
	return reason
}

// rejectedOutcomes reads usage.rejected: each rejected event's reason, by
// identity.
func rejectedOutcomes(t *testing.T, h *aggHarness) map[string]string {
	out := map[string]string{}
	for _, r := range testenv.ReadAll(t, h.brokers, h.names.RejectedTopic()) {
		var rj schemas.Rejected
		if err := schemas.DecodeInto(r.Value, &rj); err != nil {
			t.Fatalf("%s %d/%d: %v", h.names.RejectedTopic(), r.Partition, r.Offset, err)
		}
		out[schemas.Identity{CustomerID: rj.CustomerID, Meter: rj.Meter, EventID: rj.EventID}.String()] = rj.Reason
	}
	return out
}

// entProp writes a property run's usage.entitlements: random plans
// (caps on the SUM and COUNT meters, grants with windows, overdraft
// policies, the odd unmetered customer and deletion), a default plan and
// rate cards, at broker times between the ticks it appends after each
// chunk of steps, so that every partition's times are non-decreasing
// unless gen.stepBack; each customer's record on its customer's partition
// unless gen.misplaced.
type entProp struct {
	r      *rand.Rand
	h      *aggHarness
	gen    entGen
	n      int32
	ent    oracle.Entitlements
	ticked int64
	start  int64
	span   int64
	custs  []string
	last   int64   // the latest time of the chunk being sent
	latest []int64 // each partition's latest broker time written
	clock  *brokerClock
	// Counts of what the generators wrote.
	steppedBack, misplaced int
}

func newEntProp(r *rand.Rand, h *aggHarness, n int32, st *pStream, gen entGen) *entProp {
	start := st.events[0].Arrival
	ep := &entProp{r: r, h: h, gen: gen, n: n, ent: oracle.Entitlements{Partitions: n, Window: time.Duration(pWindow) * time.Millisecond},
		ticked: start - pDay, start: start, span: st.final - start, custs: []string{"acme", "globex", "initech"}, latest: make([]int64, n),
		clock: newBrokerClock(start - pDay)}
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
		if at < ep.latest[p] {
			ep.steppedBack++
		}
		ep.latest[p] = max(ep.latest[p], at)
		ep.clock.advance(at)
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
// last tick and the chunk's latest time. With gen.stepBack, a record now
// and then at a broker time behind its partitions' latest, and now and
// then a second record in the chunk; with gen.misplaced, a customer's
// record now and then on another partition than its customer's, now and
// then with another of the customer's on its partition, before it (and
// later in broker time) or after it.
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
	at := func(ps ...int32) int64 {
		if ep.gen.stepBack && r.Intn(4) == 0 {
			low := ep.latest[ps[0]]
			for _, p := range ps[1:] {
				low = min(low, ep.latest[p])
			}
			if r.Intn(5) == 0 {
				return low - 1 - r.Int63n(2*pDay)
			}
			return low - 1 - r.Int63n(3*3600*1000)
		}
		return ep.ticked + r.Int63n(ep.last-ep.ticked+1)
	}
	first := len(ep.ent.Records) == 0
	if first {
		t := ep.ticked
		ep.write(t, schemas.RateCardKey, ep.card(), ep.all()...)
		d := ep.plan("")
		d.Caps = d.Caps[:0]
		ep.write(t, schemas.DefaultPlanKey, d, ep.all()...)
		plans := []*schemas.Entitlements{ep.plan(ep.custs[0]), ep.plan(ep.custs[1])}
		capCount(plans)
		for i, c := range ep.custs[:2] {
			ep.write(t, string(schemas.CustomerKey(c)), plans[i], schemas.Partition(schemas.CustomerKey(c), ep.n))
		}
		return
	}
	writes := 1
	if ep.gen.stepBack && r.Intn(4) == 0 {
		writes = 2
	}
	for range writes {
		switch k := r.Intn(10); {
		case k < 3:
			c := ep.custs[r.Intn(len(ep.custs))]
			key := schemas.CustomerKey(c)
			canon := schemas.Partition(key, ep.n)
			if !ep.gen.misplaced || r.Intn(3) > 0 {
				ep.customer(c, at(canon), canon)
				break
			}
			// On another partition; now and then with a record of the
			// customer on its own partition in the same chunk: written
			// before it and later in broker time (its copy is stale: an
			// older version, which must not come back), or after it and
			// no earlier (the copy lands before or after it).
			p := (canon + 1 + r.Int31n(ep.n-1)) % ep.n
			ep.misplaced++
			switch r.Intn(3) {
			case 0:
				t := at(canon)
				ep.customer(c, t, canon)
				ep.customer(c, min(t, ep.ticked+r.Int63n(max(0, t-ep.ticked)+1)), p)
			case 1:
				t := at(p)
				ep.customer(c, t, p)
				ep.customer(c, t+r.Int63n(max(0, ep.last-t)+1), canon)
			default:
				ep.customer(c, at(p), p)
			}
		case k < 4:
			ep.write(at(ep.all()...), schemas.RateCardKey, ep.card(), ep.all()...)
		case k < 5:
			ep.write(at(ep.all()...), schemas.DefaultPlanKey, ep.plan(""), ep.all()...)
		}
	}
}

// capCount makes sure that one of the first plans, metered, rejects past
// a cap of at most 2 events a day on the COUNT meter "c", so that every
// run rejects some events (the check after it): with caps and quantities
// drawn at random, about one seed in a hundred rejected nothing. If none
// does, the first metered plan gets a cap of 1 on "c" that rejects (in
// place of its own cap on "c"); if both are unmetered, the first is made
// metered. It draws nothing from the run's random source, so a seed's
// records and events stay as they were.
func capCount(plans []*schemas.Entitlements) {
	for _, e := range plans {
		for _, c := range e.Caps {
			if !e.Unmetered && c.Meter == "c" && c.Limit <= 2 && c.OnLimit == schemas.OnLimitReject {
				return
			}
		}
	}
	e := plans[0]
	if e.Unmetered && !plans[1].Unmetered {
		e = plans[1]
	}
	e.Unmetered = false
	tight := schemas.Cap{Meter: "c", Limit: 1, OnLimit: schemas.OnLimitReject}
	for i := range e.Caps {
		if e.Caps[i].Meter == "c" {
			e.Caps[i] = tight
			return
		}
	}
	e.Caps = append(e.Caps, tight)
}

// customer writes a new plan of customer c (scheduled for later, or
// effective at once), or now and then its deletion, to partition p at
// broker time t.
func (ep *entProp) customer(c string, t int64, p int32) {
	r := ep.r
	key := string(schemas.CustomerKey(c))
	if r.Intn(8) == 0 {
		ep.write(t, key, nil, p)
		return
	}
	pl := ep.plan(c)
	if r.Intn(2) == 0 {
		pl.EffectiveFrom = t + r.Int63n(pDay)
	}
	ep.write(t, key, pl, p)
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
		ep.latest[p] = max(ep.latest[p], ep.ticked)
		ep.clock.advance(ep.ticked)
		recs = append(recs, &kgo.Record{Topic: ep.h.names.EntitlementsTopic(), Partition: p, Key: []byte(schemas.TickKey),
			Value: schemas.MustEncode(&schemas.Tick{InstanceID: "prop"}), Timestamp: time.UnixMilli(ep.ticked)})
	}
	ep.h.produce(recs...)
}

// brokerClock is the aggregator's clock in a property run with
// entitlements (Config.Stream.Clock): it reads the run's broker times, the
// latest one written to usage.entitlements so far, moved on by wall time
// since, and never goes back. The records the aggregator stamps with it
// (the copies of misplaced records, restated records) land at broker
// times of the run, not months past them; its timers are wall time's.
type brokerClock struct {
	mu     sync.Mutex
	latest int64     // the latest broker time written, ms
	now    time.Time // the time last read
	at     time.Time // the wall time it was read at
}

func newBrokerClock(start int64) *brokerClock {
	return &brokerClock{latest: start, now: time.UnixMilli(start), at: time.Now()}
}

// advance records a broker time written.
func (c *brokerClock) advance(ms int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.latest = max(c.latest, ms)
}

func (c *brokerClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	wall := time.Now()
	n := c.now.Add(max(0, wall.Sub(c.at)))
	if l := time.UnixMilli(c.latest); l.After(n) {
		n = l
	}
	c.now, c.at = n, wall
	return n
}

func (c *brokerClock) AfterFunc(d time.Duration, f func()) clock.Timer {
	return clock.Real{}.AfterFunc(d, f)
}

// arrivalOrder is the order the aggregator decides the stream's events in
// with EntitlementsOrderArrival (docs/entitlements.md, Decision order): an
// event whose arrival the partition watermark (every partition gets every
// watermark record) has not passed waits; a watermark record that moves it
// decides the waiting events it passes, by arrival, source partition and
// source offset; any other event (a re-routed one) is decided when read.
// moved counts the events decided at another place than in input order.
func (s *pStream) arrivalOrder() (events []*oracle.Event, moved int) {
	wms := make([]int64, s.sources)
	wm := int64(0)
	var held []*pEvent
	for _, st := range s.steps {
		if e := st.ev; e != nil {
			if e.Arrival > 0 && e.Arrival >= wm {
				held = append(held, e)
			} else {
				events = append(events, &e.Event)
			}
			continue
		}
		wms[st.wm.SourcePartition] = max(wms[st.wm.SourcePartition], st.wm.Watermark)
		next := slices.Min(wms)
		if next <= wm {
			continue
		}
		slices.SortFunc(held, func(a, b *pEvent) int {
			return cmp.Or(cmp.Compare(a.Arrival, b.Arrival), cmp.Compare(a.source, b.source), cmp.Compare(a.seq, b.seq))
		})
		n := 0
		for n < len(held) && held[n].Arrival < next {
			events = append(events, &held[n].Event)
			n++
		}
		held = append(held[:0], held[n:]...)
		wm = next
	}
	for _, e := range held {
		events = append(events, &e.Event)
	}
	for i, e := range events {
		if e != &s.events[i].Event {
			moved++
		}
	}
	return events, moved
}

// bySource reorders the events between two watermark records source by
// source, each source's in its own order: how they reach usage.deduped
// when each source's dedup writes a batch at a time (a backlog). No event
// moves past a watermark record, so each still comes before the
// watermark that passes its arrival.
func (s *pStream) bySource() {
	run := 0
	for i := 0; i <= len(s.steps); i++ {
		if i < len(s.steps) && s.steps[i].ev != nil {
			continue
		}
		evs := s.steps[run:i]
		sort.SliceStable(evs, func(a, b int) bool { return evs[a].ev.source < evs[b].ev.source })
		run = i + 1
	}
	s.events = s.events[:0]
	for _, st := range s.steps {
		if st.ev != nil {
			s.events = append(s.events, st.ev)
		}
	}
}
