package entitlements

import (
	"fmt"
	"sort"
)

// Account is a customer's mutable ledger state, kept under one state key
// (Ledger: 'A' C), so that a transaction that changes a customer writes
// one record for it whatever it changed: what each grant generation paid
// (generation.go; and the latest expiry the customer's own records gave
// it: a generation they offered has an entry before it pays), and for
// each period an event can still belong to, the
// accepted units of each meter and what the customer overdrew. A period
// appears once it has usage: accepted units of a SUM or COUNT meter.
//
// An Account is only ever changed by the Ledger; a Store that keeps
// accounts decoded (AccountCache) holds them for the Ledger.
type Account struct {
	uses    []grantUse  // by id, then generation
	periods []periodUse // by start
	// changedAt is the broker time of the latest change its owner noted
	// for the customer's balance, or of its latest balance
	// (Ledger.BalanceAsOf) if later (NoteChange; 0: none), kept with the
	// account so that a change needs no state key of its own when the
	// account is written anyway. An account that holds nothing else is
	// kept for it (noteOnly) while the note may matter: the Ledger drops
	// it once the note is at or below the floor it is given.
	changedAt int64
	// changed: the Ledger changed the account since it was decoded or
	// last written (Ledger.WriteAccount), and told the AccountCache
	// (Ledger.putAccount). Not encoded.
	changed bool
	// indexedAt: the account was decoded or last written holding only
	// the note changedAt was then, so the note index of that time's
	// period holds it (Ledger.WriteAccount); 0 otherwise. Not encoded.
	indexedAt int64
}

// periodUse is an account's usage in one period.
type periodUse struct {
	start     int64
	overdrawn int64
	meters    []meterUse // by meter
}

type meterUse struct {
	meter string
	units int64
}

// Bounds on what one account decodes to.
const (
	maxAccountPeriods = 1 << 16
	maxPeriodMeters   = 1 << 16
)

// empty reports whether the account holds no usage and no grant: at most
// a note.
func (a *Account) empty() bool { return len(a.uses) == 0 && len(a.periods) == 0 }

// noteOnly reports whether the account holds a note and nothing else.
func (a *Account) noteOnly() bool { return a.empty() && a.changedAt != 0 }

// Empty reports whether the account holds no usage and no grant (it may
// hold a note).
func (a *Account) Empty() bool { return a.empty() }

// NoteChange notes that the customer's balance changed at broker time t;
// ChangedAt returns the latest time noted. The note is written with the
// account (Ledger.WriteAccount), and is not a change of the account: its
// owner writes the account only if the Ledger changed it too.
func (a *Account) NoteChange(t int64) { a.changedAt = max(a.changedAt, t) }

// ChangedAt returns the latest time NoteChange noted, 0 if none.
func (a *Account) ChangedAt() int64 { return a.changedAt }

// period returns the usage of the period starting at start, nil if none.
func (a *Account) period(start int64) *periodUse {
	// Events mostly belong to the latest period.
	for i := len(a.periods) - 1; i >= 0; i-- {
		switch p := &a.periods[i]; {
		case p.start == start:
			return p
		case p.start < start:
			return nil
		}
	}
	return nil
}

// addPeriod returns the usage of the period starting at start, adding it
// (empty) if needed; added reports that it did.
func (a *Account) addPeriod(start int64) (p *periodUse, added bool) {
	if p := a.period(start); p != nil {
		return p, false
	}
	i := sort.Search(len(a.periods), func(i int) bool { return a.periods[i].start >= start })
	if i < len(a.periods) && a.periods[i].start == start {
		return &a.periods[i], false
	}
	a.periods = append(a.periods, periodUse{})
	copy(a.periods[i+1:], a.periods[i:])
	a.periods[i] = periodUse{start: start}
	return &a.periods[i], true
}

// dropPeriodsBefore drops the periods starting before cut, and returns
// their starts.
func (a *Account) dropPeriodsBefore(cut int64) (dropped []int64) {
	i := 0
	for i < len(a.periods) && a.periods[i].start < cut {
		dropped = append(dropped, a.periods[i].start)
		i++
	}
	if i > 0 {
		a.periods = append(a.periods[:0], a.periods[i:]...)
	}
	return dropped
}

// units returns the accepted units of meter in the period.
func (p *periodUse) units(meter string) int64 {
	if p == nil {
		return 0
	}
	for _, m := range p.meters {
		if m.meter == meter {
			return m.units
		}
	}
	return 0
}

// add adds n units of meter.
func (p *periodUse) add(meter string, n int64) {
	for i := range p.meters {
		if p.meters[i].meter == meter {
			p.meters[i].units += n
			return
		}
	}
	i := sort.Search(len(p.meters), func(i int) bool { return p.meters[i].meter >= meter })
	p.meters = append(p.meters, meterUse{})
	copy(p.meters[i+1:], p.meters[i:])
	p.meters[i] = meterUse{meter: meter, units: n}
}

// overdrawnIn returns what the customer overdrew in the period.
func (p *periodUse) overdrawnIn() int64 {
	if p == nil {
		return 0
	}
	return p.overdrawn
}

// appendAccount appends the account's encoding (stateFormatGen) to b.
func appendAccount(b []byte, a *Account) []byte {
	e := &enc{b: b}
	e.byte(stateFormatGen)
	e.count(len(a.uses))
	for _, u := range a.uses {
		e.str(u.id)
		e.int(u.gen)
		e.int(u.consumed)
		e.int(u.own)
	}
	e.count(len(a.periods))
	for _, p := range a.periods {
		e.int(p.start)
		e.int(p.overdrawn)
		e.count(len(p.meters))
		for _, m := range p.meters {
			e.str(m.meter)
			e.int(m.units)
		}
	}
	if a.changedAt != 0 {
		// Optional, last: an account without it encodes as before.
		e.int(a.changedAt)
	}
	return e.b
}

// MarshalBinary encodes the account.
func (a *Account) MarshalBinary() ([]byte, error) {
	return appendAccount(make([]byte, 0, 16+24*len(a.uses)+32*len(a.periods)), a), nil
}

// UnmarshalBinary decodes an account; anything but an account's encoding
// (strictly ordered entries, no negative amount) is ErrCorrupt. An
// account written before grants had generations (stateFormat: an entry
// per id, with the latest expiry any version gave the grant) decodes with
// every grant of legacyGen, as offered by the customer's own records
// until that expiry: the versions of that state offer legacyGen, so what
// a grant paid then still counts, and a record read less than W after
// that expiry continues it (Ledger.Apply).
func (a *Account) UnmarshalBinary(b []byte) error {
	*a = Account{}
	d := newDecGens("account", b)
	n := d.count(maxGrantUses)
	if n > 0 {
		a.uses = make([]grantUse, 0, n)
	}
	for i := 0; i < n && d.err == nil; i++ {
		g := grantUse{id: d.str(), gen: legacyGen}
		if d.gens {
			g.gen = d.int()
		}
		g.consumed, g.own = d.int(), d.int()
		if !d.gens && g.own < 0 {
			g.own = 0 // paid, and no version seen to offer it
		}
		if g.consumed < 0 || g.own < 0 || i > 0 && !a.uses[i-1].before(g.id, g.gen) {
			d.fail("account: bad grant entry")
		}
		a.uses = append(a.uses, g)
	}
	n = d.count(maxAccountPeriods)
	if n > 0 {
		a.periods = make([]periodUse, 0, n)
	}
	for i := 0; i < n && d.err == nil; i++ {
		p := periodUse{start: d.int(), overdrawn: d.int()}
		if p.overdrawn < 0 || i > 0 && p.start <= a.periods[i-1].start {
			d.fail("account: bad period entry")
		}
		m := d.count(maxPeriodMeters)
		if m > 0 {
			p.meters = make([]meterUse, 0, m)
		}
		for j := 0; j < m && d.err == nil; j++ {
			u := meterUse{meter: d.str(), units: d.int()}
			if u.units < 0 || j > 0 && u.meter <= p.meters[j-1].meter {
				d.fail("account: bad meter entry")
			}
			p.meters = append(p.meters, u)
		}
		a.periods = append(a.periods, p)
	}
	if d.err == nil && len(d.b) > 0 {
		if a.changedAt = d.int(); a.changedAt <= 0 {
			d.fail("account: bad change time")
		}
	}
	if err := d.end(); err != nil {
		*a = Account{}
		return err
	}
	if a.noteOnly() {
		a.indexedAt = a.changedAt
	}
	return nil
}

// defaultGrant is the default plan's current generation of a grant id:
// the read time of the record that started it (gen) and the latest
// expiry (epoch ms, math.MaxInt64: never) the default plan's records gave
// it since (Ledger.Apply).
type defaultGrant struct {
	id       string
	gen, exp int64
}

// appendDefaultGrants appends the encoding (stateFormatGen) of the
// default plan's grant generations (by id) to b.
func appendDefaultGrants(b []byte, es []defaultGrant) []byte {
	e := &enc{b: b}
	e.byte(stateFormatGen)
	e.count(len(es))
	for _, g := range es {
		e.str(g.id)
		e.int(g.gen)
		e.int(g.exp)
	}
	return e.b
}

// decodeDefaultGrants decodes what appendDefaultGrants encoded, or the
// default plan's grant expiries written before grants had generations
// (ids and expiries: legacyGen); anything else (ids not strictly
// ordered) is ErrCorrupt.
func decodeDefaultGrants(b []byte) ([]defaultGrant, error) {
	d := newDecGens("default grants", b)
	n := d.count(maxGrantUses)
	es := make([]defaultGrant, 0, n)
	for i := 0; i < n && d.err == nil; i++ {
		g := defaultGrant{id: d.str(), gen: legacyGen}
		if d.gens {
			g.gen = d.int()
		}
		g.exp = d.int()
		if i > 0 && g.id <= es[i-1].id {
			d.fail("default grants: bad entry")
		}
		es = append(es, g)
	}
	if err := d.end(); err != nil {
		return nil, err
	}
	return es, nil
}

// String describes the account, for tests and logs.
func (a *Account) String() string {
	return fmt.Sprintf("account{uses %v, periods %v, changed at %d}", a.uses, a.periods, a.changedAt)
}
