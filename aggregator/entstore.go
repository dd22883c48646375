package aggregator

import (
	"bytes"
	"sync/atomic"

	"github.com/meterline/meterline/entitlements"
	"github.com/meterline/meterline/internal/stream"
)

// cachedValue is a state value of the Ledger's, or its absence (!ok).
type cachedValue struct {
	v  []byte
	ok bool
}

// maxLedgerCache bounds the values a partition's ledger cache keeps
// (customers' timelines and counters: a few hundred bytes each), and
// maxLedgerCacheBytes their bytes (a producer's record may make a
// customer's timeline as large as entitlements.MaxVersionBytes); past
// either the cache starts again empty.
const (
	maxLedgerCache      = 50_000
	maxLedgerCacheBytes = 64 << 20
)

// ledgerStore is the entitlements.Store of the Ledger in tx: the state
// through the partition's cache, which spares the Ledger's reads of an
// event (plan, default plan, rate card) a Pebble lookup each, and its
// AccountCache (accounts), which holds the customers' usage, grants and
// overdraft decoded. Every write of the Ledger's keys goes through it,
// but the accounts' (flushAccounts).
type ledgerStore struct {
	tx *stream.Tx
	e  *entPart
	l  *entitlements.Ledger
}

// ledger returns the Ledger's store in tx: the partition's, so that
// passing it as an entitlements.Store allocates nothing.
func (pt *partition) ledger(tx *stream.Tx) *ledgerStore {
	s := &pt.ent.store
	if s.tx != tx || s.e != pt.ent || s.l != pt.pr.ledger {
		// Written only when it changes: twice an event otherwise.
		*s = ledgerStore{tx, pt.ent, pt.pr.ledger}
	}
	return s
}

func (s ledgerStore) Get(k []byte) ([]byte, bool, error) {
	if s.l.IsAccount(k) || s.l.IsTimeline(k) {
		// Read once into accounts or timelines, written by
		// flushAccounts and flushTimelines straight to the transaction:
		// never in the cache, which would keep them stale.
		return s.tx.Get(k)
	}
	if c, ok := s.e.cache[string(k)]; ok {
		return c.v, c.ok, nil
	}
	v, ok, err := s.tx.Get(k)
	if err != nil {
		return nil, false, err
	}
	s.keep(k, cachedValue{bytes.Clone(v), ok})
	return v, ok, nil
}

func (s ledgerStore) Put(k, v []byte) {
	s.wrote(k)
	s.tx.Put(k, v)
	s.keep(k, cachedValue{bytes.Clone(v), true})
}

func (s ledgerStore) Delete(k []byte) {
	s.wrote(k)
	s.tx.Delete(k)
	s.keep(k, cachedValue{})
}

func (s ledgerStore) Scan(lo, hi []byte, fn func(k, v []byte) error) error {
	return s.tx.Scan(lo, hi, fn)
}

// Decoded implements entitlements.DecodeCache.
func (s ledgerStore) Decoded(v []byte) (any, bool) {
	x, ok := s.e.decoded[string(v)]
	return x, ok
}

// KeepDecoded implements entitlements.DecodeCache.
func (s ledgerStore) KeepDecoded(v []byte, x any) {
	n := decodedSize(v)
	if len(s.e.decoded) >= maxDecoded || s.e.decodedBytes+n > maxDecodedBytes {
		clear(s.e.decoded)
		s.e.decodedBytes = 0
	}
	if _, ok := s.e.decoded[string(v)]; !ok {
		s.e.decodedBytes += n
	}
	s.e.decoded[string(v)] = x
}

// decodedSize is what a decoded value of the bytes v takes in decoded,
// about: its key, and the value decoded (strings and slice headers).
func decodedSize(v []byte) int { return decodedBytes(len(v)) }

// decodedBytes is decodedSize of a value of n bytes.
func decodedBytes(n int) int { return 3 * n }

// wrote drops every Resolved when k is a key they come from.
func (s ledgerStore) wrote(k []byte) {
	if s.l.Resolves(k) {
		s.e.dropResolved()
	}
}

// dropResolved drops every customer's Resolved.
func (e *entPart) dropResolved() { e.resolvedGen++ }

// held returns the customer's entry of accounts, or nil.
func (e *entPart) held(customer string) *heldAccount {
	if e.lastHeld != nil && customer == e.lastCustomer {
		return e.lastHeld
	}
	h := e.accounts[customer]
	if h != nil {
		e.lastCustomer, e.lastHeld = customer, h
	}
	return h
}

// heldGens hands out entPart.heldGen values, unique in the process: an
// entry linked under one (openAgg.held) is never taken for an entry of
// another entPart, a reloaded partition's included.
var heldGens atomic.Uint64

// newHeldGen starts a new generation of accounts' entries: every link to
// an entry (openAgg.held) made before is stale. Called whenever an entry
// leaves accounts (dropHeld, hold's sweep) and for a new entPart.
func (e *entPart) newHeldGen() { e.heldGen = heldGens.Add(1) }

// seedHeld makes a's link to its customer's entry of accounts, if not
// stale, the last one looked up (held), so that the decision of an event
// of a finds it with no map lookup. a (nil: none) is the OPEN aggregate of
// an event of customer.
func (e *entPart) seedHeld(customer string, a *openAgg) {
	if a != nil && a.held != nil && a.heldGen == e.heldGen {
		e.lastCustomer, e.lastHeld = customer, a.held
	}
}

// linkHeld links a, an OPEN aggregate of customer, to its entry of
// accounts, which the decision of its event looked up last (held). The
// link holds while no entry leaves accounts (heldGen).
func (e *entPart) linkHeld(a *openAgg, customer string) {
	if e.lastHeld != nil && (a.held != e.lastHeld || a.heldGen != e.heldGen) && e.lastCustomer == customer {
		// Written only when it changes: a pointer write per event
		// otherwise.
		a.held, a.heldGen = e.lastHeld, e.heldGen
	}
}

// hold returns the customer's entry of accounts, added if need be: past
// maxAccounts entries, the ones whose account the open transaction did
// not change are dropped first.
func (e *entPart) hold(customer string) *heldAccount {
	if h := e.held(customer); h != nil {
		return h
	}
	if n := len(e.accounts); n >= maxAccounts && n-len(e.dirtyAccounts) >= maxAccounts/4 {
		e.accountSweeps++
		for c, h := range e.accounts {
			if !h.dirty {
				delete(e.accounts, c)
			}
		}
		e.lastHeld = nil
		e.newHeldGen()
	}
	h := &heldAccount{}
	e.accounts[customer] = h
	e.lastCustomer, e.lastHeld = customer, h
	return h
}

// dropHeld drops every entry of accounts.
func (e *entPart) dropHeld() {
	clear(e.accounts)
	clear(e.dirtyAccounts)
	e.dirtyAccounts = e.dirtyAccounts[:0]
	e.lastCustomer, e.lastHeld = "", nil
	e.newHeldGen()
}

// Resolved implements entitlements.ResolveCache.
func (s ledgerStore) Resolved(customer string) (*entitlements.Resolved, bool) {
	if h := s.e.held(customer); h != nil && h.hasRes && h.resGen == s.e.resolvedGen {
		return &h.res, true
	}
	return nil, false
}

// KeepResolved implements entitlements.ResolveCache.
func (s ledgerStore) KeepResolved(customer string, r *entitlements.Resolved) {
	h := s.e.hold(customer)
	h.res, h.hasRes, h.resGen = *r, true, s.e.resolvedGen
}

// heldAccount is a customer's entry of entPart.accounts: its Account
// kept decoded (nil: not kept); dirty: the open transaction changed it,
// and it is listed in entPart.dirtyAccounts; res: what the Ledger
// resolved for it, if hasRes and resGen is entPart.resolvedGen, kept in
// the entry (a copy), which every decision of the customer reads anyway:
// one object less to reach an event.
type heldAccount struct {
	a      *entitlements.Account
	dirty  bool
	hasRes bool
	resGen uint64
	res    entitlements.Resolved
	chIdx  int
	chGen  uint64
}

// dirtyAccount is an entry of entPart.dirtyAccounts: a customer whose
// account the open transaction changed, and its entry of accounts, which
// stays there until Flush writes it (hold sweeps unchanged entries only;
// dropHeld drops dirtyAccounts too), so flushAccounts needs no lookup.
type dirtyAccount struct {
	customer string
	h        *heldAccount
}

// maxAccounts bounds the customers a partition keeps (accounts) with no
// account changed across transactions (a few hundred bytes each); past
// it the unchanged ones are dropped. Changed ones stay until Flush writes
// them, so a transaction that changes more than maxAccounts holds them
// all; the sweep waits until at least maxAccounts/4 of those kept are
// unchanged, and its cost is spread over the accounts kept since.
const maxAccounts = 50_000

// Account implements entitlements.AccountCache.
func (s ledgerStore) Account(customer string) (*entitlements.Account, bool) {
	if h := s.e.held(customer); h != nil && h.a != nil {
		return h.a, true
	}
	return nil, false
}

// KeepAccount implements entitlements.AccountCache.
func (s ledgerStore) KeepAccount(customer string, a *entitlements.Account) {
	s.e.hold(customer).a = a
}

// ChangedAccount implements entitlements.AccountCache.
func (s ledgerStore) ChangedAccount(customer string, a *entitlements.Account) {
	h := s.e.hold(customer)
	h.a = a
	if !h.dirty {
		h.dirty = true
		s.e.dirtyAccounts = append(s.e.dirtyAccounts, dirtyAccount{customer, h})
	}
}

// flushAccounts writes each account the open transaction changed to it,
// once, before its changelog is written (Flush).
func (pt *partition) flushAccounts(tx *stream.Tx) {
	e := pt.ent
	for _, d := range e.dirtyAccounts {
		h := d.h
		e.accountBuf = pt.pr.ledger.WriteAccount(tx, d.customer, h.a, e.accountBuf)
		h.dirty = false
	}
	clear(e.dirtyAccounts)
	e.dirtyAccounts = e.dirtyAccounts[:0]
}

// maxDecoded bounds the decoded values a partition keeps: the plans of
// the customers it sees most, the default plan, the rate card; and
// maxDecodedBytes what they take (decodedSize).
const (
	maxDecoded      = 10_000
	maxDecodedBytes = 64 << 20
)

func (s ledgerStore) keep(k []byte, c cachedValue) {
	n := len(k) + len(c.v)
	if len(s.e.cache) >= maxLedgerCache || s.e.cacheBytes+n > maxLedgerCacheBytes {
		s.e.clearCache()
		s.e.dropResolved()
	}
	if old, ok := s.e.cache[string(k)]; ok {
		s.e.cacheBytes -= len(k) + len(old.v)
	}
	s.e.cache[string(k)] = c
	s.e.cacheBytes += n
}

// clearCache drops every value of the cache.
func (e *entPart) clearCache() {
	clear(e.cache)
	e.cacheBytes = 0
}

// ledgerReader lets the Ledger read restored state (Open) through a
// stateReader; it never writes there.
type ledgerReader struct{ stateReader }

func (ledgerReader) Put(_, _ []byte) {}
func (ledgerReader) Delete(_ []byte) {}

// heldTimeline is an entry of entPart.timelines: a key's versions
// decoded, what they count in timelineBytes, and whether the open
// transaction changed them (listed in entPart.dirtyTimelines).
type heldTimeline struct {
	t     *entitlements.Timeline
	size  int
	dirty bool
}

// maxTimelines bounds the timelines a partition keeps (most of them a
// customer's without a record of its own: none), and maxTimelineBytes what
// they take (timelineSize), as maxLedgerCache and maxDecodedBytes bound
// the other caches; past either the changed ones are written to the
// transaction and every one is dropped.
const (
	maxTimelines     = 50_000
	maxTimelineBytes = 64 << 20
)

// timelineSize is what a timeline kept under the key k takes, about: its
// key, its entry, and its versions decoded (decodedBytes of their
// encoding).
func timelineSize(k string, t *entitlements.Timeline) int {
	return len(k) + 64 + decodedBytes(t.Size())
}

// Timeline implements entitlements.TimelineCache.
func (s ledgerStore) Timeline(k []byte) (*entitlements.Timeline, bool) {
	if h, ok := s.e.timelines[string(k)]; ok {
		return h.t, true
	}
	return nil, false
}

// KeepTimeline implements entitlements.TimelineCache.
func (s ledgerStore) KeepTimeline(k []byte, t *entitlements.Timeline) {
	s.holdTimeline(string(k), t)
}

// ChangedTimeline implements entitlements.TimelineCache. Every Resolved
// is dropped: it may hold t, which the Ledger changed in place.
func (s ledgerStore) ChangedTimeline(k []byte, t *entitlements.Timeline) {
	s.e.dropResolved()
	h := s.holdTimeline(string(k), t)
	if !h.dirty {
		h.dirty = true
		s.e.dirtyTimelines = append(s.e.dirtyTimelines, string(k))
	}
}

// holdTimeline keeps t for the key k, counted anew; past maxTimelines or
// maxTimelineBytes the timelines kept before are written if changed
// (spillTimelines) and dropped first.
func (s ledgerStore) holdTimeline(k string, t *entitlements.Timeline) *heldTimeline {
	e := s.e
	n := timelineSize(k, t)
	h := e.timelines[k]
	if h != nil {
		e.timelineBytes -= h.size
	}
	if e.timelineBytes+n > maxTimelineBytes || h == nil && len(e.timelines) >= maxTimelines {
		s.spillTimelines()
		h = nil
	}
	if h == nil {
		h = &heldTimeline{}
		e.timelines[k] = h
	}
	h.t, h.size = t, n
	e.timelineBytes += n
	return h
}

// spillTimelines writes each timeline the open transaction changed to it,
// and drops every timeline kept.
func (s ledgerStore) spillTimelines() {
	s.e.writeTimelines(s.tx, s.l)
	s.e.dropTimelines()
}

// flushTimelines writes each timeline the open transaction changed to it,
// once, before its changelog is written (Flush).
func (pt *partition) flushTimelines(tx *stream.Tx) {
	pt.ent.writeTimelines(tx, pt.pr.ledger)
}

// writeTimelines writes each timeline the open transaction changed to tx,
// and lists none as changed any more.
func (e *entPart) writeTimelines(tx *stream.Tx, l *entitlements.Ledger) {
	for _, k := range e.dirtyTimelines {
		if h := e.timelines[k]; h != nil && h.dirty {
			l.WriteTimeline(tx, []byte(k), h.t)
			h.dirty = false
		}
	}
	clear(e.dirtyTimelines)
	e.dirtyTimelines = e.dirtyTimelines[:0]
}

// dropTimelines drops every timeline kept, changed or not: an aborted
// transaction's, or once written (spillTimelines).
func (e *entPart) dropTimelines() {
	clear(e.timelines)
	clear(e.dirtyTimelines)
	e.dirtyTimelines = e.dirtyTimelines[:0]
	e.timelineBytes = 0
}
