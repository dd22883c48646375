package entitlements

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"time"

	"github.com/meterline/meterline/schemas"
)

// Store is the state a Ledger reads and writes: one partition's state of
// the aggregator (*stream.Tx has these methods), or a map in tests. Get
// sees the Store's own writes; Put copies v; Scan visits the live keys of
// [lo, hi) in order and fn must not write while it runs.
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

// Resolved is what Decide resolves for a customer (ResolveCache). Its
// values are never modified.
type Resolved struct {
	own, def *Timeline
	rates    *RateHistory
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
	r := &Resolved{own: own, def: def, rates: h}
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
	// before its arrival (DESIGN §3). It bounds what Prune keeps.
	// Default: DefaultWindow.
	Window time.Duration
	// Period returns the billing period [start, end) containing an epoch
	// ms time. Required.
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
	if c.Period == nil {
		errs = append(errs, errors.New("entitlements: period is required"))
	}
	return errors.Join(errs...)
}

// Ledger decides events against entitlements kept in a Store, one
// partition's worth (a customer's records and events share a partition).
// Its keys, after Config.Prefix (C is a customer key, schemas.CustomerKey;
// P a period start, 8 bytes big-endian so keys sort by period):
//
//	'T' C          the customer's Timeline
//	'D'            the default plan's Timeline
//	'R'            the RateHistory
//	'W'            the latest broker time read from the entitlements partition
//	'G' C          what each grant has paid for the customer (and its expiry)
//	'U' P C meter  the customer's accepted units of a meter (framed) in P
//	'O' P C        micro-credits the customer overdrew in P
//
// A Ledger holds no state of its own: every call reads and writes the
// Store, so the stage's transaction (its overlay, commit and abort) is the
// whole story. It is not safe for concurrent use on one Store.
type Ledger struct {
	cfg Config
	// The keys without a customer, built once.
	keyDefault, keyRates, keyReadTo []byte
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
	return l, nil
}

const (
	subTimeline = 'T'
	subDefault  = 'D'
	subRates    = 'R'
	subReadTo   = 'W'
	subGrants   = 'G'
	subUsage    = 'U'
	subOverdraw = 'O'
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

// customerKey returns the key sub C, and the keys of one customer's
// period: sub P C (and a framed meter), each in one allocation (Decide
// builds several keys an event).
func (l *Ledger) customerKey(sub byte, customer string) []byte {
	k := make([]byte, 0, len(l.cfg.Prefix)+1+framedLen(customer))
	return schemas.AppendFramed(append(append(k, l.cfg.Prefix...), sub), customer)
}

func (l *Ledger) periodKey(sub byte, start int64, customer string, meter ...string) []byte {
	n := len(l.cfg.Prefix) + 1 + 8 + framedLen(customer)
	for _, m := range meter {
		n += framedLen(m)
	}
	k := make([]byte, 0, n)
	k = binary.BigEndian.AppendUint64(append(append(k, l.cfg.Prefix...), sub), uint64(start))
	k = schemas.AppendFramed(k, customer)
	return schemas.AppendFramed(k, meter...)
}

// framedLen is the length of s framed (schemas.AppendFramed).
func framedLen(s string) int { return len(s) + len(strconv.Itoa(len(s))) + 1 }

func (l *Ledger) usageKey(start int64, customer, meter string) []byte {
	return l.periodKey(subUsage, start, customer, meter)
}

func (l *Ledger) overdrawKey(start int64, customer string) []byte {
	return l.periodKey(subOverdraw, start, customer)
}

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

func (l *Ledger) timeline(st Store, k []byte) (*Timeline, error) {
	t := &Timeline{}
	v, ok, err := st.Get(k)
	if err != nil || !ok {
		return t, err
	}
	if err := t.UnmarshalBinary(v); err != nil {
		return nil, fmt.Errorf("entitlements: state key %q: %w", k, err)
	}
	return t, nil
}

// readTimeline is timeline for a read only: through st's DecodeCache, if
// it has one. The Timeline must not be modified.
func (l *Ledger) readTimeline(st Store, k []byte) (*Timeline, error) {
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

func (l *Ledger) putTimeline(st Store, k []byte, t *Timeline) {
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
// An error wrapping ErrInvalid (ErrTooManyVersions) refuses the record
// and changes nothing else; any other error is the Store's, or corrupt
// state.
func (l *Ledger) Apply(st Store, r *Record) error {
	switch {
	case r.IsTick():
	case r.Key.Reserved == schemas.RateCardKey:
		h, err := l.rates(st)
		if err != nil {
			return err
		}
		card := r.RateCard
		if r.Tombstone {
			card = nil
		}
		if err := h.Set(r.Written, card); err != nil {
			return err
		}
		b, _ := h.MarshalBinary()
		st.Put(l.keyRates, b)
	default:
		k := l.keyDefault
		if r.Key.Reserved == "" {
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
		if err := t.Set(r.Written, from, r.Plan); err != nil {
			return fmt.Errorf("entitlements: %s: %w", describeKey(r.Key), err)
		}
		l.putTimeline(st, k, t)
		if r.Key.Reserved == "" && r.Plan != nil {
			// A grant that paid before keeps its balance at least as long
			// as this version can offer it.
			uses, err := l.grantUses(st, r.Key.Customer)
			if err != nil {
				return err
			}
			if raiseExpiries(uses, r.Plan) {
				l.putGrantUses(st, r.Key.Customer, uses)
			}
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

// grantUse is what one grant has paid for a customer, and the latest
// expiry (epoch ms, math.MaxInt64: never) the grant had in any version
// seen to offer it to the customer: PruneCustomer drops the entry once no
// future event's event_time can be before it.
type grantUse struct {
	id       string
	consumed int64
	expiry   int64
}

// maxGrantUses bounds the entries of one customer's grant state when it is
// decoded.
const maxGrantUses = 1 << 20

func (l *Ledger) grantUses(st Store, customer string) ([]grantUse, error) {
	k := l.customerKey(subGrants, customer)
	v, ok, err := st.Get(k)
	if err != nil || !ok {
		return nil, err
	}
	d := newDec("grants", v)
	n := d.count(maxGrantUses)
	out := make([]grantUse, 0, n)
	for i := 0; i < n && d.err == nil; i++ {
		g := grantUse{id: d.str(), consumed: d.int(), expiry: d.int()}
		if g.consumed < 0 || i > 0 && g.id <= out[i-1].id {
			d.fail("grants: bad entry")
		}
		out = append(out, g)
	}
	if err := d.end(); err != nil {
		return nil, fmt.Errorf("entitlements: state key %q: %w", k, err)
	}
	return out, nil
}

func (l *Ledger) putGrantUses(st Store, customer string, us []grantUse) {
	k := l.customerKey(subGrants, customer)
	if len(us) == 0 {
		st.Delete(k)
		return
	}
	e := newEnc(8 + 24*len(us))
	e.count(len(us))
	for _, u := range us {
		e.str(u.id)
		e.int(u.consumed)
		e.int(u.expiry)
	}
	st.Put(k, e.bytes())
}

// raiseExpiries raises the stored expiry of every entry whose grant p
// offers with a later one. It reports whether it changed an entry.
func raiseExpiries(us []grantUse, p *Plan) bool {
	changed := false
	for _, g := range p.Grants {
		i := sort.Search(len(us), func(i int) bool { return us[i].id >= g.ID })
		if i < len(us) && us[i].id == g.ID && expiry(g) > us[i].expiry {
			us[i].expiry, changed = expiry(g), true
		}
	}
	return changed
}

func consumedOf(us []grantUse, id string) int64 {
	i := sort.Search(len(us), func(i int) bool { return us[i].id >= id })
	if i < len(us) && us[i].id == id {
		return us[i].consumed
	}
	return 0
}

// Decide decides one event of a customer (the package function Decide on
// what the Store holds) and, when it is accepted, records its charge in
// the Store: the usage of its meter in its period, what each grant paid,
// the overdraft. A rejected event changes nothing. The error is the
// Store's, or corrupt state, never the event's: a bad event is a
// Decision with Outcome Invalid.
func (l *Ledger) Decide(st Store, customer string, ev Event) (Decision, error) {
	res, err := l.resolve(st, customer)
	if err != nil {
		return Decision{}, err
	}
	plan := planAt(res.own, res.def, ev.Arrival)
	rate, hasRate := res.rates.Rate(ev.Arrival, ev.EventTime, ev.Meter)
	start, _ := l.cfg.Period(ev.EventTime)
	// Only what the decision can depend on is read (Decide reads the
	// usage of SUM and COUNT meters only, the overdraft under a policy
	// that allows it only, and what grants paid only for an event that
	// costs something): the same decision, fewer reads.
	var uk, ok []byte
	var usage, overdrawn int64
	if Charged(ev.Aggregation) {
		uk = l.usageKey(start, customer, ev.Meter)
		if usage, err = l.getInt(st, uk); err != nil {
			return Decision{}, err
		}
	}
	if p := plan; p == nil || p.Overdraft.Policy == schemas.OverdraftAllow {
		ok = l.overdrawKey(start, customer)
		if overdrawn, err = l.getInt(st, ok); err != nil {
			return Decision{}, err
		}
	}
	var uses []grantUse
	var usesErr error
	usesRead := false
	consumed := func(id string) int64 {
		if !usesRead {
			usesRead = true
			uses, usesErr = l.grantUses(st, customer)
		}
		return consumedOf(uses, id)
	}
	d := Decide(Input{Plan: plan, Rate: rate, HasRate: hasRate, Event: ev, Usage: usage, Overdrawn: overdrawn, Consumed: consumed})
	if usesErr != nil {
		return Decision{}, usesErr
	}
	d.Plan = plan
	if d.Outcome != Accepted {
		return d, nil
	}
	if d.Units > 0 {
		l.putInt(st, uk, usage+d.Units)
	}
	if d.Overdraft > 0 {
		l.putInt(st, ok, overdrawn+d.Overdraft)
	}
	if len(d.Draws) > 0 {
		for _, dr := range d.Draws {
			i := sort.Search(len(uses), func(i int) bool { return uses[i].id >= dr.Grant })
			if i < len(uses) && uses[i].id == dr.Grant {
				uses[i].consumed += dr.Amount // ≤ the grant's amount: no overflow
				continue
			}
			uses = append(uses, grantUse{})
			copy(uses[i+1:], uses[i:])
			uses[i] = grantUse{id: dr.Grant, consumed: dr.Amount, expiry: math.MinInt64}
		}
		raiseExpiries(uses, plan)
		l.putGrantUses(st, customer, uses)
	}
	return d, nil
}

// Balance returns a customer's balance as of broker time at (the
// stage's watermark): the plan in effect at at, usage against each of its
// caps in the period containing at, each of its grants not yet expired at
// at with what it has paid, and the overdraft of the period. revision is
// the stage's (larger for every later balance of the customer).
func (l *Ledger) Balance(st Store, customer string, at, revision int64) (*schemas.Balance, error) {
	var plan *Plan
	if _, cached := st.(ResolveCache); cached {
		res, err := l.resolve(st, customer)
		if err != nil {
			return nil, err
		}
		plan = planAt(res.own, res.def, at)
	} else if p, err := l.PlanAt(st, customer, at); err != nil {
		return nil, err
	} else {
		plan = p
	}
	if plan == nil {
		plan = noPlan
	}
	start, end := l.cfg.Period(at)
	b := &schemas.Balance{CustomerID: customer, Plan: plan.Name, Unmetered: plan.Unmetered, Revision: revision, UpdatedAt: at,
		PeriodStart: start, PeriodEnd: end, Meters: []schemas.MeterBalance{}, Grants: []schemas.GrantBalance{},
		OverdraftPolicy: plan.Overdraft.Policy, OverdraftLimit: plan.Overdraft.Limit}
	for _, c := range plan.Caps {
		u, err := l.getInt(st, l.usageKey(start, customer, c.Meter))
		if err != nil {
			return nil, err
		}
		b.Meters = append(b.Meters, schemas.MeterBalance{Meter: c.Meter, Usage: u, Limit: c.Limit, OnLimit: c.OnLimit})
	}
	uses, err := l.grantUses(st, customer)
	if err != nil {
		return nil, err
	}
	for _, g := range plan.Grants {
		if expiry(g) <= at {
			continue
		}
		used := consumedOf(uses, g.ID)
		b.Grants = append(b.Grants, schemas.GrantBalance{ID: g.ID, Priority: g.Priority, EffectiveFrom: g.EffectiveFrom,
			ExpiresAt: g.ExpiresAt, Amount: g.Amount, Consumed: used, Remaining: max(0, g.Amount-used)})
	}
	sort.Slice(b.Grants, func(i, j int) bool { return b.Grants[i].ID < b.Grants[j].ID })
	if b.Overdrawn, err = l.getInt(st, l.overdrawKey(start, customer)); err != nil {
		return nil, err
	}
	return b, nil
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

// PruneShared drops the versions of the default plan and the rate cards no
// future event can be decided or priced by, given that every future event
// arrives at or after horizon (for the aggregator: its watermark, less
// what a re-routed event's arrival may lag).
func (l *Ledger) PruneShared(st Store, horizon int64) error {
	k := l.keyDefault
	t, err := l.timeline(st, k)
	if err != nil {
		return err
	}
	if n := t.Len(); n > 0 {
		t.Prune(horizon)
		if t.Len() != n {
			l.putTimeline(st, k, t)
		}
	}
	h, err := l.rates(st)
	if err != nil {
		return err
	}
	if n := h.Len(); n > 0 {
		h.Prune(l.eventTimeHorizon(horizon))
		if h.Len() != n {
			b, _ := h.MarshalBinary()
			st.Put(l.keyRates, b)
		}
	}
	return nil
}

// PruneCustomer drops what no future event of the customer can need, given
// that every future event arrives at or after horizon: timeline versions
// (Timeline.Prune), and what a grant paid once the latest expiry it had in
// any version seen to offer it (the customer's, the default plan's) is not
// after horizon − W, so that no future event's event_time is in its
// window. A grant id offered again after that is a new grant. Keys left
// empty are deleted.
func (l *Ledger) PruneCustomer(st Store, customer string, horizon int64) error {
	tk := l.customerKey(subTimeline, customer)
	t, err := l.timeline(st, tk)
	if err != nil {
		return err
	}
	if n := t.Len(); n > 0 {
		t.Prune(horizon)
		if t.Len() != n {
			l.putTimeline(st, tk, t)
		}
	}
	uses, err := l.grantUses(st, customer)
	if err != nil || len(uses) == 0 {
		return err
	}
	d, err := l.timeline(st, l.keyDefault)
	if err != nil {
		return err
	}
	changed := false
	for _, tl := range []*Timeline{t, d} {
		for _, v := range tl.Versions() {
			if v.Plan != nil && raiseExpiries(uses, v.Plan) {
				changed = true
			}
		}
	}
	etMin := l.eventTimeHorizon(horizon)
	kept := uses[:0]
	for _, u := range uses {
		if u.expiry > etMin {
			kept = append(kept, u)
		}
	}
	if changed || len(kept) != len(uses) {
		l.putGrantUses(st, customer, kept)
	}
	return nil
}

// PrunePeriods deletes, at most max keys at a time (DESIGN §6 invariant
// 9), the usage and overdraft of periods no future event can belong to,
// given that every future event arrives at or after horizon. more reports
// that keys are left: call it again in a later transaction.
func (l *Ledger) PrunePeriods(st Store, horizon int64, max int) (more bool, err error) {
	cut, _ := l.cfg.Period(l.eventTimeHorizon(horizon))
	var doomed [][]byte
	for _, sub := range []byte{subUsage, subOverdraw} {
		lo, hi := l.key(sub), l.key(sub, period8(cut))
		err := st.Scan(lo, hi, func(k, _ []byte) error {
			if len(doomed) == max {
				more = true
				return errStopScan
			}
			doomed = append(doomed, append([]byte(nil), k...))
			return nil
		})
		if err != nil && !errors.Is(err, errStopScan) {
			return false, err
		}
		if more {
			break
		}
	}
	for _, k := range doomed {
		st.Delete(k)
	}
	return more, nil
}

var errStopScan = errors.New("stop scan")

// CustomersWithUsage returns, in key order, up to max customers that have
// usage recorded in the period starting at start, after the customer
// after ("" for the first); more reports that there may be others after
// the last one returned. It lets a stage emit every such customer's
// balance in bounded chunks with a cursor (DESIGN §6 invariant 9).
func (l *Ledger) CustomersWithUsage(st Store, start int64, after string, max int) (customers []string, more bool, err error) {
	lo, hi := l.key(subUsage, period8(start)), l.key(subUsage, period8(start+1))
	if after != "" {
		// Past every key of after: its framed key, then a byte above any
		// meter's framing (a framed part starts with a digit).
		lo = append(l.key(subUsage, period8(start), schemas.CustomerKey(after)), 0xff)
	}
	plen := len(l.key(subUsage, period8(start)))
	err = st.Scan(lo, hi, func(k, _ []byte) error {
		parts, err := schemas.SplitFramed(k[plen:])
		if err != nil || len(parts) != 2 {
			return fmt.Errorf("entitlements: state key %q: %w: bad usage key", k, ErrCorrupt)
		}
		if n := len(customers); n > 0 && customers[n-1] == parts[0] {
			return nil
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
