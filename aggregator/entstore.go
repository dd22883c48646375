package aggregator

import (
	"bytes"

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
	if s.l.IsAccount(k) {
		// Read once into accounts, written by flushAccounts straight to
		// the transaction: never in the cache, which would keep them
		// stale.
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
func decodedSize(v []byte) int { return 3 * len(v) }

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
}

// Resolved implements entitlements.ResolveCache.
func (s ledgerStore) Resolved(customer string) (*entitlements.Resolved, bool) {
	if h := s.e.held(customer); h != nil && h.res != nil && h.resGen == s.e.resolvedGen {
		return h.res, true
	}
	return nil, false
}

// KeepResolved implements entitlements.ResolveCache.
func (s ledgerStore) KeepResolved(customer string, r *entitlements.Resolved) {
	h := s.e.hold(customer)
	h.res, h.resGen = r, s.e.resolvedGen
}

// heldAccount is a customer's entry of entPart.accounts: its Account
// kept decoded (nil: not kept); dirty: the open transaction changed it,
// and it is listed in entPart.dirtyAccounts; res: what the Ledger
// resolved for it, if resGen is entPart.resolvedGen.
type heldAccount struct {
	a      *entitlements.Account
	dirty  bool
	res    *entitlements.Resolved
	resGen uint64
	chIdx  int
	chGen  uint64
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
		s.e.dirtyAccounts = append(s.e.dirtyAccounts, customer)
	}
}

// flushAccounts writes each account the open transaction changed to it,
// once, before its changelog is written (Flush).
func (pt *partition) flushAccounts(tx *stream.Tx) {
	e := pt.ent
	for _, c := range e.dirtyAccounts {
		h := e.accounts[c]
		e.accountBuf = pt.pr.ledger.WriteAccount(tx, c, h.a, e.accountBuf)
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
