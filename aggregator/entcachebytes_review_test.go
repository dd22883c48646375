package aggregator

import (
	"encoding/binary"
	"fmt"
	"testing"
)

// TestLedgerCachesBoundedInBytes: the ledger's caches were bounded by
// their count alone (50,000 values, 10,000 decoded), a few hundred bytes
// each for the records of a billing system; a producer's records make a
// customer's timeline up to 768 KiB, so that records of many customers
// on one partition could make them hold tens of gigabytes. They are
// bounded in bytes too, and start again empty past the bound.
func TestLedgerCachesBoundedInBytes(t *testing.T) {
	e := &entPart{cache: map[string]cachedValue{}, decoded: map[string]any{}}
	s := ledgerStore{e: e}
	const size = 512 << 10
	n := (max(maxLedgerCacheBytes, maxDecodedBytes/3) + size) / size * 5 / 4
	for i := range n {
		v := make([]byte, size)
		binary.BigEndian.PutUint64(v, uint64(i))
		s.keep(fmt.Appendf(nil, "k%d", i), cachedValue{v: v, ok: true})
		s.KeepDecoded(v, i)
	}
	cached := 0
	for k, c := range e.cache {
		cached += len(k) + len(c.v)
	}
	decoded := 0
	for k := range e.decoded {
		decoded += len(k)
	}
	if cached > maxLedgerCacheBytes || cached != e.cacheBytes {
		t.Errorf("the cache holds %d bytes (counted %d), the bound is %d", cached, e.cacheBytes, maxLedgerCacheBytes)
	}
	if decoded > maxDecodedBytes/3 {
		t.Errorf("decoded holds %d bytes of keys, the bound is %d with the values", decoded, maxDecodedBytes)
	}
	if len(e.cache) == 0 || len(e.decoded) == 0 {
		t.Errorf("the caches hold %d and %d values, want some", len(e.cache), len(e.decoded))
	}
	// A value written again is counted once.
	k := []byte("again")
	for range 3 {
		s.keep(k, cachedValue{v: make([]byte, 10), ok: true})
	}
	cached = 0
	for k, c := range e.cache {
		cached += len(k) + len(c.v)
	}
	if cached != e.cacheBytes {
		t.Errorf("the cache holds %d bytes, counted %d", cached, e.cacheBytes)
	}
}
