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
// (broker times increasing) and events in processing order.
type scenario struct {
	window  time.Duration
	period  func(int64) (int64, int64)
	records []propEntRecord
	events  []propEvent
}

const hourMs = int64(time.Hour / time.Millisecond)

func genScenario(seed uint64) scenario {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	base := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC).UnixMilli()
	sc := scenario{window: 10 * 24 * time.Hour, period: monthBounds}
	if r.IntN(2) == 0 {
		sc.period = dayBounds
	}
	w := sc.window.Milliseconds()
	span := 60 * 24 * hourMs
	customers := []string{"acme", "globex", "initech", "umbrella"}
	at := func() int64 { return base + r.Int64N(span) } // a time in the run
	// A grant id keeps its window across records (amounts and
	// priorities change): an id reused with a new window after its old
	// one passed is a new grant, which the reference does not model.
	grantIDs := []string{"promo", "welcome", "topup-1", "topup-2", "annual"}
	windows := map[string][2]int64{}
	for _, id := range grantIDs {
		var w [2]int64
		if r.IntN(2) == 0 {
			w[0] = at()
		}
		if r.IntN(2) == 0 {
			w[1] = max(w[0], base) + 1 + r.Int64N(span)
		}
		windows[id] = w
	}

	genPlan := func(customer string) *schemas.Entitlements {
		e := &schemas.Entitlements{CustomerID: customer, Plan: []string{"free", "pro", "team"}[r.IntN(3)],
			Unmetered: r.IntN(12) == 0, Caps: []schemas.Cap{}, Grants: []schemas.Grant{},
			Overdraft: schemas.Overdraft{Policy: schemas.OverdraftAllow}}
		for _, m := range propMeters {
			if r.IntN(2) == 0 {
				lim := 1 + r.Int64N(300)
				if m.agg == "SUM" && r.IntN(3) == 0 {
					lim = 1 + r.Int64N(3000)
				}
				on := schemas.OnLimitReject
				if r.IntN(3) == 0 {
					on = schemas.OnLimitAllow
				}
				e.Caps = append(e.Caps, schemas.Cap{Meter: m.name, Limit: lim, OnLimit: on})
			}
		}
		for _, id := range grantIDs {
			if r.IntN(3) != 0 {
				continue
			}
			g := schemas.Grant{ID: id, Amount: 1 + r.Int64N(200_000), Priority: int32(r.IntN(3)),
				EffectiveFrom: windows[id][0], ExpiresAt: windows[id][1]}
			e.Grants = append(e.Grants, g)
		}
		switch r.IntN(3) {
		case 0:
			e.Overdraft.Policy = schemas.OverdraftDeny
		case 1:
			e.Overdraft.Limit = r.Int64N(50_000)
		}
		return e
	}
	genCard := func() *schemas.RateCard {
		c := &schemas.RateCard{Versions: []schemas.RateVersion{}}
		n := 1 + r.IntN(4)
		var effs []int64
		for i := 0; i < n; i++ {
			effs = append(effs, base-30*24*hourMs+r.Int64N(span+30*24*hourMs))
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
				v.Rates = append(v.Rates, rt)
			}
			c.Versions = append(c.Versions, v)
		}
		return c
	}

	// Entitlements records, broker times increasing (LogAppendTime).
	ts := base - 5*24*hourMs
	nrec := 20 + r.IntN(40)
	for i := 0; i < nrec; i++ {
		ts += 1 + r.Int64N(span/int64(nrec))
		rec := propEntRecord{written: ts, valid: true}
		switch k := r.IntN(10); {
		case k < 6: // a customer
			c := customers[r.IntN(len(customers))]
			rec.key = schemas.CustomerKey(c)
			rec.ref = entref.Record{Key: c, Written: ts}
			if r.IntN(6) == 0 {
				break // tombstone
			}
			e := genPlan(c)
			switch r.IntN(3) {
			case 0:
				e.EffectiveFrom = ts - r.Int64N(10*24*hourMs) // in the past: raised
			case 1:
				e.EffectiveFrom = ts + r.Int64N(15*24*hourMs) // scheduled
			}
			if r.IntN(15) == 0 {
				e.Caps = append(e.Caps, schemas.Cap{Meter: "zzz", Limit: 0, OnLimit: schemas.OnLimitReject}) // invalid
				rec.valid = false
			}
			rec.value, _ = schemas.Encode(e)
			rec.ref.Ent = e
		case k < 8:
			rec.key = []byte(schemas.DefaultPlanKey)
			rec.ref = entref.Record{Key: schemas.DefaultPlanKey, Written: ts}
			if r.IntN(8) == 0 {
				break
			}
			e := genPlan("")
			if r.IntN(2) == 0 {
				e.EffectiveFrom = ts + r.Int64N(5*24*hourMs)
			}
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
			rec.valid = false // nothing for the reference
		}
		sc.records = append(sc.records, rec)
	}

	// Events: arrivals mostly increasing, some processed out of arrival
	// order (re-routed, or behind another source's watermark); event
	// times up to W before arrival (late) and up to 1h after (skew).
	nev := 300 + r.IntN(500)
	arrival := base
	for i := 0; i < nev; i++ {
		arrival += r.Int64N(2 * span / int64(nev))
		a := arrival
		if r.IntN(10) == 0 {
			a -= r.Int64N(3 * 24 * hourMs)
		}
		et := a - r.Int64N(hourMs)
		switch r.IntN(6) {
		case 0:
			et = a - w + 1 + r.Int64N(w-1) // late, as late as dedup allows
		case 1:
			et = a + r.Int64N(hourMs) // future skew
		}
		m := propMeters[r.IntN(len(propMeters))]
		q := r.Int64N(40)
		if r.IntN(200) == 0 {
			q = math.MaxInt64 - r.Int64N(10) // overflow
		}
		sc.events = append(sc.events, propEvent{customer: customers[r.IntN(len(customers))],
			ev: Event{Meter: m.name, Aggregation: m.agg, Quantity: q, EventTime: et, Arrival: a}})
	}
	return sc
}

// TestLedgerMatchesReference runs generated scenarios through the Ledger,
// its state a byte map re-read on every call (as Pebble would hold it),
// with random lookahead in the entitlements partition, pruning at the
// horizon of the events still to come, and aborted transactions replayed,
// and compares every decision and the final balances with the reference
// model to the micro-credit.
func TestLedgerMatchesReference(t *testing.T) {
	seeds := 60
	if testing.Short() {
		seeds = 20
	}
	var decided, rejected, pruned int
	for seed := uint64(1); seed <= uint64(seeds); seed++ {
		for _, cached := range []bool{false, true} {
			t.Run(fmt.Sprintf("%d/cached=%v", seed, cached), func(t *testing.T) {
				d, rj, pr := runScenario(t, seed, cached)
				decided, rejected, pruned = decided+d, rejected+rj, pruned+pr
			})
		}
	}
	t.Logf("%d events decided (%d rejected), %d state keys pruned, over %d seeds", decided, rejected, pruned, seeds)
	if rejected == 0 || rejected == decided {
		t.Fatalf("the scenarios do not exercise both outcomes (%d of %d rejected)", rejected, decided)
	}
}

// refDraws converts draws to the reference's.
func refDraws(ds []Draw) []entref.Draw {
	var out []entref.Draw
	for _, d := range ds {
		out = append(out, entref.Draw(d))
	}
	return out
}

// runScenario runs one scenario; cached: through an AccountCache that the
// Ledger changes in place, written at random commit points (as the
// aggregator's transactions do) and dropped with an aborted transaction.
func runScenario(t *testing.T, seed uint64, cached bool) (decided, rejected, pruned int) {
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
	ref := entref.New(sc.period)
	next := 0 // next record to read
	read := func(upTo int64) {
		for next < len(sc.records) && sc.records[next].written <= upTo {
			pr := sc.records[next]
			next++
			rec, err := ParseRecord(pr.key, pr.value, pr.written)
			if err != nil {
				if pr.valid {
					t.Fatalf("record %d: %v", next-1, err)
				}
				if err := l.Advance(st, pr.written); err != nil {
					t.Fatal(err)
				}
				continue
			}
			if err := l.Apply(st, rec); err != nil {
				t.Fatalf("apply record %d: %v", next-1, err)
			}
			if pr.valid {
				ref.Add(pr.ref)
			}
		}
	}
	outcomes := map[Outcome]int{}
	for i := 0; i < len(sc.events); i++ {
		pe := sc.events[i]
		// The stage decides an event only once it has read its
		// entitlements partition up to the event's arrival; it may
		// have read further.
		read(pe.ev.Arrival + r.Int64N(3)*r.Int64N(2*24*hourMs))
		if got, _ := l.ReadTo(st); next < len(sc.records) && got < pe.ev.Arrival && sc.records[next].written <= pe.ev.Arrival {
			t.Fatalf("event %d decided before the records up to its arrival were read", i)
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
		if err != nil {
			t.Fatal(err)
		}
		want := ref.Decide(pe.customer, entref.Event(pe.ev))
		gotMoney := entref.Decision{Outcome: got.Outcome.String(), Units: got.Units, Cost: got.Cost, Draws: refDraws(got.Draws),
			Overdraft: got.Overdraft, OverCap: got.OverCap}
		if got.Outcome != Accepted {
			gotMoney = entref.Decision{Outcome: got.Outcome.String()}
		}
		if !reflect.DeepEqual(gotMoney, want) {
			t.Fatalf("event %d %+v of %s:\n ledger    %+v (%s)\n reference %+v\n plan %+v",
				i, pe.ev, pe.customer, gotMoney, got.Detail, want, ref.PlanAt(pe.customer, pe.ev.Arrival))
		}
		outcomes[got.Outcome]++
		if got.Outcome != Accepted {
			rejected++
		}
		decided++
		if r.IntN(40) == 0 {
			// Prune at the horizon of what is still to come.
			h := sc.events[len(sc.events)-1].ev.Arrival // the balances at the end
			for _, e := range sc.events[i+1:] {
				h = min(h, e.ev.Arrival)
			}
			commit()
			before := st.keys()
			if err := l.PruneShared(st, h); err != nil {
				t.Fatal(err)
			}
			for _, c := range []string{"acme", "globex", "initech", "umbrella"} {
				if err := l.PruneCustomer(st, c, h); err != nil {
					t.Fatal(err)
				}
			}
			for more := true; more; {
				if more, err = l.PrunePeriods(st, h, 3); err != nil {
					t.Fatal(err)
				}
			}
			commit()
			pruned += max(0, before-st.keys())
		}
		if r.IntN(7) == 0 {
			commit()
		}
	}
	// Balances as of the end, for every customer.
	end := sc.events[len(sc.events)-1].ev.Arrival
	read(end)
	for _, c := range []string{"acme", "globex", "initech", "umbrella"} {
		got, err := l.Balance(st, c, end, 9)
		if err != nil {
			t.Fatal(err)
		}
		if want := ref.Balance(c, end, 9); !reflect.DeepEqual(got, want) {
			t.Fatalf("balance of %s:\n ledger    %+v\n reference %+v", c, got, want)
		}
	}
	commit()
	t.Logf("seed %d: %v; state %d keys, %d bytes", seed, outcomes, st.keys(), st.bytes())
	return decided, rejected, pruned
}
