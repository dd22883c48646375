package entitlements

import (
	"encoding/binary"
	"fmt"
	"math"
	"sort"
)

// Grant generations (docs/entitlements.md, Credits). What a grant has
// paid a customer is kept by its id and its generation, and whether a
// record that offers an id continues a grant or starts a new one is a
// function of the records of the entitlements partition alone, in the
// order they are read and at the times they count as read (their broker
// time, or the latest one read before them if that is later): every
// stage that reads the partition, caught up or behind on usage.deduped,
// gives every version the same generations, and an event draws from the
// generations of the version in effect at its arrival.
//
// A generation is named by the read time at of the record that started
// it: at for the default plan's record, ^at (−1 − at) for a customer's
// (ownGen). Read times are never negative (ReadTo starts at 0), so a
// generation the default plan started and one a customer's own records
// started never share a name, even when both records count as read in one
// millisecond (one produce batch, a broker clock that stepped back).
// A generation is alive at time t while the latest expiry its offers gave
// it is after t − W (W: the dedup window): an event that arrives at t or
// later has an event time after t − W, so a dead generation can pay for
// no event a later version decides. For an id offered by a record read
// at t:
//
//   - the default plan's record continues the default plan's current
//     generation of the id if it is alive at t, else starts a new one;
//   - a customer's record continues the generation its own records last
//     offered the id in if that is alive at t (by the expiries the
//     customer's own records gave it), else the default plan's current
//     generation if that is alive at t (so that a customer who copies the
//     default plan's grant keeps what it paid), else starts a new one.
//
// Two generations of an id that one side (the default plan, or one
// customer's own records) started can have one name only when the
// earlier was dead when it started (every expiry it was offered with at
// least W before its read time): it never pays, so they share nothing but
// zeros. (A customer's generation started at read time math.MaxInt64
// would be named legacyGen: no broker clock gets there.)

// grantUse is a customer's grant generation: what it has paid (consumed)
// and, when the customer's own records offered it, the latest expiry they
// gave it (own, epoch ms, math.MaxInt64: never; 0: none), which keeps the
// generation alive for the customer's next record. Account.uses is
// ordered by id, then generation.
type grantUse struct {
	id       string
	gen      int64
	consumed int64
	own      int64
}

// before reports whether u orders before the entry (id, gen).
func (u *grantUse) before(id string, gen int64) bool {
	return u.id < id || u.id == id && u.gen < gen
}

// findUse returns the index of the entry (id, gen) in us, or where it
// would be inserted, and whether it is there.
func findUse(us []grantUse, id string, gen int64) (int, bool) {
	i := sort.Search(len(us), func(i int) bool { return !us[i].before(id, gen) })
	return i, i < len(us) && us[i].id == id && us[i].gen == gen
}

// consumedOf returns what the generation gen of grant id has paid.
func consumedOf(us []grantUse, id string, gen int64) int64 {
	if i, ok := findUse(us, id, gen); ok {
		return us[i].consumed
	}
	return 0
}

// alive reports whether a generation whose latest expiry is exp (0: none)
// is alive at read time at: exp is after at − W.
func (l *Ledger) alive(exp, at int64) bool {
	w := l.cfg.Window.Milliseconds()
	return exp != 0 && (at < math.MinInt64+w || exp > at-w)
}

// findDefault returns the index of id in es (by id) and whether it is
// there.
func findDefault(es []defaultGrant, id string) (int, bool) {
	i := sort.Search(len(es), func(i int) bool { return es[i].id >= id })
	return i, i < len(es) && es[i].id == id
}

// defaultGens returns the generations of the grants of a default plan's
// record read at at, given the default plan's current generations es.
func (l *Ledger) defaultGens(es []defaultGrant, p *Plan, at int64) []int64 {
	gens := make([]int64, len(p.Grants))
	for i, g := range p.Grants {
		gens[i] = at
		if j, ok := findDefault(es, g.ID); ok && l.alive(es[j].exp, at) {
			gens[i] = es[j].gen
		}
	}
	return gens
}

// offerDefault records that the default plan's record read at at offers
// p's grants (with p.gens, defaultGens), and drops the generations dead at
// at: no later record continues them. It returns es changed.
func (l *Ledger) offerDefault(es []defaultGrant, p *Plan, at int64) []defaultGrant {
	for i, g := range p.Grants {
		j, ok := findDefault(es, g.ID)
		switch {
		case ok && es[j].gen == p.gen(i):
			es[j].exp = max(es[j].exp, expiry(g))
		case ok:
			es[j] = defaultGrant{id: g.ID, gen: p.gen(i), exp: expiry(g)}
		default:
			es = append(es, defaultGrant{})
			copy(es[j+1:], es[j:])
			es[j] = defaultGrant{id: g.ID, gen: p.gen(i), exp: expiry(g)}
		}
	}
	return l.liveDefaults(es, at)
}

// liveDefaults drops from es the generations dead at at.
func (l *Ledger) liveDefaults(es []defaultGrant, at int64) []defaultGrant {
	kept := es[:0]
	for _, e := range es {
		if l.alive(e.exp, at) {
			kept = append(kept, e)
		}
	}
	return kept
}

// ownGens returns the generations of the grants of a customer's record
// read at at, given the customer's grant generations us and the default
// plan's current ones es.
func (l *Ledger) ownGens(us []grantUse, es []defaultGrant, p *Plan, at int64) []int64 {
	gens := make([]int64, len(p.Grants))
	for i, g := range p.Grants {
		gens[i] = ownGen(at)
		if k, ok := l.aliveOwn(us, g.ID, at); ok {
			gens[i] = us[k].gen
		} else if j, ok := findDefault(es, g.ID); ok && l.alive(es[j].exp, at) {
			gens[i] = es[j].gen
		}
	}
	return gens
}

// ownGen is the name of a generation that a customer's own record read
// at at starts: never the name of one the default plan's records start
// (at), whose record may count as read in the same millisecond.
func ownGen(at int64) int64 { return ^at }

// aliveOwn returns the index of the generation of id that the customer's
// own records keep alive at at, if any. There is at most one: a record
// starts a generation or joins the default plan's only when none is.
func (l *Ledger) aliveOwn(us []grantUse, id string, at int64) (int, bool) {
	for k, _ := findUse(us, id, math.MinInt64); k < len(us) && us[k].id == id; k++ {
		if l.alive(us[k].own, at) {
			return k, true
		}
	}
	return 0, false
}

// offerOwn records that a customer's record offers p's grants (with
// p.gens, ownGens): the latest expiry its own records gave each
// generation. An entry is added for a generation that has not paid yet,
// so that its record's versions may be pruned before it first pays. It
// returns us changed, and whether it changed.
func offerOwn(us []grantUse, p *Plan) ([]grantUse, bool) {
	changed := false
	for i, g := range p.Grants {
		k, ok := findUse(us, g.ID, p.gen(i))
		if !ok {
			us = append(us, grantUse{})
			copy(us[k+1:], us[k:])
			us[k], changed = grantUse{id: g.ID, gen: p.gen(i)}, true
		}
		if x := expiry(g); x > us[k].own {
			us[k].own, changed = x, true
		}
	}
	return us, changed
}

// MaxGrantBytes bounds the grant generations that records keep alive: a
// customer's own (those its records offered with an expiry after t − W,
// or none), or the default plan's. They are kept in one state value each
// (the customer's account, the default plan's grants), written whole to
// the changelog, which takes no record past the broker's size (1 MB by
// default), and a grant that never expires is kept for good. A record
// whose grants would take them past it, counted by grantEntryBytes, is
// refused (ErrTooManyGrants): a producer offering fresh ids again and
// again (a scheduled record rewritten, which takes no version) would
// otherwise grow the value without bound. A record of MaxGrants grants
// of MaxNameBytes ids (about 270 KB) fits, and another such with other
// ids does not while the first is alive. The count depends on the
// records alone (their grants, expiries and read times), never on events
// or pruning.
const MaxGrantBytes = 320 << 10

// ErrTooManyGrants is returned (wrapped) by Ledger.Apply for a record
// refused by MaxGrantBytes; what was in effect stays.
var ErrTooManyGrants = fmt.Errorf("%w: too many grants kept alive", ErrInvalid)

// grantEntryBytes is the most a grant generation of id takes in an
// encoded account or default plan's grants: the id and its length, and
// three varints.
func grantEntryBytes(id string) int { return len(id) + 3 + 3*binary.MaxVarintLen64 }

// offeredBytes returns the grant bytes of p's grants, and reports for an
// (id, generation) whether p offers it.
func offeredBytes(p *Plan) (n int, offers func(id string, gen int64) bool) {
	type idGen struct {
		id  string
		gen int64
	}
	set := make(map[idGen]bool, len(p.Grants))
	for i, g := range p.Grants {
		n += grantEntryBytes(g.ID)
		set[idGen{g.ID, p.gen(i)}] = true
	}
	return n, func(id string, gen int64) bool { return set[idGen{id, gen}] }
}

// checkOwnGrants refuses (ErrTooManyGrants) a customer's record read at
// at, whose plan p has its generations (ownGens), when the generations
// its own records keep alive at at would pass MaxGrantBytes once it
// offers p's grants (offerOwn): us are the customer's generations.
func (l *Ledger) checkOwnGrants(us []grantUse, p *Plan, at int64) error {
	n, offers := offeredBytes(p)
	for _, u := range us {
		if l.alive(u.own, at) && !offers(u.id, u.gen) {
			n += grantEntryBytes(u.id)
		}
	}
	if n > MaxGrantBytes {
		return fmt.Errorf("%w: %d bytes of grants kept alive (the most is %d)", ErrTooManyGrants, n, MaxGrantBytes)
	}
	return nil
}

// checkDefaultGrants is checkOwnGrants for the default plan's record:
// es are the default plan's current generations (by id; offerDefault).
func (l *Ledger) checkDefaultGrants(es []defaultGrant, p *Plan, at int64) error {
	n, _ := offeredBytes(p)
	for _, e := range es {
		if _, ok := p.grantIndex(e.id); !ok && l.alive(e.exp, at) {
			n += grantEntryBytes(e.id)
		}
	}
	if n > MaxGrantBytes {
		return fmt.Errorf("%w: %d bytes of grants kept alive (the most is %d)", ErrTooManyGrants, n, MaxGrantBytes)
	}
	return nil
}

// grantIndex returns the index of the grant id in p.Grants.
func (p *Plan) grantIndex(id string) (int, bool) {
	for i := range p.Grants {
		if p.Grants[i].ID == id {
			return i, true
		}
	}
	return 0, false
}
