package entitlements

import (
	"bytes"
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

func (s *memStore) bytes() int {
	n := 0
	for k, v := range s.m {
		n += len(k) + len(v)
	}
	return n
}
