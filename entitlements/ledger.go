package entitlements

import (
	"bytes"
	"encoding"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/meterline/meterline/schemas"
)

// Store is the state a Ledger reads and writes: one partition's state of
// the aggregator (*stream.Tx has these methods), or a map in tests. Get
// sees the Store's own writes; Put copies k and v, Delete k; Scan visits
// the live keys of [lo, hi) in order and fn must not write while it runs.
type Store interface {
	Get(k []byte) ([]byte, bool, error)
	Put(k, v []byte)
	Delete(k []byte)
	Scan(lo, hi []byte, fn func(k, v []byte) error) error
}

// DecodeCache is what a Store may also implement: decoded state values
// kept by their bytes. The Ledger uses it for the reads that only read a
// value (the plans of PlanAt, Decide's rate card), never for one it
// changes and writes back, so that a value kept is never modified.
type DecodeCache interface {
	// Decoded returns what KeepDecoded kept for the bytes v.
	Decoded(v []byte) (any, bool)
	// KeepDecoded keeps x, decoded from the bytes v.
	KeepDecoded(v []byte, x any)
}

// ResolveCache is what a Store may also implement: what Decide resolves
// for a customer before its reads of usage and grants (the customer's
// Timeline, the default plan's, the RateHistory), kept decoded. The Store
// must forget every Resolved it keeps when a key for which
// Ledger.Resolves reports true is written or deleted, and with every
// write it drops (an aborted transaction).
type ResolveCache interface {
	// Resolved returns what KeepResolved kept for the customer.
	Resolved(customer string) (*Resolved, bool)
	// KeepResolved keeps r for the customer.
	KeepResolved(customer string, r *Resolved)
}

// AccountCache is what a Store may also implement: customers' Accounts
// kept decoded, as the committed state and the open transaction have
// them. The Ledger reads an account through it (KeepAccount what it
// decoded on a miss), changes the one it got in place, and calls
// ChangedAccount at its first change since it was kept or last written;
// a changed account reaches the Store only when the cache's owner calls
// Ledger.WriteAccount for it, which it must do for every account changed
// before its transaction commits. Every account
// kept must be dropped with an aborted transaction: the Ledger changes
// them in place.
type AccountCache interface {
	// Account returns the customer's account as kept.
	Account(customer string) (*Account, bool)
	// KeepAccount keeps a, read from the Store, for the customer.
	KeepAccount(customer string, a *Account)
	// ChangedAccount records that the Ledger changed the customer's
	// account a (kept already), for the first time since it was kept
	// or last written by WriteAccount.
	ChangedAccount(customer string, a *Account)
}

// TimelineCache is what a Store may also implement: the Timelines of
// customers and of the default plan kept decoded by their state key
// (Ledger.IsTimeline), as the committed state and the open transaction
// have them, so that a record of a key whose versions are large costs
// no decoding, validation and encoding of them all. The Ledger reads a
// timeline through it (KeepTimeline what it decoded on a miss), changes
// the one it got in place (Apply, the prunes), and calls ChangedTimeline
// after each change; a changed timeline reaches the Store only when the
// cache's owner calls Ledger.WriteTimeline for it, which it must do
// before its transaction commits, and before it drops the timeline from
// the cache. Every timeline kept must be dropped with an aborted
// transaction, and every Resolved at ChangedTimeline (a Resolved may hold
// the timeline changed).
type TimelineCache interface {
	// Timeline returns the timeline kept for the key k.
	Timeline(k []byte) (*Timeline, bool)
	// KeepTimeline keeps t, read from the Store, for the key k.
	KeepTimeline(k []byte, t *Timeline)
	// ChangedTimeline records that the Ledger changed t, the timeline
	// of the key k.
	ChangedTimeline(k []byte, t *Timeline)
}

// Resolved is what Decide resolves for a customer (ResolveCache). Its
// values are never modified.
type Resolved struct {
	own, def *Timeline
	rates    *RateHistory
	// steady is the plan in effect, planAt(own, def, arrival), for every
	// arrival from steadyFrom on (steadyFrom: math.MinInt64 when that is
	// every arrival): the latest versions of both timelines, worked out
	// once, so that an event arriving after them, nearly every event,
	// reads neither timeline.
	steady     *Plan
	steadyFrom int64
}

// newResolved returns the Resolved of own, def and h.
func newResolved(own, def *Timeline, h *RateHistory) *Resolved {
	r := &Resolved{own: own, def: def, rates: h, steadyFrom: math.MinInt64}
	if n := len(own.versions); n > 0 {
		last := own.versions[n-1]
		r.steadyFrom = last.From
		if r.steady = last.Plan; r.steady != nil {
			return r
		}
	}
	if n := len(def.versions); n > 0 {
		last := def.versions[n-1]
		r.steadyFrom, r.steady = max(r.steadyFrom, last.From), last.Plan
	}
	return r
}

// planAt is PlanAt on what r resolved.
func (r *Resolved) planAt(arrival int64) *Plan {
	if arrival >= r.steadyFrom {
		return r.steady
	}
	return planAt(r.own, r.def, arrival)
}

// Resolves reports whether k is a key whose write makes every Resolved
// stale: a customer's or the default plan's Timeline, the RateHistory.
func (l *Ledger) Resolves(k []byte) bool {
	n := len(l.cfg.Prefix)
	if len(k) <= n || string(k[:n]) != string(l.cfg.Prefix) {
		return false
	}
	switch k[n] {
	case subTimeline, subDefault, subRates:
		return true
	}
	return false
}

// IsTimeline reports whether k is a key of a Timeline (a customer's 'T' C,
// or the default plan's 'D'), which a Store that is a TimelineCache need
// not keep in any cache of its own: the Ledger reads it only on a miss of
// the TimelineCache.
func (l *Ledger) IsTimeline(k []byte) bool {
	n := len(l.cfg.Prefix)
	return len(k) > n && (k[n] == subTimeline && len(k) > n+1 || k[n] == subDefault && len(k) == n+1) &&
		string(k[:n]) == string(l.cfg.Prefix)
}

// IsAccount reports whether k is a customer's Account key ('A' C), which
// a Store that is an AccountCache need not keep in any cache of its own:
// the Ledger reads it only on a miss of the AccountCache.
func (l *Ledger) IsAccount(k []byte) bool {
	n := len(l.cfg.Prefix)
	return len(k) > n+1 && k[n] == subAccount && string(k[:n]) == string(l.cfg.Prefix)
}

// resolve returns what Decide resolves for a customer, through st's
// ResolveCache if it has one.
func (l *Ledger) resolve(st Store, customer string) (*Resolved, error) {
	rc, cached := st.(ResolveCache)
	if cached {
		if r, ok := rc.Resolved(customer); ok {
			return r, nil
		}
	}
	own, err := l.readTimeline(st, l.customerKey(subTimeline, customer))
	if err != nil {
		return nil, err
	}
	def, err := l.readTimeline(st, l.keyDefault)
	if err != nil {
		return nil, err
	}
	h, err := l.readRates(st)
	if err != nil {
		return nil, err
	}
	r := newResolved(own, def, h)
	if cached {
		rc.KeepResolved(customer, r)
	}
	return r, nil
}

// planAt is PlanAt on resolved timelines.
func planAt(own, def *Timeline, arrival int64) *Plan {
	if p, ok := own.At(arrival); ok && p != nil {
		return p
	}
	p, _ := def.At(arrival)
	return p
}

// Config configures a Ledger.
type Config struct {
	// Prefix starts every state key the Ledger writes, so that it shares
	// a stage's state with other keys. Required.
	Prefix []byte
	// Window is the dedup window W: an event's event_time is less than W
	// before its arrival (docs/design.md, Time). It bounds what Prune
	// keeps. Default: DefaultWindow.
	Window time.Duration
	// Span is how far before a stage's watermark a future event's arrival
	// can be (the horizon the stage prunes to is its watermark less Span;
	// the aggregator's is W + B + S), at least Window. A record is refused
	// when MaxVersions versions of its key take effect within Span before
	// its broker time (Timeline.SetWithin): since a stage's watermark is
	// behind the broker time of every record it reads, the count is the
	// same in a stage that lags and keeps older versions. Default: Window.
	Span time.Duration
	// Period returns the billing period [start, end) containing an epoch
	// ms time, a function of that time alone (the Ledger remembers the
	// last period it returned). Required.
	Period func(ms int64) (start, end int64)
}

// DefaultWindow is Config.Window's default: dedup's default window
// (dedup.DefaultWindow, which the CLI's tests hold it equal to; this
// package does not import the stage).
const DefaultWindow = 35 * 24 * time.Hour

// EnsureDefaults fills zero fields with their defaults.
func (c *Config) EnsureDefaults() {
	if c.Window == 0 {
		c.Window = DefaultWindow
	}
	if c.Span == 0 {
		c.Span = c.Window
	}
}

// Validate reports every problem at once.
func (c *Config) Validate() error {
	var errs []error
	if len(c.Prefix) == 0 {
		errs = append(errs, errors.New("entitlements: prefix is required"))
	}
	if c.Window <= 0 {
		errs = append(errs, fmt.Errorf("entitlements: window must be positive (got %s)", c.Window))
	}
	if c.Span < c.Window {
		errs = append(errs, fmt.Errorf("entitlements: span %s must be at least the window %s", c.Span, c.Window))
	}
	if c.Period == nil {
		errs = append(errs, errors.New("entitlements: period is required"))
	}
	return errors.Join(errs...)
}

// period returns the billing period containing ms (Config.Period),
// remembering the last one it returned: the events of a run mostly fall
// in one period, and Config.Period is a function of ms alone.
func (l *Ledger) period(ms int64) (start, end int64) {
	if p := l.last.Load(); p != nil && ms >= p[0] && ms < p[1] {
		return p[0], p[1]
	}
	start, end = l.cfg.Period(ms)
	if start <= ms && ms < end {
		l.last.Store(&[2]int64{start, end})
	}
	return start, end
}

// Ledger decides events against entitlements kept in a Store, one
// partition's worth (a customer's records and events share a partition).
// Its keys, after Config.Prefix (C is a customer key, schemas.CustomerKey;
// P a period start, 8 bytes big-endian so keys sort by period):
//
//	'T' C          the customer's Timeline
//	'D'            the default plan's Timeline
//	'R'            the RateHistory
//	'G'            the default plan's current generation of each grant
//	               id and its latest expiry, while alive (generation.go)
//	'W'            the latest broker time read from the entitlements partition
//	'A' C          the customer's Account: what each grant generation
//	               has paid (and the latest expiry the customer's own
//	               records gave it; every generation they offered, paid
//	               or not); per period P still reachable by an event,
//	               the accepted units of each meter and the overdraft
//	'P' P C        the customer's Account has usage in P (an index: a
//	               value of one byte), for CustomersWithUsage and
//	               PrunePeriods
//	'N' P C        the customer's Account held only a note of a time in
//	               P when written (an index: a value of one byte), for
//	               PrunePeriods
//
// A transaction that changes a customer's usage, grants or overdraft thus
// writes one key for it ('A' C), plus 'P' P C at its first usage in a
// period; one that notes a balance's time for a customer with neither
// writes 'A' C, plus 'N' P C at its first note in a period.
//
// A Ledger holds no state of its own (but the last billing period it
// computed, a function of the time alone): every call reads and writes the
// Store (and the accounts an AccountCache keeps for it), so the stage's
// transaction (its overlay, commit and abort) is the whole story. It is
// not safe for concurrent use on one Store.
type Ledger struct {
	cfg Config
	// The keys without a customer, built once.
	keyDefault, keyRates, keyReadTo, keyDefaultGrants []byte
	// last is the last period period returned, [start, end): the
	// Ledger's only memory, shared by the goroutines that use it.
	last atomic.Pointer[[2]int64]
}

// New returns a Ledger.
func New(cfg Config) (*Ledger, error) {
	cfg.EnsureDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.Prefix = append([]byte(nil), cfg.Prefix...)
	l := &Ledger{cfg: cfg}
	l.keyDefault, l.keyRates, l.keyReadTo = l.key(subDefault), l.key(subRates), l.key(subReadTo)
	l.keyDefaultGrants = l.key(subDefaultGrants)
	return l, nil
}

const (
	subTimeline = 'T'
	subDefault  = 'D'
	subRates    = 'R'
	subReadTo   = 'W'
	subAccount  = 'A'
	subPeriod   = 'P'
	// subNote: the note index (Ledger.WriteAccount).
	subNote = 'N'
	// subDefaultGrants: the default plan's grant generations.
	subDefaultGrants = 'G'
)

func (l *Ledger) key(sub byte, parts ...[]byte) []byte {
	n := len(l.cfg.Prefix) + 1
	for _, p := range parts {
		n += len(p)
	}
	k := make([]byte, 0, n)
	k = append(append(k, l.cfg.Prefix...), sub)
	for _, p := range parts {
		k = append(k, p...)
	}
	return k
}

func period8(start int64) []byte { return binary.BigEndian.AppendUint64(nil, uint64(start)) }

// customerKey returns the key sub C, in one allocation.
func (l *Ledger) customerKey(sub byte, customer string) []byte {
	k := make([]byte, 0, len(l.cfg.Prefix)+1+framedLen(customer))
	return schemas.AppendFramed(append(append(k, l.cfg.Prefix...), sub), customer)
}

// periodIndexKey returns the key 'P' P C.
func (l *Ledger) periodIndexKey(start int64, customer string) []byte {
	return l.indexKey(subPeriod, start, customer)
}

// indexKey returns the key sub P C of an index by period (subPeriod,
// subNote).
func (l *Ledger) indexKey(sub byte, start int64, customer string) []byte {
	k := make([]byte, 0, len(l.cfg.Prefix)+1+8+framedLen(customer))
	k = binary.BigEndian.AppendUint64(append(append(k, l.cfg.Prefix...), sub), uint64(start))
	return schemas.AppendFramed(k, customer)
}

// framedLen is the length of s framed (schemas.AppendFramed).
func framedLen(s string) int { return len(s) + len(strconv.Itoa(len(s))) + 1 }

func (l *Ledger) getInt(st Store, k []byte) (int64, error) {
	v, ok, err := st.Get(k)
	if err != nil || !ok {
		return 0, err
	}
	n, m := binary.Varint(v)
	if m <= 0 || m != len(v) || n < 0 {
		return 0, fmt.Errorf("entitlements: state key %q: %w: bad counter", k, ErrCorrupt)
	}
	return n, nil
}

func (l *Ledger) putInt(st Store, k []byte, n int64) {
	st.Put(k, binary.AppendVarint(nil, n))
}

// timeline returns the Timeline of the key k as the Store has it: through
// st's TimelineCache if it has one, where the Ledger may change it in
// place and must then call putTimeline.
func (l *Ledger) timeline(st Store, k []byte) (*Timeline, error) {
	tc, cached := st.(TimelineCache)
	if cached {
		if t, ok := tc.Timeline(k); ok {
			return t, nil
		}
	}
	t := &Timeline{}
	if err := readState(st, k, t); err != nil {
		return nil, err
	}
	if cached {
		tc.KeepTimeline(k, t)
	}
	return t, nil
}

// readState decodes the value of the key k into x, left as it is when st
// holds no k.
func readState(st Store, k []byte, x encoding.BinaryUnmarshaler) error {
	v, ok, err := st.Get(k)
	if err != nil || !ok {
		return err
	}
	if err := x.UnmarshalBinary(v); err != nil {
		return fmt.Errorf("entitlements: state key %q: %w", k, err)
	}
	return nil
}

// readTimeline is timeline for a read only: through st's TimelineCache or
// DecodeCache, if it has one. The Timeline must not be modified.
func (l *Ledger) readTimeline(st Store, k []byte) (*Timeline, error) {
	if _, ok := st.(TimelineCache); ok {
		return l.timeline(st, k)
	}
	dc, ok := st.(DecodeCache)
	if !ok {
		return l.timeline(st, k)
	}
	v, found, err := st.Get(k)
	if err != nil || !found {
		return &Timeline{}, err
	}
	if x, ok := dc.Decoded(v); ok {
		if t, ok := x.(*Timeline); ok {
			return t, nil
		}
	}
	t := &Timeline{}
	if err := t.UnmarshalBinary(v); err != nil {
		return nil, fmt.Errorf("entitlements: state key %q: %w", k, err)
	}
	dc.KeepDecoded(v, t)
	return t, nil
}

// readRates is rates for a read only, as readTimeline.
func (l *Ledger) readRates(st Store) (*RateHistory, error) {
	dc, ok := st.(DecodeCache)
	if !ok {
		return l.rates(st)
	}
	k := l.keyRates
	v, found, err := st.Get(k)
	if err != nil || !found {
		return &RateHistory{}, err
	}
	if x, ok := dc.Decoded(v); ok {
		if h, ok := x.(*RateHistory); ok {
			return h, nil
		}
	}
	h := &RateHistory{}
	if err := h.UnmarshalBinary(v); err != nil {
		return nil, fmt.Errorf("entitlements: state key %q: %w", k, err)
	}
	dc.KeepDecoded(v, h)
	return h, nil
}

// putTimeline records that the Ledger changed t, the timeline of the key k
// (returned by timeline): the TimelineCache is told, else t is written.
func (l *Ledger) putTimeline(st Store, k []byte, t *Timeline) {
	if tc, ok := st.(TimelineCache); ok {
		tc.ChangedTimeline(k, t)
		return
	}
	l.WriteTimeline(st, k, t)
}

// WriteTimeline writes the timeline of the key k to st (Put, or Delete
// when it holds no version), whatever caches st has: a TimelineCache's
// owner calls it for each timeline the Ledger changed.
func (l *Ledger) WriteTimeline(st Store, k []byte, t *Timeline) {
	if t.Len() == 0 {
		st.Delete(k)
		return
	}
	b, _ := t.MarshalBinary()
	st.Put(k, b)
}

func (l *Ledger) rates(st Store) (*RateHistory, error) {
	h := &RateHistory{}
	k := l.keyRates
	v, ok, err := st.Get(k)
	if err != nil || !ok {
		return h, err
	}
	if err := h.UnmarshalBinary(v); err != nil {
		return nil, fmt.Errorf("entitlements: state key %q: %w", k, err)
	}
	return h, nil
}

// ReadTo returns the latest broker time read from the entitlements
// partition (Apply and Advance record it), 0 before any. An event that
// arrived before it can be decided: every record that can decide it has
// been read. One that arrived at it cannot yet: a record of the same
// millisecond, not read yet, would apply to it (Timeline.At).
func (l *Ledger) ReadTo(st Store) (int64, error) { return l.getInt(st, l.keyReadTo) }

// Advance records that the entitlements partition has been read up to
// broker time written. Apply calls it; call it for every other record
// read (a tick, a record ParseRecord refused).
func (l *Ledger) Advance(st Store, written int64) error {
	cur, err := l.ReadTo(st)
	if err != nil {
		return err
	}
	if written > cur {
		l.putInt(st, l.keyReadTo, written)
	}
	return nil
}

// Apply applies a record (ParseRecord) and Advance-s to its broker time.
// The record takes effect no earlier than ReadTo: a broker time behind it
// (a broker clock that stepped back) is raised to it, for events that
// arrived before it may have been decided already, and a stage that read
// the record before deciding them must decide them alike. An error
// wrapping ErrInvalid (ErrTooManyVersions) refuses the record and changes
// nothing else; any other error is the Store's, or corrupt state.
func (l *Ledger) Apply(st Store, r *Record) error {
	if r.IsTick() {
		return l.Advance(st, r.Written)
	}
	written, err := l.ReadTo(st)
	if err != nil {
		return err
	}
	written = max(written, r.Written)
	switch {
	case r.Key.Reserved == schemas.RateCardKey:
		h, err := l.rates(st)
		if err != nil {
			return err
		}
		card := r.RateCard
		if r.Tombstone {
			card = nil
		}
		n := h.Len()
		// Only the cards read within the span before it count against
		// the bound, whatever has been pruned (Timeline.SetWithin).
		if err := h.SetWithin(written, card, written-l.cfg.Span.Milliseconds(), written-l.bytesSpan(true)); err != nil {
			return fmt.Errorf("entitlements: %s: %w", describeKey(r.Key), err)
		}
		if h.Len() != n {
			b, _ := h.MarshalBinary()
			st.Put(l.keyRates, b)
		}
	default:
		customer := r.Key.Reserved == ""
		k := l.keyDefault
		if customer {
			k = l.customerKey(subTimeline, r.Key.Customer)
		}
		t, err := l.timeline(st, k)
		if err != nil {
			return err
		}
		var from int64
		if r.Entitlements != nil {
			from = r.Entitlements.EffectiveFrom
		}
		// The grants' generations, by the records read before this one
		// (generation.go); nothing is changed before the version is.
		p := r.Plan
		var a *Account
		var es []defaultGrant
		if p != nil && len(p.Grants) > 0 {
			if es, err = l.defaultGrants(st); err != nil {
				return err
			}
			if customer {
				if a, err = l.account(st, r.Key.Customer); err != nil {
					return err
				}
				p = p.withGens(l.ownGens(a.uses, es, p, written))
				err = l.checkOwnGrants(a.uses, p, written)
			} else {
				p = p.withGens(l.defaultGens(es, p, written))
				err = l.checkDefaultGrants(es, p, written)
			}
			if err != nil {
				return fmt.Errorf("entitlements: %s: %w", describeKey(r.Key), err)
			}
		}
		if err := t.SetWithin(written, from, p, written-l.cfg.Span.Milliseconds(), written-l.bytesSpan(false)); err != nil {
			return fmt.Errorf("entitlements: %s: %w", describeKey(r.Key), err)
		}
		l.putTimeline(st, k, t)
		switch {
		case p == nil || len(p.Grants) == 0:
		case customer:
			if uses, changed := offerOwn(a.uses, p); changed {
				a.uses = uses
				l.putAccount(st, r.Key.Customer, a)
			}
		default:
			l.putDefaultGrants(st, l.offerDefault(es, p, written))
		}
	}
	return l.Advance(st, r.Written)
}

// PlanAt returns the plan in effect for a customer at arrival time
// arrival: the customer's own version, else the default plan's, else nil
// (no plan).
func (l *Ledger) PlanAt(st Store, customer string, arrival int64) (*Plan, error) {
	t, err := l.readTimeline(st, l.customerKey(subTimeline, customer))
	if err != nil {
		return nil, err
	}
	if p, ok := t.At(arrival); ok && p != nil {
		return p, nil
	}
	d, err := l.readTimeline(st, l.keyDefault)
	if err != nil {
		return nil, err
	}
	p, _ := d.At(arrival)
	return p, nil
}

// maxGrantUses bounds the entries of one customer's grant state when it is
// decoded.
const maxGrantUses = 1 << 20

// account returns the customer's Account as the Store has it (empty when
// it has none): through st's AccountCache if it has one, where the Ledger
// may change it in place and must then call putAccount.
func (l *Ledger) account(st Store, customer string) (*Account, error) {
	ac, cached := st.(AccountCache)
	if cached {
		if a, ok := ac.Account(customer); ok {
			return a, nil
		}
	}
	a := &Account{}
	if err := readState(st, l.customerKey(subAccount, customer), a); err != nil {
		return nil, err
	}
	if cached {
		ac.KeepAccount(customer, a)
	}
	return a, nil
}

// ChangedAt returns the latest broker time noted in the customer's
// account (Account.NoteChange), 0 if none.
func (l *Ledger) ChangedAt(st Store, customer string) (int64, error) {
	a, err := l.account(st, customer)
	if err != nil {
		return 0, err
	}
	return a.changedAt, nil
}

// BalanceAsOf returns the time a balance of the customer that would go
// out as of at goes out as of: the later of at and the latest time noted
// in its account (ChangedAt), so that a customer's balances never go
// back in time (docs/entitlements.md, The aggregator, 4). When that is
// at, later than the time noted and than floor (the stage's watermark,
// which never goes back: a balance as of it or earlier needs no note),
// the account notes it, and is written with the Ledger's changes
// (putAccount), an account that holds nothing else included: it is kept
// for its note. Such an account whose note is at or below floor is of no
// use: BalanceAsOf drops its note, and the account with it (its key
// deleted); PrunePeriods drops those no balance finds.
func (l *Ledger) BalanceAsOf(st Store, customer string, at, floor int64) (int64, error) {
	a, err := l.account(st, customer)
	if err != nil {
		return 0, err
	}
	if at <= a.changedAt {
		return a.changedAt, nil
	}
	switch {
	case at > floor:
		a.NoteChange(at)
		l.putAccount(st, customer, a)
	case dropNoteAtOrBelow(a, floor):
		l.putAccount(st, customer, a)
	}
	return at, nil
}

// dropNoteAtOrBelow drops the note of an account that holds nothing else
// when it is at or below floor (see BalanceAsOf), and reports whether it
// did.
func dropNoteAtOrBelow(a *Account, floor int64) bool {
	if a.noteOnly() && a.changedAt <= floor {
		a.changedAt = 0
		return true
	}
	return false
}

// putAccount records that the Ledger changed the customer's account a
// (returned by account): the AccountCache is told, else a is written.
//
// The AccountCache hears of an account once between two WriteAccounts of
// it (Account.changed): its owner writes it once anyway.
func (l *Ledger) putAccount(st Store, customer string, a *Account) {
	if ac, ok := st.(AccountCache); ok {
		if !a.changed {
			a.changed = true
			ac.ChangedAccount(customer, a)
		}
		return
	}
	l.WriteAccount(st, customer, a, nil)
}

// WriteAccount writes a customer's account to st (Put, or Delete when it
// holds nothing, no note either), whatever caches st has: an
// AccountCache's owner calls it for each account the Ledger changed.
// scratch is reused for the key and the encoding (st's Put and Delete copy
// them); the buffer is returned for the next call.
//
// An account that holds only a note is put in the note index of the
// note's period ('N' P C), unless it was decoded or last written holding
// only a note of that period (which put it there): every such account in
// the Store is in the index of its note's period, and PrunePeriods finds
// it there once that period is below its cut.
func (l *Ledger) WriteAccount(st Store, customer string, a *Account, scratch []byte) []byte {
	a.changed = false
	indexed := a.indexedAt
	a.indexedAt = 0
	scratch = schemas.AppendFramed(append(append(scratch[:0], l.cfg.Prefix...), subAccount), customer)
	kn := len(scratch)
	if a.empty() && a.changedAt == 0 {
		st.Delete(scratch)
		return scratch
	}
	scratch = appendAccount(scratch, a)
	st.Put(scratch[:kn:kn], scratch[kn:])
	if a.noteOnly() {
		a.indexedAt = a.changedAt
		if start := l.periodStart(a.changedAt); indexed == 0 || start != l.periodStart(indexed) {
			st.Put(l.indexKey(subNote, start, customer), indexValue)
		}
	}
	return scratch
}

// periodStart returns the start of the billing period containing ms.
func (l *Ledger) periodStart(ms int64) int64 {
	start, _ := l.period(ms)
	return start
}

// Decide decides one event of a customer (the package function Decide on
// what the Store holds) and, when it is accepted, records its charge in
// the Store (Record). A rejected event changes nothing. The error is the
// Store's, or corrupt state, never the event's: a bad event is a Decision
// with Outcome Invalid.
func (l *Ledger) Decide(st Store, customer string, ev Event) (Decision, error) {
	d, err := l.Evaluate(st, customer, ev)
	if err != nil || d.Outcome != Accepted {
		return d, err
	}
	return d, l.Record(st, customer, ev, d)
}

// Evaluate decides one event of a customer as Decide does, and changes
// nothing: Record records the charge of an accepted decision, with nothing
// else recorded for the customer in between.
func (l *Ledger) Evaluate(st Store, customer string, ev Event) (Decision, error) {
	var d Decision
	err := l.EvaluateInto(st, customer, &ev, &d)
	return d, err
}

// EvaluateInto is Evaluate of *ev, which it does not modify, into *d,
// whose Draws' backing array it reuses (what d held before is
// overwritten): a stage that decides its events one at a time allocates
// no Draws per event, and copies no Event.
func (l *Ledger) EvaluateInto(st Store, customer string, ev *Event, d *Decision) error {
	res, err := l.resolve(st, customer)
	if err != nil {
		*d = Decision{Draws: d.Draws[:0]}
		return err
	}
	plan := res.planAt(ev.Arrival)
	rate, hasRate := res.rates.Rate(ev.Arrival, ev.EventTime, ev.Meter)
	// The account is read only when the decision can depend on it (the
	// usage of SUM and COUNT meters, the overdraft under a policy that
	// allows it, what grants paid for an event that costs something).
	charged := Charged(ev.Aggregation)
	// Set field by field: a composite literal is built in a temporary
	// and copied, a cost seen per event. decideInto reads ev, not
	// in.Event.
	var in Input
	in.Plan, in.Rate, in.HasRate = plan, rate, hasRate
	var start int64
	var a *Account
	if charged || plan == nil || plan.Overdraft.Policy == schemas.OverdraftAllow {
		if a, err = l.account(st, customer); err != nil {
			*d = Decision{Draws: d.Draws[:0]}
			return err
		}
		start, _ = l.period(ev.EventTime)
		p := a.period(start)
		if charged {
			in.Usage = p.units(ev.Meter)
		}
		in.Overdrawn = p.overdrawnIn()
		in.uses = a.uses
	}
	decideInto(&in, ev, d)
	d.Plan, d.start, d.acct = plan, start, a
	return nil
}

// Record records the charge of an accepted decision that Evaluate returned
// for the event: the usage of its meter in its period, what each grant
// paid, the overdraft. A period the account gets usage in for the first
// time is listed in the period's index, for CustomersWithUsage and
// PrunePeriods.
func (l *Ledger) Record(st Store, customer string, ev Event, d Decision) error {
	return l.RecordDecided(st, customer, &ev, &d)
}

// RecordDecided is Record of *d for *ev, which it does not modify: a stage
// that decides its events one at a time copies neither per event.
func (l *Ledger) RecordDecided(st Store, customer string, ev *Event, d *Decision) error {
	if d.Outcome != Accepted || d.Units == 0 && d.Overdraft == 0 && len(d.Draws) == 0 {
		return nil
	}
	a, start := d.acct, d.start
	if a == nil {
		var err error
		if a, err = l.account(st, customer); err != nil {
			return err
		}
		start, _ = l.period(ev.EventTime)
	}
	if d.Units > 0 || d.Overdraft > 0 {
		p, added := a.addPeriod(start)
		if d.Units > 0 {
			p.add(ev.Meter, d.Units)
		}
		p.overdrawn += d.Overdraft
		if added {
			st.Put(l.periodIndexKey(start, customer), indexValue)
		}
	}
	if len(d.Draws) > 0 {
		uses := a.uses
		for _, dr := range d.Draws {
			i, ok := findUse(uses, dr.Grant, dr.gen)
			if ok {
				uses[i].consumed += dr.Amount // ≤ the grant's amount: no overflow
				continue
			}
			uses = append(uses, grantUse{})
			copy(uses[i+1:], uses[i:])
			uses[i] = grantUse{id: dr.Grant, gen: dr.gen, consumed: dr.Amount}
		}
		a.uses = uses
	}
	l.putAccount(st, customer, a)
	return nil
}

// AppendCharge appends to b what Record records for the accepted decision
// d of an event (the units of its meter, what each grant paid, the
// overdraft), for Refund, also when that is nothing; it returns b
// unchanged for a rejected decision.
func (d *Decision) AppendCharge(b []byte) []byte {
	if d.Outcome != Accepted {
		return b
	}
	e := &enc{b: append(b, stateFormatGen)}
	e.int(d.Units)
	e.int(d.Overdraft)
	e.count(len(d.Draws))
	for _, dr := range d.Draws {
		e.str(dr.Grant)
		e.int(dr.gen)
		e.int(dr.Amount)
	}
	return e.b
}

// Refund takes back, from the customer's account, the charge that Record
// recorded for the event (charge: Decision.AppendCharge), for a stage that
// accepted and charged an event and then could not count it
// (docs/entitlements.md, Plans and caps: a rejected event consumes
// nothing). What the account no longer holds (a period or a grant pruned
// since) stays as it is, and nothing goes below zero. It returns the
// micro-credits the charge held (what its grants paid and its overdraft),
// for metrics. The error is the Store's, or a charge that does not
// decode.
func (l *Ledger) Refund(st Store, customer string, ev Event, charge []byte) (int64, error) {
	d := newDecGens("charge", charge)
	units, overdraft := d.int(), d.int()
	n := d.count(maxGrantUses)
	draws := make([]Draw, 0, n)
	for i := 0; i < n && d.err == nil; i++ {
		dr := Draw{Grant: d.str(), gen: legacyGen}
		if d.gens {
			dr.gen = d.int()
		}
		dr.Amount = d.int()
		if dr.Amount < 0 {
			d.fail("charge: negative draw")
		}
		draws = append(draws, dr)
	}
	if units < 0 || overdraft < 0 {
		d.fail("charge: negative units or overdraft")
	}
	if err := d.end(); err != nil {
		return 0, err
	}
	cost := overdraft
	for _, dr := range draws {
		cost = min(cost, math.MaxInt64-dr.Amount) + dr.Amount // saturates
	}
	a, err := l.account(st, customer)
	if err != nil {
		return 0, err
	}
	start, _ := l.period(ev.EventTime)
	if p := a.period(start); p != nil {
		if u := p.units(ev.Meter); u > 0 && units > 0 {
			p.add(ev.Meter, -min(units, u))
		}
		p.overdrawn -= min(overdraft, p.overdrawn)
	}
	for _, dr := range draws {
		if i, ok := findUse(a.uses, dr.Grant, dr.gen); ok {
			a.uses[i].consumed -= min(dr.Amount, a.uses[i].consumed)
		}
	}
	l.putAccount(st, customer, a)
	return cost, nil
}

// indexValue is the value of a period index key (a non-empty value: an
// empty one is too close to a tombstone for comfort).
var indexValue = []byte{1}

// Balance returns a customer's balance as of broker time at (the
// stage's watermark): the plan in effect at at, usage against each of its
// caps in the period containing at, each of its grants not yet expired at
// at with what it has paid, and the overdraft of the period. revision is
// the stage's (larger for every later balance of the customer). Its
// CapsUntil is when, by the records applied so far, the caps or unmetered
// in effect change after at (capsUntil).
func (l *Ledger) Balance(st Store, customer string, at, revision int64) (*schemas.Balance, error) {
	var own, def *Timeline
	if _, cached := st.(ResolveCache); cached {
		res, err := l.resolve(st, customer)
		if err != nil {
			return nil, err
		}
		own, def = res.own, res.def
	} else {
		var err error
		if own, err = l.readTimeline(st, l.customerKey(subTimeline, customer)); err != nil {
			return nil, err
		}
		if def, err = l.readTimeline(st, l.keyDefault); err != nil {
			return nil, err
		}
	}
	plan := planAt(own, def, at)
	if plan == nil {
		plan = noPlan
	}
	a, err := l.account(st, customer)
	if err != nil {
		return nil, err
	}
	start, end := l.period(at)
	pu := a.period(start)
	b := &schemas.Balance{CustomerID: customer, Plan: plan.Name, Unmetered: plan.Unmetered, Revision: revision, UpdatedAt: at,
		PeriodStart: start, PeriodEnd: end, Meters: []schemas.MeterBalance{}, Grants: []schemas.GrantBalance{},
		OverdraftPolicy: plan.Overdraft.Policy, OverdraftLimit: plan.Overdraft.Limit, Overdrawn: pu.overdrawnIn(),
		CapsUntil: capsUntil(own, def, at, plan)}
	for _, c := range plan.Caps {
		b.Meters = append(b.Meters, schemas.MeterBalance{Meter: c.Meter, Usage: pu.units(c.Meter), Limit: c.Limit, OnLimit: c.OnLimit})
	}
	for i, g := range plan.Grants {
		if expiry(g) <= at {
			continue
		}
		used := consumedOf(a.uses, g.ID, plan.gen(i))
		b.Grants = append(b.Grants, schemas.GrantBalance{ID: g.ID, Priority: g.Priority, EffectiveFrom: g.EffectiveFrom,
			ExpiresAt: g.ExpiresAt, Amount: g.Amount, Consumed: used, Remaining: max(0, g.Amount-used)})
	}
	sort.Slice(b.Grants, func(i, j int) bool { return b.Grants[i].ID < b.Grants[j].ID })
	return b, nil
}

// capsUntil returns the earliest arrival time after at from which the plan
// in effect for a customer (planAt: its own version, else the default
// plan's) has other caps or another unmetered than cur, the plan in effect
// at at; 0 when no version the timelines hold makes such a change. The
// timelines hold the records applied so far: a record read later is not
// known here. Only versions from after at are looked at, and a customer
// with none (nothing scheduled) costs two comparisons.
func capsUntil(own, def *Timeline, at int64, cur *Plan) int64 {
	ov, dv := own.Versions(), def.Versions()
	if (len(ov) == 0 || ov[len(ov)-1].From <= at) && (len(dv) == 0 || dv[len(dv)-1].From <= at) {
		return 0
	}
	i := sort.Search(len(ov), func(k int) bool { return ov[k].From > at })
	j := sort.Search(len(dv), func(k int) bool { return dv[k].From > at })
	for i < len(ov) || j < len(dv) {
		// The next time a version of either timeline takes effect.
		t := int64(math.MaxInt64)
		if i < len(ov) {
			t = ov[i].From
		}
		if j < len(dv) {
			t = min(t, dv[j].From)
		}
		for i < len(ov) && ov[i].From == t {
			i++
		}
		for j < len(dv) && dv[j].From == t {
			j++
		}
		p := planAt(own, def, t)
		if p == nil {
			p = noPlan
		}
		if p.Unmetered != cur.Unmetered || !slices.Equal(p.Caps, cur.Caps) {
			return t
		}
	}
	return 0
}

// eventTimeHorizon is the earliest event_time a future event can have when
// every future event arrives at or after horizon: dedup accepts an event
// only if arrival − W < event_time.
func (l *Ledger) eventTimeHorizon(horizon int64) int64 {
	w := l.cfg.Window.Milliseconds()
	if horizon < math.MinInt64+w+1 {
		return math.MinInt64
	}
	return horizon - w + 1
}

// bytesSpan is how far before its broker time the versions of a record's
// key count against MaxVersionBytes (the rate history's cards with
// rates): 2·Span, and for the rate history the window W more. A stage
// keeps them as long (keptFloor) as well as those its watermark needs
// (the version in effect Span before it; the cards W before that), so
// that what it keeps is what the last record counted, and its state value
// stays within MaxVersionBytes, while its watermark is less than Span
// behind the time the partition has been read to: counted from Span
// before the record alone, a stage whose watermark was a minute behind
// kept a large version the record no longer counted, past the broker's
// record size with the record's own.
func (l *Ledger) bytesSpan(rates bool) int64 {
	s := 2 * l.cfg.Span.Milliseconds()
	if rates {
		s += l.cfg.Window.Milliseconds()
	}
	return s
}

// keptFloor returns horizon, a horizon to prune versions (rates: cards)
// to, or the time bytesSpan before readTo when earlier: a record read
// later counts the versions from then on (bytesSpan), so a stage keeps
// them whatever its watermark, and counts them alike.
func (l *Ledger) keptFloor(horizon, readTo int64, rates bool) int64 {
	return min(horizon, readTo-l.bytesSpan(rates))
}

// PruneShared drops the versions of the default plan and the rate cards no
// future event can be decided or priced by, given that every future event
// arrives at or after horizon (for the aggregator: its watermark, less
// what a re-routed event's arrival may lag; those a record read later
// counts in bytes stay, keptFloor), and the default plan's grant
// generations no record read later can continue (dead at ReadTo).
func (l *Ledger) PruneShared(st Store, horizon int64) error {
	readTo, err := l.ReadTo(st)
	if err != nil {
		return err
	}
	k := l.keyDefault
	t, err := l.timeline(st, k)
	if err != nil {
		return err
	}
	if n := t.Len(); n > 0 {
		t.Prune(l.keptFloor(horizon, readTo, false))
		if t.Len() != n {
			l.putTimeline(st, k, t)
		}
	}
	es, err := l.defaultGrants(st)
	if err != nil {
		return err
	}
	if n := len(es); n > 0 {
		if es = l.liveDefaults(es, readTo); len(es) != n {
			l.putDefaultGrants(st, es)
		}
	}
	h, err := l.rates(st)
	if err != nil {
		return err
	}
	if n := h.Len(); n > 0 {
		h.Prune(l.keptFloor(l.eventTimeHorizon(horizon), readTo, true))
		if h.Len() != n {
			b, _ := h.MarshalBinary()
			st.Put(l.keyRates, b)
		}
	}
	return nil
}

// PruneCustomer drops what no future event of the customer can need, given
// that every future event arrives at or after horizon: timeline versions
// (Timeline.Prune; those a record read later counts in bytes stay,
// keptFloor), and the grant generations (generation.go) that no
// record read later can continue and that can pay for no future event.
// It keeps a generation while it is alive at ReadTo by the expiries the
// customer's own records gave it (their next record may continue it),
// and, if it has paid something, while the default plan's current
// generation of its id is it and alive at ReadTo, or a version of the
// customer's or of the default plan that may decide a future event offers
// it with an expiry after the earliest event time such an event can have
// (horizon − W). So what a generation paid is dropped only when nothing
// can read it again, and when PruneCustomer runs changes no decision.
// Keys left empty are deleted, and so is an account left with only a note
// at or below horizon (of no use, as in BalanceAsOf).
func (l *Ledger) PruneCustomer(st Store, customer string, horizon int64) error {
	readTo, err := l.ReadTo(st)
	if err != nil {
		return err
	}
	tk := l.customerKey(subTimeline, customer)
	t, err := l.timeline(st, tk)
	if err != nil {
		return err
	}
	if n := t.Len(); n > 0 {
		t.Prune(l.keptFloor(horizon, readTo, false))
		if t.Len() != n {
			l.putTimeline(st, tk, t)
		}
	}
	a, err := l.account(st, customer)
	if err != nil {
		return err
	}
	uses := a.uses
	if len(uses) == 0 {
		return nil
	}
	es, err := l.defaultGrants(st)
	if err != nil {
		return err
	}
	def, err := l.readTimeline(st, l.keyDefault)
	if err != nil {
		return err
	}
	keep := make([]bool, len(uses))
	paid := false
	for k, u := range uses {
		switch {
		case l.alive(u.own, readTo):
			keep[k] = true
		case u.consumed > 0:
			if j, ok := findDefault(es, u.id); ok && es[j].gen == u.gen && l.alive(es[j].exp, readTo) {
				keep[k] = true
			} else {
				paid = true
			}
		}
	}
	if paid {
		etMin := l.eventTimeHorizon(horizon)
		for _, vs := range [][]Version{t.Versions(), def.Versions()} {
			for _, v := range vs {
				if v.Plan == nil {
					continue
				}
				for i, g := range v.Plan.Grants {
					if k, ok := findUse(uses, g.ID, v.Plan.gen(i)); ok && uses[k].consumed > 0 && expiry(g) > etMin {
						keep[k] = true
					}
				}
			}
		}
	}
	kept := uses[:0]
	for k, u := range uses {
		if keep[k] {
			kept = append(kept, u)
		}
	}
	if len(kept) != len(keep) {
		a.uses = kept
		dropNoteAtOrBelow(a, horizon) // left with a note of no use
		l.putAccount(st, customer, a)
	}
	return nil
}

// defaultGrants returns the default plan's current grant generations, by
// id (generation.go); Apply and PruneShared drop those dead at the time
// the partition was read to.
func (l *Ledger) defaultGrants(st Store) ([]defaultGrant, error) {
	v, ok, err := st.Get(l.keyDefaultGrants)
	if err != nil || !ok {
		return nil, err
	}
	es, err := decodeDefaultGrants(v)
	if err != nil {
		return nil, fmt.Errorf("entitlements: state key %q: %w", l.keyDefaultGrants, err)
	}
	return es, nil
}

func (l *Ledger) putDefaultGrants(st Store, es []defaultGrant) {
	if len(es) == 0 {
		st.Delete(l.keyDefaultGrants)
		return
	}
	st.Put(l.keyDefaultGrants, appendDefaultGrants(nil, es))
}

// PrunePeriods drops, at most max customers at a time (docs/design.md,
// Exactly-once, 7), the usage and overdraft of periods no future event can
// belong to, given that every future event arrives at or after horizon: it
// walks the period index ('P' P C) of those periods, drops them from each
// customer's Account and deletes the index keys. It walks the note index
// ('N' P C) of those periods first, deleting its keys and each account
// that holds only a note at or below horizon (of no use: horizon is at or
// below the stage's watermark, BalanceAsOf's floor); an account its pruning
// leaves with only such a note goes too. more reports that keys are left:
// call it again in a later transaction.
func (l *Ledger) PrunePeriods(st Store, horizon int64, max int) (more bool, err error) {
	_, more, err = l.PrunePeriodsAfter(st, horizon, nil, max)
	return more, err
}

// PrunePeriodsAfter is PrunePeriods going on after the index key after (nil:
// from the start), and it returns the last key it deleted, the cursor of
// the next call while more is true. A chunk then starts past the keys the
// chunks before it deleted: from the start, a store with tombstones (Pebble)
// walks every one of them again, and a period of N customers pruned in
// chunks of max costs N²/2·max steps instead of N. No key can appear behind
// the cursor in between: the index keys of periods below the cut are
// written by no event (horizon never goes back), nor by a note (an account
// left with only a note is in the index of the note's period, which is
// below the cut only when the note is at or below horizon, and then it is
// not kept), so a cursor of an earlier horizon holds under a later one.
// The note index sorts before the period index: a cursor in the period
// index has walked the note index.
func (l *Ledger) PrunePeriodsAfter(st Store, horizon int64, after []byte, max int) (last []byte, more bool, err error) {
	cut, _ := l.period(l.eventTimeHorizon(horizon))
	for _, sub := range []byte{subNote, subPeriod} {
		ds, m, err := l.indexBelow(st, sub, cut, after, max)
		if err != nil {
			return nil, false, err
		}
		for _, d := range ds {
			a, err := l.account(st, d.customer)
			if err != nil {
				return nil, false, err
			}
			dropped := sub == subPeriod && len(a.dropPeriodsBefore(cut)) > 0
			if dropNoteAtOrBelow(a, horizon) || dropped {
				l.putAccount(st, d.customer, a)
			}
			st.Delete(d.k)
		}
		if len(ds) > 0 {
			last = ds[len(ds)-1].k
		}
		if max -= len(ds); m {
			return last, true, nil
		}
	}
	return last, false, nil
}

// indexEntry is a key of an index by period (indexBelow), and its
// customer.
type indexEntry struct {
	k        []byte
	customer string
}

// indexBelow returns, in key order, up to max keys of the index sub
// (subPeriod, subNote) of the periods before cut, after the key after
// (nil: from the first); more reports that there are others.
func (l *Ledger) indexBelow(st Store, sub byte, cut int64, after []byte, max int) (es []indexEntry, more bool, err error) {
	plen := len(l.key(sub)) + 8
	lo, hi := l.key(sub), l.key(sub, period8(cut))
	if after != nil && bytes.Compare(after, lo) >= 0 {
		lo = append(bytes.Clone(after), 0) // just past it
	}
	if bytes.Compare(lo, hi) >= 0 {
		return nil, false, nil
	}
	err = st.Scan(lo, hi, func(k, _ []byte) error {
		if len(es) == max {
			more = true
			return errStopScan
		}
		if len(k) < plen {
			return fmt.Errorf("entitlements: state key %q: %w: bad period index key", k, ErrCorrupt)
		}
		parts, err := schemas.SplitFramed(k[plen:])
		if err != nil || len(parts) != 1 {
			return fmt.Errorf("entitlements: state key %q: %w: bad period index key", k, ErrCorrupt)
		}
		es = append(es, indexEntry{append([]byte(nil), k...), parts[0]})
		return nil
	})
	if err != nil && !errors.Is(err, errStopScan) {
		return nil, false, err
	}
	return es, more, nil
}

var errStopScan = errors.New("stop scan")

// CustomersWithUsage returns, in key order, up to max customers that have
// usage recorded in the period starting at start, after the customer after
// ("" for the first); more reports that there may be others after the last
// one returned. It lets a stage emit every such customer's balance in
// bounded chunks with a cursor (docs/design.md, Exactly-once, 7).
func (l *Ledger) CustomersWithUsage(st Store, start int64, after string, max int) (customers []string, more bool, err error) {
	lo, hi := l.key(subPeriod, period8(start)), l.key(subPeriod, period8(start+1))
	if after != "" {
		// Just past after's key.
		lo = append(l.periodIndexKey(start, after), 0)
	}
	plen := len(l.key(subPeriod)) + 8
	err = st.Scan(lo, hi, func(k, _ []byte) error {
		if len(k) < plen {
			return fmt.Errorf("entitlements: state key %q: %w: bad period index key", k, ErrCorrupt)
		}
		parts, err := schemas.SplitFramed(k[plen:])
		if err != nil || len(parts) != 1 {
			return fmt.Errorf("entitlements: state key %q: %w: bad period index key", k, ErrCorrupt)
		}
		if len(customers) == max {
			more = true
			return errStopScan
		}
		customers = append(customers, parts[0])
		return nil
	})
	if err != nil && !errors.Is(err, errStopScan) {
		return nil, false, err
	}
	return customers, more, nil
}
