package entitlements

import (
	"testing"
	"time"

	"github.com/meterline/meterline/schemas"
)

// TestGrantGenerations: the rule of docs/entitlements.md (Credits) on a
// customer's and the default plan's records, W one day: a record read
// less than W after the latest expiry its generation had continues it
// (what it paid still counts), one read W after or later starts a new
// one, to the millisecond; a customer's record that copies the default
// plan's grant continues the default plan's generation; the default
// plan's record does not continue one that only the customer's records
// started. Whatever order the records are read and pruned in relative to
// the decisions, as long as each event is decided after the records read
// before its arrival.
func TestGrantGenerations(t *testing.T) {
	const day = 24 * hourMs
	base := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC).UnixMilli()
	grant := func(exp int64) []schemas.Grant { return []schemas.Grant{{ID: "g", Amount: 1000, ExpiresAt: exp}} }
	own := func(gs []schemas.Grant) *schemas.Entitlements {
		return &schemas.Entitlements{CustomerID: "acme", Grants: gs, Overdraft: schemas.Overdraft{Policy: schemas.OverdraftDeny}}
	}
	def := func(gs []schemas.Grant) *schemas.Entitlements {
		return &schemas.Entitlements{Grants: gs, Overdraft: schemas.Overdraft{Policy: schemas.OverdraftDeny}}
	}
	type step struct {
		at    int64
		own   *schemas.Entitlements // a customer's record, or
		def   *schemas.Entitlements // the default plan's, or
		draw  int64                 // an event of draw units arriving at at
		tomb  bool                  // the customer's record deleted
		wantD Outcome
	}
	for _, c := range []struct {
		name  string
		steps []step
	}{
		{"own, read a millisecond before W past the expiry: continued", []step{
			{at: base, own: own(grant(base + day))},
			{at: base + hourMs, draw: 800},
			{at: base + 2*day - 1, own: own(grant(base + 10*day))},
			{at: base + 3*day, draw: 500, wantD: NoCredit},
		}},
		{"own, read W past the expiry: new", []step{
			{at: base, own: own(grant(base + day))},
			{at: base + hourMs, draw: 800},
			{at: base + 2*day, own: own(grant(base + 10*day))},
			{at: base + 3*day, draw: 500},
		}},
		{"own, a record without the grant in between: continued", []step{
			{at: base, own: own(grant(base + day))},
			{at: base + hourMs, draw: 800},
			{at: base + day, own: own(nil)},
			{at: base + day + day/2, own: own(grant(base + 10*day))},
			{at: base + 3*day, draw: 500, wantD: NoCredit},
		}},
		{"a customer's copy of the default plan's grant continues it", []step{
			{at: base, def: def(grant(base + 10*day))},
			{at: base + hourMs, draw: 800},
			{at: base + day, own: own(grant(base + 10*day))},
			{at: base + 2*day, draw: 500, wantD: NoCredit},
		}},
		{"the default plan's grant, W past its expiry: new", []step{
			{at: base, def: def(grant(base + day))},
			{at: base + hourMs, draw: 800},
			{at: base + 2*day, def: def(grant(base + 10*day))},
			{at: base + 3*day, draw: 500},
		}},
		{"the default plan does not continue the customer's own", []step{
			{at: base, own: own(grant(base + 10*day))},
			{at: base + hourMs, draw: 800},
			{at: base + day, def: def(grant(base + 10*day))},
			{at: base + 2*day, tomb: true},
			{at: base + 3*day, draw: 500},
		}},
	} {
		for _, ahead := range []bool{false, true} {
			t.Run(c.name+map[bool]string{false: "/caught up", true: "/behind"}[ahead], func(t *testing.T) {
				l, err := New(Config{Prefix: []byte("e"), Window: 24 * time.Hour, Period: monthBounds})
				if err != nil {
					t.Fatal(err)
				}
				st := newMemStore()
				wm := int64(0) // the watermark: the latest arrival decided
				read := func(s step) {
					t.Helper()
					key, m := schemas.CustomerKey("acme"), schemas.Message(s.own)
					switch {
					case s.def != nil:
						key, m = []byte(schemas.DefaultPlanKey), s.def
					case s.tomb:
						m = nil
					}
					readRecord(t, l, st, key, m, s.at, wm-day)
				}
				applyCard(t, l, st, unitCard(), base-1)
				if ahead {
					for _, s := range c.steps {
						if s.draw == 0 {
							read(s)
						}
					}
				}
				for _, s := range c.steps {
					if s.draw == 0 {
						if !ahead {
							read(s)
						}
						continue
					}
					if err := l.Advance(st, s.at+1); err != nil {
						t.Fatal(err)
					}
					d, err := l.Decide(st, "acme", Event{Meter: "m", Aggregation: "SUM", Quantity: s.draw, EventTime: s.at, Arrival: s.at})
					if err != nil {
						t.Fatal(err)
					}
					if d.Outcome != s.wantD {
						t.Fatalf("%d units at %d: %s (%s), want %s", s.draw, s.at-base, d.Outcome, d.Detail, s.wantD)
					}
					wm = s.at
				}
			})
		}
	}
}

// TestStateWrittenBeforeGenerations: state written before grants had
// generations (stateFormat: a customer's timeline, account and the
// default plan's grant expiries keyed by id alone, a charge) is still
// read: its grants are of legacyGen, what they paid still counts, a record
// read while the grant is alive continues it, and Refund takes back a
// charge of that format.
func TestStateWrittenBeforeGenerations(t *testing.T) {
	const day = 24 * hourMs
	base := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC).UnixMilli()
	l, err := New(Config{Prefix: []byte("e"), Period: monthBounds})
	if err != nil {
		t.Fatal(err)
	}
	st := newMemStore()
	applyCard(t, l, st, unitCard(), base-1)
	// The old encodings, as the build before generations wrote them.
	p, err := NewPlan(&schemas.Entitlements{Grants: []schemas.Grant{{ID: "g", Amount: 1000, ExpiresAt: base + 10*day}},
		Overdraft: schemas.Overdraft{Policy: schemas.OverdraftDeny}})
	if err != nil {
		t.Fatal(err)
	}
	e := newEnc(64)
	e.count(1)
	e.int(base)
	e.bool(true)
	e.str(p.Name)
	e.bool(p.Unmetered)
	e.count(0)
	e.count(1)
	e.grant(p.Grants[0])
	e.bool(true)
	e.int(0)
	st.Put(l.customerKey(subTimeline, "acme"), e.bytes())
	a := newEnc(32)
	a.count(1)
	a.str("g")
	a.int(800)           // paid
	a.int(base + 10*day) // the latest expiry
	a.count(0)
	st.Put(l.customerKey(subAccount, "acme"), a.bytes())
	g := newEnc(32)
	g.count(1)
	g.str("h")
	g.int(base + 10*day)
	st.Put(l.keyDefaultGrants, g.bytes())
	if err := l.Advance(st, base+day); err != nil {
		t.Fatal(err)
	}
	es, err := l.defaultGrants(st)
	if err != nil || len(es) != 1 || es[0] != (defaultGrant{"h", legacyGen, base + 10*day}) {
		t.Fatalf("the default plan's grants %+v, %v", es, err)
	}
	ev := func(q int64) Event {
		return Event{Meter: "m", Aggregation: "SUM", Quantity: q, EventTime: base, Arrival: base}
	}
	if d, err := l.Decide(st, "acme", ev(300)); err != nil || d.Outcome != NoCredit {
		t.Fatalf("300 from a grant of 1,000 that paid 800: %+v, %v", d, err)
	}
	d, err := l.Decide(st, "acme", ev(150))
	if err != nil || d.Outcome != Accepted || len(d.Draws) != 1 || d.Draws[0].gen != legacyGen {
		t.Fatalf("150 from it: %+v, %v", d, err)
	}
	// A charge of the old format: 150 units, no overdraft, 150 from g.
	c := newEnc(16)
	c.int(150)
	c.int(0)
	c.count(1)
	c.str("g")
	c.int(150)
	if _, err := l.Refund(st, "acme", ev(150), c.bytes()); err != nil {
		t.Fatal(err)
	}
	// Offered again while alive: the same grant, 800 paid.
	v, _ := schemas.Encode(&schemas.Entitlements{CustomerID: "acme", Grants: []schemas.Grant{{ID: "g", Amount: 1000, ExpiresAt: base + 20*day}},
		Overdraft: schemas.Overdraft{Policy: schemas.OverdraftDeny}})
	rec, _ := ParseRecord(schemas.CustomerKey("acme"), v, base+2*day)
	if err := l.Apply(st, rec); err != nil {
		t.Fatal(err)
	}
	later := Event{Meter: "m", Aggregation: "SUM", Quantity: 201, EventTime: base + 3*day, Arrival: base + 3*day}
	if d, err := l.Decide(st, "acme", later); err != nil || d.Outcome != NoCredit {
		t.Fatalf("201 from the grant offered again, 800 paid: %+v, %v", d, err)
	}
	later.Quantity = 200
	if d, err := l.Decide(st, "acme", later); err != nil || d.Outcome != Accepted || d.Draws[0].gen != legacyGen {
		t.Fatalf("200 from it: %+v, %v", d, err)
	}
}
