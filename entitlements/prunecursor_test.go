package entitlements

import (
	"fmt"
	"sort"
	"testing"
	"time"
)

// tombStore is a memStore that keeps a tombstone for every key it deletes,
// as Pebble does until a compaction drops it, and counts the tombstones
// each Scan walks past: those in its range below the last key it reached
// (all of them when it reaches the end).
type tombStore struct {
	*memStore
	dead   map[string]bool
	walked int
}

func newTombStore() *tombStore { return &tombStore{memStore: newMemStore(), dead: map[string]bool{}} }

func (s *tombStore) Put(k, v []byte) { delete(s.dead, string(k)); s.memStore.Put(k, v) }
func (s *tombStore) Delete(k []byte) { s.dead[string(k)] = true; s.memStore.Delete(k) }

func (s *tombStore) Scan(lo, hi []byte, fn func(k, v []byte) error) error {
	var reached []byte
	err := s.memStore.Scan(lo, hi, func(k, v []byte) error {
		reached = append(reached[:0], k...)
		return fn(k, v)
	})
	var dead []string
	for k := range s.dead {
		if k >= string(lo) && (hi == nil || k < string(hi)) {
			dead = append(dead, k)
		}
	}
	sort.Strings(dead)
	for _, k := range dead {
		if err == nil || k < string(reached) { // a scan stopped early ends at reached
			s.walked++
		}
	}
	return err
}

// TestPrunePeriodsAfterWalksNoTombstones: the periods of N customers below
// the cut, pruned in chunks with the cursor each chunk returns, walk none
// of the index keys the chunks before deleted (a store with tombstones
// would walk N²/2·chunk of them from the start of the index each time);
// every key below the cut goes, once, in chunks of at most chunk, the
// keys at and above it stay, and a cursor taken under one horizon goes on
// under a later one.
func TestPrunePeriodsAfterWalksNoTombstones(t *testing.T) {
	const n, chunk = 2000, 50
	day := int64(24 * time.Hour / time.Millisecond)
	l, err := New(Config{Prefix: []byte("e"), Period: dayBounds, Window: 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	st := newTombStore()
	d0 := 20 * day
	for i := range n {
		c := fmt.Sprintf("c%05d", i)
		// Days d0 and d0+1 are pruned; d0+2, the cut's, stays.
		for _, at := range []int64{d0 + 10, d0 + day + 10, d0 + 2*day + 10} {
			if i%2 == 1 && at == d0+10 {
				continue // half the customers have no usage on d0
			}
			if _, err := l.Decide(st, c, Event{Meter: "m", Aggregation: "SUM", Quantity: 1, EventTime: at, Arrival: at}); err != nil {
				t.Fatal(err)
			}
		}
	}
	// The earliest event time of a future event is horizon − W + 1: the
	// cut is d0+2 from horizon d0 + 3 days on.
	horizon := d0 + 3*day
	var after []byte
	calls, walked := 0, 0
	for more := true; more; calls++ {
		before := st.keys()
		st.walked = 0
		var last []byte
		if last, more, err = l.PrunePeriodsAfter(st, horizon, after, chunk); err != nil {
			t.Fatal(err)
		}
		walked += st.walked
		if st.keys() < before-chunk {
			t.Fatalf("call %d deleted %d keys, want at most %d", calls, before-st.keys(), chunk)
		}
		if more && last == nil {
			t.Fatalf("call %d: more without a cursor", calls)
		}
		after = last
		horizon += 1000 // the watermark moves on between chunks
		if calls > 2*n/chunk+2 {
			t.Fatal("no end")
		}
	}
	if walked > 0 {
		t.Errorf("pruning %d index keys in %d chunks of %d walked %d tombstones of earlier chunks, want none",
			n/2+n, calls, chunk, walked)
	}
	for _, d := range []int64{d0, d0 + day} {
		if cs, _, err := l.CustomersWithUsage(st, d, "", n); err != nil || len(cs) != 0 {
			t.Errorf("day %d: %d customers with usage left after the prune (%v), want none", d/day, len(cs), err)
		}
	}
	if cs, _, err := l.CustomersWithUsage(st, d0+2*day, "", 2*n); err != nil || len(cs) != n {
		t.Errorf("the cut's day: %d customers with usage, want %d (%v)", len(cs), n, err)
	}
	// Nothing left: a call with the last cursor, and one from the start.
	for _, a := range [][]byte{after, nil} {
		if last, more, err := l.PrunePeriodsAfter(st, horizon, a, chunk); err != nil || more || last != nil {
			t.Errorf("after the end (cursor %q): last %q, more %v, %v; want nothing", a, last, more, err)
		}
	}
}
