package entitlements

import (
	"testing"
	"time"

	"github.com/meterline/meterline/schemas"
)

// TestReviewPaidKeptWhileReadAhead: what a generation paid is kept while an
// event still to come can draw from it, also when the entitlements
// partition has been read far past the generation's death (a stage behind
// on usage.deduped: ReadTo runs ahead, and the retention of a generation
// depends on it): an event that arrived before the id was offered again,
// decided after the new generation's record was read and pruned after,
// still draws from the old generation with what it paid counted; an
// event decided by the new version draws from the new one.
func TestReviewPaidKeptWhileReadAhead(t *testing.T) {
	const day = 24 * hourMs
	base := reviewBase()
	t.Run("own", func(t *testing.T) {
		runGenSteps(t, []genStep{
			{at: base, own: ownGrant(1000, base+day)},
			{at: base + hourMs, draw: 800, want: Accepted, wantDraw: 800},
			// Dead from base+2d: offered again at base+3d, a new grant.
			{at: base + 3*day, own: ownGrant(1000, base+10*day)},
			// Arrived before it, an event time within the old window:
			// the old generation, 200 left.
			{at: base + day - 2*hourMs, draw: 300, want: NoCredit},
			{at: base + day - hourMs, draw: 200, want: Accepted, wantDraw: 200},
			{at: base + day - hourMs + 1, draw: 1, want: NoCredit},
			// Decided by the new version: the new generation.
			{at: base + 3*day + hourMs, draw: 1000, want: Accepted, wantDraw: 1000},
		})
	})
	t.Run("default plan", func(t *testing.T) {
		runGenSteps(t, []genStep{
			{at: base, def: defGrant(1000, base+day)},
			{at: base + hourMs, draw: 800, want: Accepted, wantDraw: 800},
			{at: base + 3*day, def: defGrant(1000, base+10*day)},
			{at: base + day - 2*hourMs, draw: 300, want: NoCredit},
			{at: base + day - hourMs, draw: 200, want: Accepted, wantDraw: 200},
			{at: base + 3*day + hourMs, draw: 1000, want: Accepted, wantDraw: 1000},
		})
	})
	t.Run("a customer's copy of the default plan's grant", func(t *testing.T) {
		runGenSteps(t, []genStep{
			{at: base, def: defGrant(1000, base+day)},
			{at: base + hourMs, draw: 600, want: Accepted, wantDraw: 600},
			// The customer's copy, extended: the default plan's
			// generation, kept alive by the customer's own expiry.
			{at: base + 2*hourMs, own: ownGrant(1000, base+5*day)},
			{at: base + 3*hourMs, draw: 300, want: Accepted, wantDraw: 300},
			// The default plan's generation dies (base+2d), and the
			// default plan offers the id again: a new grant for every
			// customer on it, but acme's own records keep the old one.
			{at: base + 3*day, def: defGrant(1000, base+10*day)},
			{at: base + 3*day + 1, own: ownGrant(1000, base+10*day)},
			{at: base + 3*day + hourMs, draw: 101, want: NoCredit},
			{at: base + 3*day + 2*hourMs, draw: 100, want: Accepted, wantDraw: 100},
		})
	})
}

// TestReviewOwnGenerationPreferredToTheDefaultPlans pins a rule of
// docs/entitlements.md (Credits) that a billing engineer may not expect:
// a customer's record continues the generation the customer's own
// records last offered the id in while it is alive, before the default
// plan's. A customer whose own grant "g" is spent, moved to the default
// plan (which offers "g" too: a grant of its own, nothing paid), and then
// given a record that copies the default plan, finds "g" spent again:
// the copy continues its own generation, not the default plan's it was
// drawing from (700 left there). Documented; giving the default plan's
// grant an id of its own avoids it.
func TestReviewOwnGenerationPreferredToTheDefaultPlans(t *testing.T) {
	base := reviewBase()
	runGenSteps(t, []genStep{
		{at: base, own: ownGrant(1000, 0)},
		{at: base + hourMs, draw: 1000, want: Accepted, wantDraw: 1000},
		{at: base + 2*hourMs, tomb: true},
		{at: base + 2*hourMs + 1, def: defGrant(1000, 0)},
		{at: base + 3*hourMs, draw: 300, want: Accepted, wantDraw: 300},
		{at: base + 4*hourMs, own: ownGrant(1000, 0)},
		{at: base + 5*hourMs, draw: 1, want: NoCredit},
	})
}

// TestReviewAbortedApplyLeavesNoGeneration: a transaction that applies a
// customer's record (its account changed in the AccountCache) and aborts
// leaves nothing behind: applied again from the committed state, the
// record gets the same generations, and what the grant paid is as if the
// aborted transaction never ran.
func TestReviewAbortedApplyLeavesNoGeneration(t *testing.T) {
	const day = 24 * hourMs
	base := reviewBase()
	l, err := New(Config{Prefix: []byte("e"), Window: 24 * time.Hour, Period: monthBounds})
	if err != nil {
		t.Fatal(err)
	}
	cs := newCachedStore(l)
	apply := func(key []byte, m schemas.Message, at int64) {
		t.Helper()
		v, _ := schemas.Encode(m)
		rec, err := ParseRecord(key, v, at)
		if err == nil {
			err = l.Apply(cs, rec)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	card := &schemas.RateCard{Versions: []schemas.RateVersion{{Rates: []schemas.Rate{{Meter: "m", MicroCredits: 1, PerUnits: 1}}}}}
	apply([]byte(schemas.RateCardKey), card, base-1)
	apply(schemas.CustomerKey("acme"), ownGrant(1000, base+day), base)
	ev := Event{Meter: "m", Aggregation: "SUM", Quantity: 800, EventTime: base + hourMs, Arrival: base + hourMs}
	if err := l.Advance(cs, ev.Arrival+1); err != nil {
		t.Fatal(err)
	}
	if d, err := l.Decide(cs, "acme", ev); err != nil || d.Outcome != Accepted {
		t.Fatalf("%+v, %v", d, err)
	}
	cs.commit()
	snap := cs.snapshot()
	// Aborted: the grant offered again, dead (a new generation), and a
	// draw from it.
	apply(schemas.CustomerKey("acme"), ownGrant(1000, base+10*day), base+3*day)
	late := Event{Meter: "m", Aggregation: "SUM", Quantity: 1000, EventTime: base + 3*day, Arrival: base + 3*day}
	if err := l.Advance(cs, late.Arrival+1); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Decide(cs, "acme", late); err != nil {
		t.Fatal(err)
	}
	cs.abort()
	cs.restore(snap)
	// Again, within W of the expiry: the same grant, 200 left.
	apply(schemas.CustomerKey("acme"), ownGrant(1000, base+10*day), base+day+hourMs)
	again := Event{Meter: "m", Aggregation: "SUM", Quantity: 201, EventTime: base + 2*day, Arrival: base + 2*day}
	if err := l.Advance(cs, again.Arrival+1); err != nil {
		t.Fatal(err)
	}
	if d, err := l.Decide(cs, "acme", again); err != nil || d.Outcome != NoCredit {
		t.Fatalf("201 from a grant that paid 800 of 1000: %+v, %v", d, err)
	}
	a, err := l.account(cs, "acme")
	if err != nil {
		t.Fatal(err)
	}
	if len(a.uses) != 1 || a.uses[0].consumed != 800 || a.uses[0].own != base+10*day {
		t.Fatalf("account after the abort: %v", a)
	}
}

// legacyTimelineBytes encodes a timeline of one version from from with the
// grants gs (deny overdraft), as the build before generations wrote it
// (stateFormat, no generations).
func legacyTimelineBytes(from int64, gs []schemas.Grant) []byte {
	e := newEnc(64)
	e.count(1)
	e.int(from)
	e.bool(true)
	e.str("")     // plan name
	e.bool(false) // unmetered
	e.count(0)    // caps
	e.count(len(gs))
	for _, g := range gs {
		e.grant(g)
	}
	e.bool(true) // overdraft deny
	e.int(0)
	return e.bytes()
}

// TestReviewDefaultPlanStateWrittenBeforeGenerations: the default plan's
// state written before grants had generations (its timeline, its grant
// expiries by id, and a customer's account that its grant paid from, all
// of the earlier format) is read as one generation: the default plan's
// record offering the id again while it is alive continues it (what it
// paid a customer on the default plan still counts, and a customer's copy
// of it too), one read W after its latest expiry starts a new grant.
func TestReviewDefaultPlanStateWrittenBeforeGenerations(t *testing.T) {
	const day = 24 * hourMs
	base := reviewBase()
	for _, c := range []struct {
		name    string
		readAt  int64 // the default plan's (or the customer's) new record
		own     bool  // the customer's copy, else the default plan's record
		want201 Outcome
	}{
		{"the default plan's record, alive", base + 2*day, false, NoCredit},
		{"a customer's copy, alive", base + 2*day, true, NoCredit},
		{"the default plan's record, W past the expiry", base + 12*day, false, Accepted},
		{"a customer's copy, W past the expiry", base + 12*day, true, Accepted},
	} {
		t.Run(c.name, func(t *testing.T) {
			l, err := New(Config{Prefix: []byte("e"), Window: 2 * 24 * time.Hour, Period: monthBounds})
			if err != nil {
				t.Fatal(err)
			}
			st := newMemStore()
			applyCard(t, l, st, unitCard(), base-1)
			exp := base + 10*day
			st.Put(l.keyDefault, legacyTimelineBytes(base, []schemas.Grant{{ID: "g", Amount: 1000, ExpiresAt: exp}}))
			g := newEnc(16)
			g.count(1)
			g.str("g")
			g.int(exp)
			st.Put(l.keyDefaultGrants, g.bytes())
			a := newEnc(32)
			a.count(1)
			a.str("g")
			a.int(800) // paid under the default plan
			a.int(exp) // the latest expiry (the default plan's, raised into it)
			a.count(0)
			st.Put(l.customerKey(subAccount, "acme"), a.bytes())
			if err := l.Advance(st, base+day); err != nil {
				t.Fatal(err)
			}
			grant := []schemas.Grant{{ID: "g", Amount: 1000, ExpiresAt: base + 30*day}}
			key, m := []byte(schemas.DefaultPlanKey), schemas.Message(&schemas.Entitlements{Grants: grant, Overdraft: schemas.Overdraft{Policy: schemas.OverdraftDeny}})
			if c.own {
				key, m = schemas.CustomerKey("acme"), &schemas.Entitlements{CustomerID: "acme", Grants: grant, Overdraft: schemas.Overdraft{Policy: schemas.OverdraftDeny}}
			}
			v, _ := schemas.Encode(m)
			rec, _ := ParseRecord(key, v, c.readAt)
			if err := l.Apply(st, rec); err != nil {
				t.Fatal(err)
			}
			if err := l.PruneCustomer(st, "acme", c.readAt-2*day); err != nil {
				t.Fatal(err)
			}
			if err := l.PruneShared(st, c.readAt-2*day); err != nil {
				t.Fatal(err)
			}
			ev := Event{Meter: "m", Aggregation: "SUM", Quantity: 201, EventTime: c.readAt + hourMs, Arrival: c.readAt + hourMs}
			if err := l.Advance(st, ev.Arrival+1); err != nil {
				t.Fatal(err)
			}
			if d, err := l.Decide(st, "acme", ev); err != nil || d.Outcome != c.want201 {
				t.Fatalf("201 from the grant: %s (%s), %v; want %s", d.Outcome, d.Detail, err, c.want201)
			}
		})
	}
}
