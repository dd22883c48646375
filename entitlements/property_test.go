package entitlements

import (
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"sort"
	"testing"
	"time"

	"github.com/meterline/meterline/entitlements/entref"
	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/schemas"
)

func monthBounds(ms int64) (int64, int64) {
	t := time.UnixMilli(ms).UTC()
	s := time.Date(t.Year(), t.Month(), 1, 0, 0, 0, 0, time.UTC)
	return s.UnixMilli(), s.AddDate(0, 1, 0).UnixMilli()
}

func dayBounds(ms int64) (int64, int64) {
	const day = int64(24 * time.Hour / time.Millisecond)
	s := ms - ((ms%day)+day)%day
	return s, s + day
}

// The meters of the generated scenarios and their aggregations.
var propMeters = []struct{ name, agg string }{
	{"api_calls", "SUM"}, {"tokens", "SUM"}, {"requests", "COUNT"}, {"peak", "MAX"},
}

type propEntRecord struct {
	key     []byte
	value   []byte // nil: tombstone
	written int64
	ref     entref.Record
	valid   bool
}

type propEvent struct {
	customer string
	ev       Event
}

// scenario is one generated run: entitlements records in read order
// (broker times mostly rising, sometimes stepping back) and events in
// processing order.
type scenario struct {
	window  time.Duration
	period  func(int64) (int64, int64)
	records []propEntRecord
	events  []propEvent
	// What the scenario exercises, for the test's log and its check that
	// the generator still does: records whose broker time is not after
	// the latest one read before them (a clock that stepped back, or the
	// same millisecond), of them those that count as read in the
	// millisecond of an event's arrival, grant ids offered again by a
	// later version, of them those offered again at least W after the
	// latest expiry any record gave them (a new generation, unless a
	// customer's own records keep another alive), and records read within
	// a millisecond of such a latest expiry plus W.
	stepBacks, stepBacksAtArrival, reoffers, reoffersAfterW, atGenEdge int
}

const (
	hourMs = int64(time.Hour / time.Millisecond)
	dayMs  = 24 * hourMs
)

var propCustomers = []string{"acme", "globex", "initech", "umbrella"}

// genScenario generates a scenario: a dedup window W of 10, 3 or 1 days,
// monthly, daily or hourly billing periods, four customers over 60 days.
// Amounts at the edges of 64 bits: some grants, caps and overdraft limits
// within 3 of math.MaxInt64, some rates of math.MaxInt64 micro-credits or
// per math.MaxInt64 units, some quantities about math.MaxInt64/2; and some
// events of tokens decided as COUNT, MAX, UNIQUE_COUNT or LATEST (a meter
// whose aggregation changed: its caps and rates apply to SUM and COUNT
// only).
//
// Events: arrivals mostly rising, some behind (another source's
// watermark, a re-routed event as far back as W behind the latest arrival
// before it, which is what the aggregator's prune horizon, its watermark
// less W, allows); event times from just inside W before the arrival to
// an hour after it.
//
// Records: customers' records, the default plan, rate cards and ticks,
// their broker times mostly rising; some step back behind what was read
// (a broker clock that stepped back; the records after them continue
// from there), some to the very millisecond read last, some land in the
// millisecond of an event's arrival. Customers' records come from five
// days before the first event, some scheduled (effective_from ahead), so
// that versions are read before a customer's first draw. Grant ids are
// offered again by later versions of the customer's record and of the
// default plan, with the same window, or extended, shortened or moved, and
// other amounts and priorities, some while the grant is alive, some at
// least W after the latest expiry any record gave it (a new generation,
// docs/entitlements.md), some read within a millisecond of that edge.
func genScenario(seed uint64) scenario {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	base := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC).UnixMilli()
	sc := scenario{window: []time.Duration{10, 3, 1}[r.IntN(3)] * 24 * time.Hour, period: monthBounds}
	switch r.IntN(3) {
	case 0:
		sc.period = dayBounds
	case 1:
		sc.period = func(ms int64) (int64, int64) { s := ms - ((ms%hourMs)+hourMs)%hourMs; return s, s + hourMs }
	}
	w := sc.window.Milliseconds()
	span := 60 * dayMs
	customers := propCustomers
	at := func() int64 { return base + r.Int64N(span) } // a time in the run

	// Events, in processing order.
	nev := 300 + r.IntN(500)
	hi := base // the latest arrival so far
	var arrivals, his []int64
	for i := 0; i < nev; i++ {
		hi += r.Int64N(2 * span / int64(nev)) // 0: the same millisecond
		a := hi
		switch k := r.IntN(40); {
		case k < 4:
			a -= r.Int64N(min(3*dayMs, w)) // behind another source's watermark
		case k == 4:
			a -= w // re-routed: at the prune horizon exactly
		case k == 5:
			a -= r.Int64N(w) // re-routed
		}
		et := a - r.Int64N(hourMs)
		switch r.IntN(8) {
		case 0, 1:
			et = a - w + 1 + r.Int64N(w-1) // late, as late as dedup allows
		case 2:
			et = a - w + 1 // the earliest dedup accepts
		case 3:
			et = a + r.Int64N(hourMs) // future skew
		}
		m := propMeters[r.IntN(len(propMeters))]
		if m.name == "tokens" && r.IntN(3) == 0 {
			m.agg = []string{"COUNT", "MAX", "UNIQUE_COUNT", "LATEST"}[r.IntN(4)]
		}
		q := r.Int64N(40)
		if r.IntN(50) == 0 {
			q = math.MaxInt64/2 + r.Int64N(3)
		}
		if r.IntN(200) == 0 {
			q = math.MaxInt64 - r.Int64N(10) // overflow
		}
		sc.events = append(sc.events, propEvent{customer: customers[r.IntN(len(customers))],
			ev: Event{Meter: m.name, Aggregation: m.agg, Quantity: q, EventTime: et, Arrival: a}})
		arrivals, his = append(arrivals, a), append(his, hi)
	}
	sort.Slice(arrivals, func(i, j int) bool { return arrivals[i] < arrivals[j] })

	// Grants. lastWin: the window an id was last offered with; latest:
	// by id, the latest expiry a valid record offered it with
	// (math.MaxInt64: never).
	// "monthly" always has a window of ten days at most, near the time
	// its record is read: its generations end and new ones start.
	grantIDs := []string{"promo", "welcome", "annual", "monthly"}
	type window struct{ from, exp int64 }
	lastWin := map[string]window{}
	latest := map[string]int64{}
	genGrant := func(id string) schemas.Grant {
		g := schemas.Grant{ID: id, Amount: 1 + r.Int64N(200_000), Priority: int32(r.IntN(3))}
		if r.IntN(8) == 0 {
			g.Amount = math.MaxInt64 - r.Int64N(3)
		}
		lw, seen := lastWin[id]
		switch k := r.IntN(6); {
		case !seen || k == 0: // a window of its own
			if r.IntN(2) == 0 {
				g.EffectiveFrom = at()
			}
			if r.IntN(4) != 0 {
				g.ExpiresAt = max(g.EffectiveFrom, base) + 1 + r.Int64N(span)
			}
		case k == 1: // the same window
			g.EffectiveFrom, g.ExpiresAt = lw.from, lw.exp
		case k == 2: // the same window, a small amount (less than it paid)
			g.EffectiveFrom, g.ExpiresAt = lw.from, lw.exp
			g.Amount = 1 + r.Int64N(2000)
		case k == 3: // extended, maybe to never
			g.EffectiveFrom = lw.from
			if lw.exp != 0 && r.IntN(4) != 0 {
				g.ExpiresAt = lw.exp + 1 + r.Int64N(20*dayMs)
			}
		case k == 4: // shortened
			g.EffectiveFrom = lw.from
			lo, end := max(lw.from, base-10*dayMs), lw.exp
			if end == 0 {
				end = base + span
			}
			g.ExpiresAt = lo + 1 + r.Int64N(max(1, end-lo-1))
		default: // moved
			d := r.Int64N(20*dayMs) - 10*dayMs
			if lw.from != 0 {
				g.EffectiveFrom = max(0, lw.from+d)
			}
			if lw.exp != 0 {
				g.ExpiresAt = max(g.EffectiveFrom+1, lw.exp+d)
			}
		}
		if r.IntN(6) == 0 {
			// Expiring at the edge of what pruning keeps when the
			// watermark is at the latest arrival: the earliest event
			// time of an event still to come is 2W less 1 ms behind it.
			if x := his[r.IntN(len(his))] - 2*w + r.Int64N(3); x > g.EffectiveFrom {
				g.ExpiresAt = x
			}
		}
		return g
	}
	// genGrants: the grants of a record read at readAt.
	genGrants := func(readAt int64) []schemas.Grant {
		gs := []schemas.Grant{}
		for _, id := range grantIDs {
			if r.IntN(2) != 0 {
				continue
			}
			g := genGrant(id)
			if id == "monthly" && (g.ExpiresAt == 0 || r.IntN(4) != 0) {
				g.EffectiveFrom = max(0, readAt-r.Int64N(5*dayMs))
				g.ExpiresAt = g.EffectiveFrom + 1 + r.Int64N(10*dayMs)
			}
			if _, seen := lastWin[id]; seen {
				sc.reoffers++
				if latest[id] <= readAt-w {
					sc.reoffersAfterW++
				}
			}
			gs = append(gs, g)
		}
		return gs
	}
	// offered records the grants of a valid record.
	offered := func(gs []schemas.Grant) {
		for _, g := range gs {
			lastWin[g.ID] = window{g.EffectiveFrom, g.ExpiresAt}
			x := g.ExpiresAt
			if x == 0 {
				x = math.MaxInt64
			}
			latest[g.ID] = max(latest[g.ID], x)
		}
	}

	genPlan := func(customer string, readAt int64) *schemas.Entitlements {
		e := &schemas.Entitlements{CustomerID: customer, Plan: []string{"free", "pro", "team"}[r.IntN(3)],
			Unmetered: r.IntN(12) == 0, Caps: []schemas.Cap{}, Grants: genGrants(readAt),
			Overdraft: schemas.Overdraft{Policy: schemas.OverdraftAllow}}
		for _, m := range propMeters {
			if r.IntN(2) == 0 {
				lim := 1 + r.Int64N(300)
				if m.agg == "SUM" && r.IntN(3) == 0 {
					lim = 1 + r.Int64N(3000)
				}
				if r.IntN(10) == 0 {
					lim = math.MaxInt64 - r.Int64N(3)
				}
				on := schemas.OnLimitReject
				if r.IntN(3) == 0 {
					on = schemas.OnLimitAllow
				}
				e.Caps = append(e.Caps, schemas.Cap{Meter: m.name, Limit: lim, OnLimit: on})
			}
		}
		switch r.IntN(3) {
		case 0:
			e.Overdraft.Policy = schemas.OverdraftDeny
		case 1:
			e.Overdraft.Limit = r.Int64N(50_000)
			if r.IntN(4) == 0 {
				e.Overdraft.Limit = math.MaxInt64 - r.Int64N(3)
			}
		}
		return e
	}
	genCard := func() *schemas.RateCard {
		c := &schemas.RateCard{Versions: []schemas.RateVersion{}}
		n := 1 + r.IntN(4)
		var effs []int64
		for i := 0; i < n; i++ {
			effs = append(effs, base-30*dayMs+r.Int64N(span+30*dayMs))
		}
		sort.Slice(effs, func(i, j int) bool { return effs[i] < effs[j] })
		for i, eff := range effs {
			if i > 0 && eff == effs[i-1] {
				continue
			}
			v := schemas.RateVersion{EffectiveFrom: eff, Rates: []schemas.Rate{}}
			for _, m := range propMeters {
				if r.IntN(4) == 0 {
					continue
				}
				rt := schemas.Rate{Meter: m.name, MicroCredits: r.Int64N(2000), PerUnits: []int64{1, 3, 10, 1000}[r.IntN(4)]}
				if r.IntN(40) == 0 {
					rt.MicroCredits, rt.PerUnits = math.MaxInt64/2, 1 // overflows on big quantities
				}
				switch r.IntN(30) {
				case 0:
					rt.MicroCredits, rt.PerUnits = math.MaxInt64, math.MaxInt64
				case 1:
					rt.MicroCredits, rt.PerUnits = math.MaxInt64, 3
				case 2:
					rt.MicroCredits, rt.PerUnits = 1, math.MaxInt64
				}
				v.Rates = append(v.Rates, rt)
			}
			c.Versions = append(c.Versions, v)
		}
		return c
	}

	// Entitlements records, in read order.
	clock := base - 5*dayMs // the broker's clock
	var readTo int64        // the latest broker time of the records so far
	nrec := 30 + r.IntN(50)
	lastCustomer := ""
	for i := 0; i < nrec; i++ {
		// Sometimes a customer's record is written again soon after
		// (a correction: a grant's window changed before it paid).
		again := lastCustomer != "" && r.IntN(3) == 0
		if again {
			clock += r.Int64N(dayMs)
		} else {
			clock += 1 + r.Int64N(span/int64(nrec))
		}
		switch k := r.IntN(12); {
		case k < 2 && readTo > 0:
			// The broker's clock stepped back behind what was read
			// (maybe to the very millisecond read last), and goes on
			// from there.
			clock = readTo - r.Int64N(2)*r.Int64N(2*dayMs)
		case k < 4:
			// In the millisecond of an event's arrival.
			if j := sort.Search(len(arrivals), func(j int) bool { return arrivals[j] >= clock }); j < len(arrivals) {
				clock = arrivals[j]
			}
		case k < 6:
			// At the edge of a grant's generation: W after the
			// latest expiry any record gave it, a millisecond
			// before, at or after.
			id := "monthly"
			if r.IntN(2) == 0 {
				id = grantIDs[r.IntN(len(grantIDs))]
			}
			if x, ok := latest[id]; ok && x < math.MaxInt64-w {
				if edge := x + w - 1 + r.Int64N(3); edge >= clock && edge-clock <= 10*dayMs {
					clock = edge
					sc.atGenEdge++
				}
			}
		}
		ts := clock
		if ts <= readTo {
			sc.stepBacks++
			if j := sort.Search(len(arrivals), func(j int) bool { return arrivals[j] >= readTo }); j < len(arrivals) && arrivals[j] == readTo {
				sc.stepBacksAtArrival++
			}
		}
		readTo = max(readTo, ts)
		rec := propEntRecord{written: ts, valid: true}
		prev := lastCustomer
		lastCustomer = ""
		switch k := r.IntN(10); {
		case k < 6 || again: // a customer
			c := customers[r.IntN(len(customers))]
			if again {
				c = prev
			}
			lastCustomer = c
			rec.key = schemas.CustomerKey(c)
			rec.ref = entref.Record{Key: c, Written: ts}
			if r.IntN(6) == 0 {
				break // tombstone
			}
			e := genPlan(c, readTo)
			switch r.IntN(3) {
			case 0:
				e.EffectiveFrom = ts - r.Int64N(10*dayMs) // in the past: raised
			case 1:
				e.EffectiveFrom = ts + r.Int64N(15*dayMs) // scheduled
			}
			if r.IntN(15) == 0 {
				e.Caps = append(e.Caps, schemas.Cap{Meter: "zzz", Limit: 0, OnLimit: schemas.OnLimitReject}) // invalid
				rec.valid = false
			} else {
				offered(e.Grants)
			}
			rec.value, _ = schemas.Encode(e)
			rec.ref.Ent = e
		case k < 8:
			rec.key = []byte(schemas.DefaultPlanKey)
			rec.ref = entref.Record{Key: schemas.DefaultPlanKey, Written: ts}
			if r.IntN(8) == 0 {
				break
			}
			e := genPlan("", readTo)
			if r.IntN(2) == 0 {
				e.EffectiveFrom = ts + r.Int64N(5*dayMs)
			}
			offered(e.Grants)
			rec.value, _ = schemas.Encode(e)
			rec.ref.Ent = e
		case k < 9:
			rec.key = []byte(schemas.RateCardKey)
			rec.ref = entref.Record{Key: schemas.RateCardKey, Written: ts}
			if r.IntN(10) == 0 {
				break
			}
			c := genCard()
			rec.value, _ = schemas.Encode(c)
			rec.ref.Card = c
		default:
			rec.key = []byte(schemas.TickKey)
			rec.value, _ = schemas.Encode(&schemas.Tick{InstanceID: "a"})
			rec.valid = false // nothing for the reference but its time
		}
		sc.records = append(sc.records, rec)
	}
	return sc
}

// TestLedgerMatchesReference runs generated scenarios (genScenario)
// through the Ledger, its state a byte map re-read on every call (as
// Pebble would hold it), and compares every decision, and balances at
// random points and at the end, with the reference model to the
// micro-credit. The reference reads every record up front and never
// prunes; the Ledger reads the entitlements partition as the aggregator's
// gate does (past each event's arrival before deciding it, sometimes
// further), prunes as the aggregator does (PruneCustomer after a
// customer's record, PruneShared after a default plan or rate card, at its
// watermark less W) and at random points between events (PruneShared,
// PruneCustomer, PrunePeriods in chunks across transactions), and replays
// aborted transactions. After each PruneCustomer and at random points, what
// each grant paid a customer must still be the reference's while a record
// read offered the grant until after the earliest event time an event
// still to come can have (PruneCustomer's contract): a grant offered again
// must not pay twice, even when no event shows it.
func TestLedgerMatchesReference(t *testing.T) {
	seeds := 120
	if testing.Short() {
		seeds = 40
	}
	seeds += testenv.PropertySeeds() // METERLINE_PROPERTY_SEEDS
	var decided, rejected, pruned, balances, capsUntil, paidChecks, stepBacks, atArrival, reoffers, afterW, atEdge, newGenDraws int
	for seed := uint64(1); seed <= uint64(seeds); seed++ {
		sc := genScenario(seed)
		stepBacks, atArrival, reoffers = stepBacks+sc.stepBacks, atArrival+sc.stepBacksAtArrival, reoffers+sc.reoffers
		afterW, atEdge = afterW+sc.reoffersAfterW, atEdge+sc.atGenEdge
		for _, v := range []struct{ cached, ahead bool }{{false, false}, {true, false}, {seed%2 == 0, true}} {
			t.Run(fmt.Sprintf("%d/cached=%v/ahead=%v", seed, v.cached, v.ahead), func(t *testing.T) {
				s := runScenario(t, seed, v.cached, v.ahead)
				decided, rejected, pruned, balances = decided+s.decided, rejected+s.rejected, pruned+s.pruned, balances+s.balances
				capsUntil += s.capsUntil
				paidChecks, newGenDraws = paidChecks+s.paidChecks, newGenDraws+s.newGenDraws
			})
		}
	}
	t.Logf("%d events decided (%d rejected), %d balances (%d with a scheduled change of caps) and %d times what grants paid compared, %d state keys pruned, %d records stepped back (%d to an event's arrival), %d grants offered again (%d at least W after their latest expiry, %d records at a generation's edge), %d draws from a generation after the first of its id, over %d seeds",
		decided, rejected, balances, capsUntil, paidChecks, pruned, stepBacks, atArrival, reoffers, afterW, atEdge, newGenDraws, seeds)
	if rejected == 0 || rejected == decided {
		t.Fatalf("the scenarios do not exercise both outcomes (%d of %d rejected)", rejected, decided)
	}
	if capsUntil == 0 || capsUntil == balances {
		t.Fatalf("the scenarios do not exercise balances with and without a scheduled change of caps (%d of %d)", capsUntil, balances)
	}
	if pruned == 0 || stepBacks == 0 || atArrival == 0 || reoffers == 0 || afterW == 0 || atEdge == 0 || newGenDraws == 0 {
		t.Fatalf("the scenarios do not exercise pruning (%d keys), stepped-back records (%d, %d at an arrival), grants offered again (%d, %d after W, %d at the edge) or draws from a later generation (%d)",
			pruned, stepBacks, atArrival, reoffers, afterW, atEdge, newGenDraws)
	}
}

// refDraws converts draws to the reference's.
func refDraws(ds []Draw) []entref.Draw {
	var out []entref.Draw
	for _, d := range ds {
		out = append(out, entref.Draw{Grant: d.Grant, Amount: d.Amount})
	}
	return out
}

type runStats struct{ decided, rejected, pruned, balances, capsUntil, paidChecks, newGenDraws int }

// runScenario runs one scenario; cached: through an AccountCache that the
// Ledger changes in place, written at random commit points (as the
// aggregator's transactions do) and dropped with an aborted transaction;
// ahead: as a stage behind on usage.deduped, which has read (and applied,
// and pruned after) every record of the entitlements partition before it
// decides the first event, else as one caught up, which reads the records
// as its events need them (and sometimes a little further).
func runScenario(t *testing.T, seed uint64, cached, ahead bool) (s runStats) {
	sc := genScenario(seed)
	r := rand.New(rand.NewPCG(seed, 7))
	l, err := New(Config{Prefix: []byte("e"), Window: sc.window, Period: sc.period})
	if err != nil {
		t.Fatal(err)
	}
	var st interface {
		Store
		snapshot() map[string][]byte
		restore(map[string][]byte)
		bytes() int
		keys() int
	}
	commit, abort := func() {}, func() {}
	if cached {
		cs := newCachedStore(l)
		st, commit, abort = cs, cs.commit, cs.abort
	} else {
		st = newMemStore()
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	// The reference reads every record now: what it decides depends on
	// the records in effect at an event's arrival, never on how far the
	// partition had been read when the event was decided.
	ref := entref.New(sc.period).Window(sc.window)
	for _, pr := range sc.records {
		if pr.valid {
			ref.Add(pr.ref)
		} else {
			ref.Read(pr.written)
		}
	}
	w := sc.window.Milliseconds()
	// The stage's watermark: rising, never past the latest arrival
	// decided. Every event still to come arrives at or after it less W
	// (genScenario), the aggregator's prune horizon.
	var wm, latestArrival int64
	horizon := func() int64 { return wm - w }
	pruned := int64(math.MinInt64 / 2) // the latest horizon pruned at
	next := 0                          // next record to read
	validRead := 0                     // the valid records among those read: the reference's first
	var keptPaid func()
	readOne := func() {
		pr := sc.records[next]
		next++
		rec, err := ParseRecord(pr.key, pr.value, pr.written)
		if err != nil {
			if pr.valid {
				t.Fatalf("record %d: %v", next-1, err)
			}
			must(l.Advance(st, pr.written))
			return
		}
		if err := l.Apply(st, rec); err != nil {
			t.Fatalf("apply record %d: %v", next-1, err)
		}
		if pr.valid {
			validRead++
		}
		// As the aggregator prunes after a record it applied.
		switch {
		case rec.IsTick():
		case rec.Key.Reserved == "":
			pruned = max(pruned, horizon())
			must(l.PruneCustomer(st, rec.Key.Customer, horizon()))
			keptPaid()
		default:
			pruned = max(pruned, horizon())
			must(l.PruneShared(st, horizon()))
		}
	}
	balance := func(c string, at int64) {
		t.Helper()
		got, err := l.Balance(st, c, at, 9)
		must(err)
		if want := ref.BalanceRead(c, at, 9, validRead); !reflect.DeepEqual(got, want) {
			t.Fatalf("balance of %s at %d (horizon %d):\n ledger    %+v\n reference %+v", c, at, horizon(), got, want)
		}
		s.balances++
		if got.CapsUntil != 0 {
			s.capsUntil++
		}
	}
	// What each grant generation paid is kept while the Ledger may read
	// it again (PruneCustomer's contract): while a record read next would
	// continue it (the reference's generation for a customer's record, or
	// the default plan's, read now), and while a version that may decide
	// an event still to come offers it with an expiry after the earliest
	// event time such an event can have (dedup: more than W before its
	// arrival, at or after the horizon). A grant offered again must not
	// pay twice, nor a new generation pay less, even when no event shows
	// it.
	keptPaid = func() {
		t.Helper()
		n := 0 // the records the reference has read that the Ledger has
		ids := map[string]bool{}
		for _, pr := range sc.records[:next] {
			if !pr.valid {
				continue
			}
			n++
			if pr.ref.Ent != nil {
				for _, g := range pr.ref.Ent.Grants {
					ids[g.ID] = true
				}
			}
		}
		rt, err := l.ReadTo(st)
		must(err)
		def, err := l.timeline(st, l.keyDefault)
		must(err)
		etMin := pruned - w + 1
		for _, c := range propCustomers {
			a, err := l.account(st, c)
			must(err)
			for id := range ids {
				for _, key := range []string{c, schemas.DefaultPlanKey} {
					gen := ref.GenAfter(n, key, id, rt)
					if got, want := consumedOf(a.uses, id, gen), ref.Paid(c, id, gen); got != want {
						t.Fatalf("%s's grant %s, generation %d (continued by a record of %q read at %d): paid %d, the reference %d",
							c, id, gen, key, rt, got, want)
					}
				}
			}
			own, err := l.timeline(st, l.customerKey(subTimeline, c))
			must(err)
			for _, vs := range [][]Version{own.Versions(), def.Versions()} {
				for j, v := range vs {
					if v.Plan == nil || j+1 < len(vs) && vs[j+1].From <= pruned {
						continue // decides no event still to come
					}
					for i, g := range v.Plan.Grants {
						gen := v.Plan.gen(i)
						if got, want := consumedOf(a.uses, g.ID, gen), ref.Paid(c, g.ID, gen); expiry(g) > etMin && got != want {
							t.Fatalf("%s's grant %s, generation %d, offered until %d from %d, horizon %d: paid %d, the reference %d",
								c, g.ID, gen, expiry(g), v.From, pruned, got, want)
						}
					}
				}
			}
		}
		s.paidChecks++
	}
	if ahead {
		for next < len(sc.records) {
			readOne()
		}
	}
	outcomes := map[Outcome]int{}
	for i := 0; i < len(sc.events); i++ {
		pe := sc.events[i]
		if pe.ev.Arrival < horizon() {
			t.Fatalf("event %d arrived at %d, before the prune horizon %d", i, pe.ev.Arrival, horizon())
		}
		// The gate: the stage decides an event only once it has read
		// its entitlements partition past the event's arrival (every
		// record read later then applies from a later time); it may
		// have read further.
		for next < len(sc.records) {
			rt, err := l.ReadTo(st)
			must(err)
			if rt > pe.ev.Arrival {
				break
			}
			readOne()
		}
		for ahead := pe.ev.Arrival + r.Int64N(3)*r.Int64N(2*dayMs); next < len(sc.records) && sc.records[next].written <= ahead; {
			readOne()
		}
		if r.IntN(25) == 0 {
			// A transaction decides a few events and aborts: its
			// state never reaches the store; the events are
			// decided again from the committed state.
			commit()
			snap := st.snapshot()
			for j := i; j < min(i+1+r.IntN(5), len(sc.events)); j++ {
				if _, err := l.Decide(st, sc.events[j].customer, sc.events[j].ev); err != nil {
					t.Fatal(err)
				}
			}
			abort()
			st.restore(snap)
		}
		got, err := l.Decide(st, pe.customer, pe.ev)
		must(err)
		want := ref.Decide(pe.customer, entref.Event(pe.ev))
		gotMoney := entref.Decision{Outcome: got.Outcome.String(), Units: got.Units, Cost: got.Cost, Draws: refDraws(got.Draws),
			Overdraft: got.Overdraft, OverCap: got.OverCap}
		if got.Outcome != Accepted {
			gotMoney = entref.Decision{Outcome: got.Outcome.String()}
		}
		if !reflect.DeepEqual(gotMoney, want) {
			t.Fatalf("event %d %+v of %s (horizon %d):\n ledger    %+v (%s)\n reference %+v\n plan %+v",
				i, pe.ev, pe.customer, horizon(), gotMoney, got.Detail, want, ref.PlanAt(pe.customer, pe.ev.Arrival))
		}
		outcomes[got.Outcome]++
		if got.Outcome != Accepted {
			s.rejected++
		}
		for _, dr := range got.Draws {
			if got.Outcome == Accepted && dr.gen != firstGen(sc, dr.Grant) {
				s.newGenDraws++
			}
		}
		s.decided++
		latestArrival = max(latestArrival, pe.ev.Arrival)
		if r.IntN(3) != 0 {
			wm = max(wm, latestArrival-r.Int64N(2)*r.Int64N(hourMs))
		}
		if r.IntN(15) == 0 {
			// Prune at a random point: what the aggregator does at a
			// period start, and more.
			commit()
			before := st.keys()
			pruned = max(pruned, horizon())
			if r.IntN(2) == 0 {
				must(l.PruneShared(st, horizon()))
			}
			for _, c := range propCustomers {
				if r.IntN(2) == 0 {
					must(l.PruneCustomer(st, c, horizon()))
				}
			}
			for more, n := true, 1+r.IntN(3); more; {
				if more, err = l.PrunePeriods(st, horizon(), n); err != nil {
					t.Fatal(err)
				}
				if r.IntN(2) == 0 {
					commit()
				}
			}
			commit()
			s.pruned += max(0, before-st.keys())
			keptPaid()
		}
		if r.IntN(10) == 0 {
			keptPaid()
		}
		if r.IntN(20) == 0 {
			// A balance as of the latest arrival decided: every
			// record that applies then has been read.
			balance(propCustomers[r.IntN(len(propCustomers))], latestArrival)
		}
		if r.IntN(7) == 0 {
			commit()
		}
	}
	// Balances as of the end, for every customer, and as of the time the
	// partition was read to, once every record is read.
	for next < len(sc.records) {
		readOne()
	}
	rt, err := l.ReadTo(st)
	must(err)
	for _, c := range propCustomers {
		balance(c, latestArrival)
		balance(c, max(latestArrival, rt))
	}
	commit()
	t.Logf("seed %d: %v; state %d keys, %d bytes", seed, outcomes, st.keys(), st.bytes())
	return s
}

// firstGen is the generation of a grant id's first offer in a scenario:
// named by the read time of the first valid record that offers it
// (ownGen's name for a customer's record).
func firstGen(sc scenario, id string) int64 {
	var readTo int64
	for _, pr := range sc.records {
		readTo = max(readTo, pr.written)
		if !pr.valid || pr.ref.Ent == nil {
			continue
		}
		for _, g := range pr.ref.Ent.Grants {
			if g.ID == id && pr.ref.Key == schemas.DefaultPlanKey {
				return readTo
			} else if g.ID == id {
				return ownGen(readTo)
			}
		}
	}
	return legacyGen
}
