package entitlements

import (
	"testing"
	"time"

	"github.com/meterline/meterline/entitlements/entref"
	"github.com/meterline/meterline/schemas"
)

// genStep is one step of a generation scenario: a record of the
// entitlements partition (a customer's, the default plan's, a tombstone
// of the customer), or an event of the customer, at broker time at.
type genStep struct {
	at   int64
	own  *schemas.Entitlements // the customer's record, or
	def  *schemas.Entitlements // the default plan's, or
	tomb bool                  // the customer's record deleted, or
	draw int64                 // an event of draw units (micro-credits) arriving at at
	want Outcome               // the event's outcome
	// wantDraw, for an accepted event: what its grant "g" pays.
	wantDraw int64
}

// runGenSteps runs steps through a Ledger (W one day), caught up (each
// record read when the partition reaches it, events decided between) or
// behind (every record read first, pruning at a watermark that has not
// moved), and through the reference model; the decisions must be what
// the steps want, in both.
func runGenSteps(t *testing.T, steps []genStep) {
	t.Helper()
	const w = 24 * time.Hour
	base := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC).UnixMilli()
	card := unitCard()
	record := func(s genStep) (key []byte, m schemas.Message, ref entref.Record) {
		switch {
		case s.def != nil:
			return []byte(schemas.DefaultPlanKey), s.def, entref.Record{Key: schemas.DefaultPlanKey, Written: s.at, Ent: s.def}
		case s.tomb:
			return schemas.CustomerKey("acme"), nil, entref.Record{Key: "acme", Written: s.at}
		}
		return schemas.CustomerKey("acme"), s.own, entref.Record{Key: "acme", Written: s.at, Ent: s.own}
	}
	for _, ahead := range []bool{false, true} {
		l, err := New(Config{Prefix: []byte("e"), Window: w, Period: monthBounds})
		if err != nil {
			t.Fatal(err)
		}
		st := newMemStore()
		applyCard(t, l, st, card, base-1)
		ref := entref.New(monthBounds).Window(w)
		ref.Add(entref.Record{Key: schemas.RateCardKey, Written: base - 1, Card: card})
		wm := int64(0)
		read := func(s genStep) {
			t.Helper()
			key, m, r := record(s)
			readRecord(t, l, st, key, m, s.at, wm-w.Milliseconds())
			ref.Add(r)
		}
		if ahead {
			for _, s := range steps {
				if s.draw == 0 {
					read(s)
				}
			}
		}
		for i, s := range steps {
			if s.draw == 0 {
				if !ahead {
					read(s)
				}
				continue
			}
			if err := l.Advance(st, s.at+1); err != nil {
				t.Fatal(err)
			}
			ev := Event{Meter: "m", Aggregation: "SUM", Quantity: s.draw, EventTime: s.at, Arrival: s.at}
			d, err := l.Decide(st, "acme", ev)
			if err != nil {
				t.Fatal(err)
			}
			var paid int64
			for _, dr := range d.Draws {
				if dr.Grant == "g" {
					paid += dr.Amount
				}
			}
			if d.Outcome != s.want || d.Outcome == Accepted && paid != s.wantDraw {
				t.Errorf("ahead=%v: step %d: %d at %+d ms: %s (%s), g paid %d; want %s, g paying %d", ahead, i, s.draw, s.at-base,
					d.Outcome, d.Detail, paid, s.want, s.wantDraw)
			}
			if !ahead {
				rd := ref.Decide("acme", entref.Event(ev))
				var rpaid int64
				for _, dr := range rd.Draws {
					if dr.Grant == "g" {
						rpaid += dr.Amount
					}
				}
				if rd.Outcome != s.want.String() || rd.Outcome == entref.Accepted && rpaid != s.wantDraw {
					t.Errorf("reference: step %d: %d at %+d ms: %s, g paid %d; want %s, g paying %d", i, s.draw, s.at-base,
						rd.Outcome, rpaid, s.want, s.wantDraw)
				}
			}
			wm = max(wm, s.at)
			// As the aggregator prunes at a period start, with the
			// partition read far ahead when behind: nothing a
			// decision still to come needs may go.
			h := wm - w.Milliseconds()
			if err := l.PruneShared(st, h); err != nil {
				t.Fatal(err)
			}
			if err := l.PruneCustomer(st, "acme", h); err != nil {
				t.Fatal(err)
			}
			if _, err := l.PrunePeriods(st, h, 10); err != nil {
				t.Fatal(err)
			}
		}
	}
}

func reviewBase() int64 { return time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC).UnixMilli() }

func ownGrant(amount, exp int64) *schemas.Entitlements {
	return &schemas.Entitlements{CustomerID: "acme", Grants: []schemas.Grant{{ID: "g", Amount: amount, ExpiresAt: exp}},
		Overdraft: schemas.Overdraft{Policy: schemas.OverdraftDeny}}
}

func defGrant(amount, exp int64) *schemas.Entitlements {
	return &schemas.Entitlements{Grants: []schemas.Grant{{ID: "g", Amount: amount, ExpiresAt: exp}},
		Overdraft: schemas.Overdraft{Policy: schemas.OverdraftDeny}}
}

// TestReviewDefaultGrantNotTheCustomersOwnReadInItsMillisecond: the
// default plan's record never continues a generation that only a
// customer's own records started (docs/entitlements.md, Credits: a
// customer back on the default plan draws from the default plan's
// generation), also when the default plan's record counts as read in the
// very millisecond the customer's was: written in one produce batch
// (LogAppendTime gives a batch one timestamp), in the same millisecond,
// or with a broker clock that stepped back. A generation named by its
// read time alone gives both the same name, and the customer back on the
// default plan finds the default plan's grant already drawn by what its
// own grant paid.
func TestReviewDefaultGrantNotTheCustomersOwnReadInItsMillisecond(t *testing.T) {
	const day = 24 * hourMs
	base := reviewBase()
	for _, c := range []struct {
		name  string
		defAt int64 // the default plan record's broker time
	}{
		{"same millisecond", base},
		{"broker clock stepped back", base - 5000},
	} {
		t.Run(c.name, func(t *testing.T) {
			runGenSteps(t, []genStep{
				{at: base, own: ownGrant(1000, 0)},
				{at: c.defAt, def: defGrant(1000, 0)},
				{at: base + hourMs, draw: 800, want: Accepted, wantDraw: 800},
				{at: base + 2*hourMs, tomb: true},
				// Back on the default plan: its grant, nothing paid.
				{at: base + day, draw: 1000, want: Accepted, wantDraw: 1000},
			})
		})
	}
	// The same with the records a millisecond apart: the rule as
	// documented, which the test above holds to the millisecond.
	t.Run("a millisecond apart", func(t *testing.T) {
		runGenSteps(t, []genStep{
			{at: base, own: ownGrant(1000, 0)},
			{at: base + 1, def: defGrant(1000, 0)},
			{at: base + hourMs, draw: 800, want: Accepted, wantDraw: 800},
			{at: base + 2*hourMs, tomb: true},
			{at: base + day, draw: 1000, want: Accepted, wantDraw: 1000},
		})
	})
}
