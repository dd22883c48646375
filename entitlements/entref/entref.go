// Package entref is the reference model the entitlements package, and the
// aggregator's tests (internal/testenv/oracle), are checked against:
// docs/entitlements.md written as plainly as possible. It keeps every
// record ever read and every counter forever, finds what is in effect by
// scanning all records, and does its arithmetic in big integers. It shares
// no code with the entitlements package, only the schema types, so that a
// bug there cannot hide by being copied here. Only tests, and the ground
// truth of meterline demo (internal/demo), import it.
package entref

import (
	"math"
	"math/big"
	"slices"
	"sort"
	"time"

	"github.com/meterline/meterline/schemas"
)

// Model is the reference: the records of an entitlements partition in
// read order, and what the events decided so far have charged.
type Model struct {
	period    func(ms int64) (start, end int64)
	window    int64    // W, ms
	records   []Record // in read order
	usage     map[refUsage]int64
	consumed  map[refGrant]int64
	overdrawn map[refPeriod]int64
	readTo    int64 // the latest broker time read (Add, Read)
}

// refGrant is a generation of a customer's grant.
type refGrant struct {
	customer, id string
	gen          int64
}

// Record is a valid record of usage.entitlements (the reference never sees
// one the stage refuses).
type Record struct {
	Key     string                // customer, or a reserved key
	Written int64                 // broker time
	Ent     *schemas.Entitlements // customer or default plan; nil: tombstone
	Card    *schemas.RateCard     // rate card; nil: tombstone

	// at is when the record counts as read (Add): its broker time, or the
	// latest one read before it if that is later.
	at int64
	// gens: the generation of each grant the record offers, by id (Add).
	gens map[string]int64
}

// Event is what a decision needs of an event.
type Event struct {
	Meter       string
	Aggregation string // SUM, COUNT, MAX, UNIQUE_COUNT, LATEST
	Quantity    int64
	EventTime   int64
	Arrival     int64
	// Undeclared: the meter is not declared; its usage is kept only while
	// the plan caps it or the rate card prices it.
	Undeclared bool
}

// Outcomes of Decision: Accepted or a reason code of docs/design.md, Bad
// input.
const (
	Accepted  = "accepted"
	OverLimit = schemas.ReasonOverLimit
	NoCredit  = schemas.ReasonNoCredit
	Invalid   = schemas.ReasonInvalid
)

// Paid returns what a generation of a customer's grant id has paid so far
// (the model keeps every generation forever).
func (m *Model) Paid(customer, grant string, gen int64) int64 {
	return m.consumed[refGrant{customer, grant, gen}]
}

// GenAfter returns the generation a record of key (a customer, or
// schemas.DefaultPlanKey) would give grant id if it were read at at,
// right after the first n records Add read: the generation whose paid a
// stage must still hold for the customers that record reaches.
func (m *Model) GenAfter(n int, key, id string, at int64) int64 {
	return m.generation(m.records[:n], key, id, at)
}

// Draw is what one grant paid for an event, in micro-credits.
type Draw struct {
	Grant  string
	Amount int64
}

type refUsage struct {
	customer, meter string
	period          int64
}

type refPeriod struct {
	customer string
	period   int64
}

// DefaultWindow is the dedup window W the model assumes unless Window
// sets another: dedup's default.
const DefaultWindow = 35 * 24 * time.Hour

// New returns an empty model of billing periods period, with the dedup
// window DefaultWindow.
func New(period func(int64) (int64, int64)) *Model {
	return &Model{period: period, window: DefaultWindow.Milliseconds(), usage: map[refUsage]int64{},
		consumed: map[refGrant]int64{}, overdrawn: map[refPeriod]int64{}}
}

// Window sets the dedup window W (before any record is added) and returns
// m.
func (m *Model) Window(w time.Duration) *Model {
	m.window = w.Milliseconds()
	return m
}

// Add reads a record. A broker time behind one read before it, by Add or
// Read (a broker clock that stepped back), counts as the latest one read:
// the record applies from then on, never before. Each grant it offers
// gets its generation (docs/entitlements.md, Credits), from the records
// read before it.
func (m *Model) Add(r Record) {
	m.Read(r.Written)
	r.at = m.readTo
	if r.Ent != nil {
		r.gens = map[string]int64{}
		for _, g := range r.Ent.Grants {
			r.gens[g.ID] = m.generation(m.records, r.Key, g.ID, r.at)
		}
	}
	m.records = append(m.records, r)
}

// expiryOf is a grant's expiry, math.MaxInt64 for never.
func expiryOf(g schemas.Grant) int64 {
	if g.ExpiresAt == 0 {
		return math.MaxInt64
	}
	return g.ExpiresAt
}

// generation is the generation of grant id offered by a record of key
// read at at, after the records read before it (records). A generation is alive at at
// while the latest expiry the offers counted for it gave it is after
// at − W. The default plan continues the generation its records last
// offered id in if that is alive, by the default plan's offers; a
// customer continues the one its own records offered id in that is alive
// by its own records' offers, else the default plan's if alive; else the
// generation is new, named at (the default plan's) or −1 − at (a
// customer's).
func (m *Model) generation(records []Record, key, id string, at int64) int64 {
	alive := func(exp int64) bool { return exp > at-m.window }
	// The default plan's: the generation of its latest offer of id, and
	// the latest expiry its offers gave that generation.
	var defGen, defExp int64
	defOffered := false
	own := map[int64]int64{} // the customer's own: generation → latest expiry
	for _, r := range records {
		if r.Ent == nil {
			continue
		}
		for _, g := range r.Ent.Grants {
			if g.ID != id {
				continue
			}
			gen := r.gens[id]
			switch r.Key {
			case schemas.DefaultPlanKey:
				if !defOffered || gen != defGen {
					defGen, defExp, defOffered = gen, 0, true
				}
				defExp = max(defExp, expiryOf(g))
			case key:
				own[gen] = max(own[gen], expiryOf(g))
			}
		}
	}
	if key != schemas.DefaultPlanKey {
		// At most one is alive: a generation is started or joined only
		// when none is. The earliest, to be deterministic regardless.
		var gens []int64
		for gen, exp := range own {
			if alive(exp) {
				gens = append(gens, gen)
			}
		}
		if len(gens) > 0 {
			return slices.Min(gens)
		}
	}
	if defOffered && alive(defExp) {
		return defGen
	}
	if key != schemas.DefaultPlanKey {
		// A customer's new generation is never the default plan's,
		// even when the default plan's record counts as read in the
		// same millisecond: the two are named apart (read times are
		// never negative).
		return -1 - at
	}
	return at
}

// Len returns the number of records Added.
func (m *Model) Len() int { return len(m.records) }

// Read reads a record of the partition that changes no entitlements (a
// tick, a record the stage refuses): only its broker time counts, for the
// records read after it.
func (m *Model) Read(written int64) { m.readTo = max(m.readTo, written) }

// effective is when a record starts to apply: its effective_from, never
// before it was read (at).
func (r Record) effective() int64 {
	if r.Ent != nil && r.Ent.EffectiveFrom > r.at {
		return r.Ent.EffectiveFrom
	}
	return r.at
}

// entAt: the most recently read record of key whose effective time is at
// or before arrival. found false: none.
func (m *Model) entAt(key string, arrival int64) (r Record, found bool) {
	for _, x := range m.records {
		if x.Key == key && x.effective() <= arrival {
			r, found = x, true
		}
	}
	return r, found
}

// recordAt returns the record in effect for a customer at arrival: its
// own, else the default plan's; Ent nil: no plan.
func (m *Model) recordAt(customer string, arrival int64) Record {
	if r, _ := m.entAt(customer, arrival); r.Ent != nil {
		return r
	}
	r, _ := m.entAt(schemas.DefaultPlanKey, arrival)
	return r
}

// PlanAt returns the record in effect for a customer at arrival: its own,
// else the default plan's, else nil (no plan).
func (m *Model) PlanAt(customer string, arrival int64) *schemas.Entitlements {
	return m.recordAt(customer, arrival).Ent
}

// rate: the last card read at or before min(arrival, event time), its
// version at event time.
func (m *Model) rate(arrival, eventTime int64, meter string) (schemas.Rate, bool) {
	at := min(arrival, eventTime)
	var card *schemas.RateCard
	for _, r := range m.records {
		if r.Key == schemas.RateCardKey && r.at <= at {
			card = r.Card
		}
	}
	if card == nil {
		return schemas.Rate{}, false
	}
	var best *schemas.RateVersion
	for i, v := range card.Versions {
		if v.EffectiveFrom <= eventTime && (best == nil || v.EffectiveFrom > best.EffectiveFrom) {
			best = &card.Versions[i]
		}
	}
	if best == nil {
		return schemas.Rate{}, false
	}
	for _, r := range best.Rates {
		if r.Meter == meter {
			return r, true
		}
	}
	return schemas.Rate{}, false
}

var maxInt64 = big.NewInt(math.MaxInt64)

func bigOver(x *big.Int) bool { return x.Cmp(maxInt64) > 0 }

func bigSum(a, b int64) *big.Int { return new(big.Int).Add(big.NewInt(a), big.NewInt(b)) }

// Decision is what the reference decides: the outcome and, when accepted,
// the fields that carry money.
type Decision struct {
	Outcome   string
	Units     int64
	Cost      int64
	Draws     []Draw
	Overdraft int64
	OverCap   bool
}

// Decide decides an event of a customer and records its charge.
func (m *Model) Decide(customer string, ev Event) Decision {
	rec := m.recordAt(customer, ev.Arrival)
	plan := rec.Ent
	if plan == nil {
		plan = &schemas.Entitlements{Overdraft: schemas.Overdraft{Policy: schemas.OverdraftAllow}}
	}
	var units int64
	switch ev.Aggregation {
	case "SUM":
		units = ev.Quantity
	case "COUNT":
		units = 1
	}
	start, _ := m.period(ev.EventTime)
	uk := refUsage{customer, ev.Meter, start}
	if bigOver(bigSum(m.usage[uk], units)) {
		return Decision{Outcome: Invalid}
	}
	d := Decision{Outcome: Accepted, Units: units}
	accept := func() Decision {
		m.usage[uk] += d.Units
		for _, dr := range d.Draws {
			m.consumed[refGrant{customer, dr.Grant, rec.gens[dr.Grant]}] += dr.Amount
		}
		m.overdrawn[refPeriod{customer, start}] += d.Overdraft
		return d
	}
	capped := false
	for _, c := range plan.Caps {
		capped = capped || c.Meter == ev.Meter
	}
	if _, priced := m.rate(ev.Arrival, ev.EventTime, ev.Meter); ev.Undeclared && (plan.Unmetered || !capped && !priced) {
		d.Units = 0
		return accept()
	}
	if plan.Unmetered {
		return accept()
	}
	charged := ev.Aggregation == "SUM" || ev.Aggregation == "COUNT"
	for _, c := range plan.Caps {
		if c.Meter == ev.Meter && charged && m.usage[uk]+units > c.Limit {
			if c.OnLimit == schemas.OnLimitReject {
				return Decision{Outcome: OverLimit}
			}
			d.OverCap = true
		}
	}
	rate, ok := m.rate(ev.Arrival, ev.EventTime, ev.Meter)
	if !ok || !charged {
		return accept()
	}
	// cost = round_half_up(units × micro / per) = ⌊(2·units·micro + per) / (2·per)⌋
	num := new(big.Int).Mul(big.NewInt(units), big.NewInt(rate.MicroCredits))
	num.Add(num.Mul(num, big.NewInt(2)), big.NewInt(rate.PerUnits))
	cost := num.Quo(num, new(big.Int).Mul(big.NewInt(rate.PerUnits), big.NewInt(2)))
	if bigOver(cost) {
		return Decision{Outcome: Invalid}
	}
	d.Cost = cost.Int64()
	var grants []schemas.Grant
	for _, g := range plan.Grants {
		if g.EffectiveFrom <= ev.EventTime && (g.ExpiresAt == 0 || ev.EventTime < g.ExpiresAt) {
			grants = append(grants, g)
		}
	}
	sort.Slice(grants, func(i, j int) bool {
		a, b := grants[i], grants[j]
		ea, eb := a.ExpiresAt, b.ExpiresAt
		if ea == 0 {
			ea = math.MaxInt64
		}
		if eb == 0 {
			eb = math.MaxInt64
		}
		switch {
		case a.Priority != b.Priority:
			return a.Priority < b.Priority
		case ea != eb:
			return ea < eb
		}
		return a.ID < b.ID
	})
	need := d.Cost
	for _, g := range grants {
		left := g.Amount - m.consumed[refGrant{customer, g.ID, rec.gens[g.ID]}]
		if need == 0 || left <= 0 {
			continue
		}
		take := min(left, need)
		d.Draws = append(d.Draws, Draw{Grant: g.ID, Amount: take})
		need -= take
	}
	if need > 0 {
		od := m.overdrawn[refPeriod{customer, start}]
		switch {
		case plan.Overdraft.Policy == schemas.OverdraftDeny:
			return Decision{Outcome: NoCredit}
		case plan.Overdraft.Limit > 0 && bigSum(od, need).Cmp(big.NewInt(plan.Overdraft.Limit)) > 0:
			return Decision{Outcome: NoCredit}
		case bigOver(bigSum(od, need)):
			return Decision{Outcome: Invalid}
		}
		d.Overdraft = need
	}
	return accept()
}

// Balance is the reference's schemas.Balance of a customer as of at, by
// every record read (Add).
func (m *Model) Balance(customer string, at, revision int64) *schemas.Balance {
	return m.BalanceRead(customer, at, revision, len(m.records))
}

// BalanceRead is Balance as written by a stage that had read only the
// first read records Added: its caps_until knows of those only (a record
// read later may schedule a change). Every record that applies at at must
// be among them.
func (m *Model) BalanceRead(customer string, at, revision int64, read int) *schemas.Balance {
	rec := m.recordAt(customer, at)
	plan := rec.Ent
	if plan == nil {
		plan = &schemas.Entitlements{Overdraft: schemas.Overdraft{Policy: schemas.OverdraftAllow}}
	}
	start, end := m.period(at)
	b := &schemas.Balance{CustomerID: customer, Plan: plan.Plan, Unmetered: plan.Unmetered, Revision: revision, UpdatedAt: at,
		PeriodStart: start, PeriodEnd: end, Meters: []schemas.MeterBalance{}, Grants: []schemas.GrantBalance{},
		OverdraftPolicy: plan.Overdraft.Policy, OverdraftLimit: plan.Overdraft.Limit, Overdrawn: m.overdrawn[refPeriod{customer, start}]}
	for _, c := range plan.Caps {
		b.Meters = append(b.Meters, schemas.MeterBalance{Meter: c.Meter, Usage: m.usage[refUsage{customer, c.Meter, start}],
			Limit: c.Limit, OnLimit: c.OnLimit})
	}
	sort.Slice(b.Meters, func(i, j int) bool { return b.Meters[i].Meter < b.Meters[j].Meter })
	for _, g := range plan.Grants {
		if g.ExpiresAt != 0 && g.ExpiresAt <= at {
			continue
		}
		used := m.consumed[refGrant{customer, g.ID, rec.gens[g.ID]}]
		b.Grants = append(b.Grants, schemas.GrantBalance{ID: g.ID, Priority: g.Priority, EffectiveFrom: g.EffectiveFrom,
			ExpiresAt: g.ExpiresAt, Amount: g.Amount, Consumed: used, Remaining: max(0, g.Amount-used)})
	}
	sort.Slice(b.Grants, func(i, j int) bool { return b.Grants[i].ID < b.Grants[j].ID })
	b.CapsUntil = m.capsUntil(customer, at, plan, read)
	return b
}

// capsUntil: the earliest effective time after at of one of the first read
// records, the customer's or the default plan's, at which the record in
// effect for the customer by those records has other caps (by meter) or
// another unmetered than plan; 0: none.
func (m *Model) capsUntil(customer string, at int64, plan *schemas.Entitlements, read int) int64 {
	known := &Model{records: m.records[:read]}
	var times []int64
	for _, r := range known.records {
		if (r.Key == customer || r.Key == schemas.DefaultPlanKey) && r.effective() > at {
			times = append(times, r.effective())
		}
	}
	slices.Sort(times)
	for _, t := range times {
		p := known.recordAt(customer, t).Ent
		if p == nil {
			p = &schemas.Entitlements{}
		}
		if p.Unmetered != plan.Unmetered || !sameCaps(p.Caps, plan.Caps) {
			return t
		}
	}
	return 0
}

// sameCaps: the same caps, whatever their order.
func sameCaps(a, b []schemas.Cap) bool {
	byMeter := func(cs []schemas.Cap) []schemas.Cap {
		cs = slices.Clone(cs)
		sort.Slice(cs, func(i, j int) bool { return cs[i].Meter < cs[j].Meter })
		return cs
	}
	return slices.Equal(byMeter(a), byMeter(b))
}
