package entitlements

import (
	"bytes"
	"slices"
	"sort"
)

// memStore is a Store in a map, the way the stage's transaction is one
// over Pebble. snapshot and restore stand for a commit point and an
// aborted transaction.
type memStore struct{ m map[string][]byte }

func newMemStore() *memStore { return &memStore{m: map[string][]byte{}} }

func (s *memStore) Get(k []byte) ([]byte, bool, error) {
	v, ok := s.m[string(k)]
	return v, ok, nil
}

func (s *memStore) Put(k, v []byte) { s.m[string(k)] = bytes.Clone(v) }
func (s *memStore) Delete(k []byte) { delete(s.m, string(k)) }

func (s *memStore) Scan(lo, hi []byte, fn func(k, v []byte) error) error {
	var keys []string
	for k := range s.m {
		if k >= string(lo) && (hi == nil || k < string(hi)) {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	for _, k := range keys {
		if err := fn([]byte(k), s.m[k]); err != nil {
			return err
		}
	}
	return nil
}

func (s *memStore) snapshot() map[string][]byte {
	c := make(map[string][]byte, len(s.m))
	for k, v := range s.m {
		c[k] = v
	}
	return c
}

func (s *memStore) restore(c map[string][]byte) { s.m = (&memStore{m: c}).snapshot() }

func (s *memStore) keys() int { return len(s.m) }

func (s *memStore) bytes() int {
	n := 0
	for k, v := range s.m {
		n += len(k) + len(v)
	}
	return n
}

// resolvingStore is a memStore that is a ResolveCache: what it keeps is
// dropped whole when a key the Ledger's Resolves reports is written, and
// at a restore.
type resolvingStore struct {
	*memStore
	l        *Ledger
	resolved map[string]*Resolved
}

func newResolvingStore(l *Ledger) *resolvingStore {
	return &resolvingStore{memStore: newMemStore(), l: l, resolved: map[string]*Resolved{}}
}

func (s *resolvingStore) Resolved(c string) (*Resolved, bool) { r, ok := s.resolved[c]; return r, ok }
func (s *resolvingStore) KeepResolved(c string, r *Resolved)  { s.resolved[c] = r }
func (s *resolvingStore) Put(k, v []byte)                     { s.wrote(k); s.memStore.Put(k, v) }
func (s *resolvingStore) Delete(k []byte)                     { s.wrote(k); s.memStore.Delete(k) }

func (s *resolvingStore) restore(c map[string][]byte) {
	clear(s.resolved)
	s.memStore.restore(c)
}

// wrote drops every Resolved kept when k is a key they come from.
func (s *resolvingStore) wrote(k []byte) {
	if s.l.Resolves(k) {
		clear(s.resolved)
	}
}

// cachedStore is a memStore with the Ledger's accounts and timelines kept
// decoded (AccountCache, TimelineCache), as the aggregator keeps them:
// changed in place, written to the store only at commit, dropped at an
// abort; and what the Ledger resolves for a customer (ResolveCache,
// resolvingStore), dropped at an abort too and whenever a timeline
// changes.
type cachedStore struct {
	*resolvingStore
	accounts map[string]*Account
	dirty    []string
	isDirty  map[string]bool
	// timelines, by key; dirtyTimelines: those changed since the last
	// commit, in order.
	timelines      map[string]*Timeline
	dirtyTimelines []string
}

func newCachedStore(l *Ledger) *cachedStore {
	return &cachedStore{resolvingStore: newResolvingStore(l), accounts: map[string]*Account{}, isDirty: map[string]bool{},
		timelines: map[string]*Timeline{}}
}

func (s *cachedStore) Timeline(k []byte) (*Timeline, bool) {
	t, ok := s.timelines[string(k)]
	return t, ok
}
func (s *cachedStore) KeepTimeline(k []byte, t *Timeline) { s.timelines[string(k)] = t }
func (s *cachedStore) ChangedTimeline(k []byte, t *Timeline) {
	clear(s.resolved)
	s.timelines[string(k)] = t
	if !slices.Contains(s.dirtyTimelines, string(k)) {
		s.dirtyTimelines = append(s.dirtyTimelines, string(k))
	}
}

func (s *cachedStore) Account(c string) (*Account, bool) { a, ok := s.accounts[c]; return a, ok }
func (s *cachedStore) KeepAccount(c string, a *Account)  { s.accounts[c] = a }
func (s *cachedStore) ChangedAccount(c string, a *Account) {
	s.accounts[c] = a
	if !s.isDirty[c] {
		s.isDirty[c] = true
		s.dirty = append(s.dirty, c)
	}
}

// commit writes the changed accounts (a transaction's Flush).
func (s *cachedStore) commit() {
	var buf []byte
	for _, c := range s.dirty {
		buf = s.l.WriteAccount(s.memStore, c, s.accounts[c], buf)
	}
	s.dirty, s.isDirty = nil, map[string]bool{}
	for _, k := range s.dirtyTimelines {
		s.l.WriteTimeline(s.memStore, []byte(k), s.timelines[k])
	}
	s.dirtyTimelines = nil
}

// abort drops every account kept (an aborted transaction).
func (s *cachedStore) abort() {
	s.accounts, s.dirty, s.isDirty = map[string]*Account{}, nil, map[string]bool{}
	s.timelines, s.dirtyTimelines = map[string]*Timeline{}, nil
	clear(s.resolved)
}
