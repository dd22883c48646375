package entitlements

import (
	"bytes"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/meterline/meterline/internal/testenv"
)

// TestTimelineCacheWritesTheSameState: a Ledger on a Store that keeps the
// timelines decoded (TimelineCache, as the aggregator does: changed in
// place, written at commit, dropped with an aborted transaction) leaves
// the state a Ledger on a plain Store leaves, byte for byte, at every
// commit, and decides the same events alike. The records are the property test's (genScenario),
// applied and pruned after as the aggregator does, in transactions that
// commit or abort at random points, with events decided in between; 30
// seeds, and METERLINE_PROPERTY_SEEDS more.
func TestTimelineCacheWritesTheSameState(t *testing.T) {
	for seed := uint64(1); seed <= uint64(30+testenv.PropertySeeds()); seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			sc := genScenario(seed)
			r := rand.New(rand.NewPCG(seed, 11))
			l, err := New(Config{Prefix: []byte("e"), Window: sc.window, Period: sc.period})
			if err != nil {
				t.Fatal(err)
			}
			plain, cached := newMemStore(), newCachedStore(l)
			committed := plain.snapshot()
			commit := func() {
				t.Helper()
				cached.commit()
				if !maps.EqualFunc(plain.m, cached.m, bytes.Equal) {
					for _, k := range slices.Sorted(maps.Keys(plain.m)) {
						if v, ok := cached.m[k]; !ok || !bytes.Equal(v, plain.m[k]) {
							t.Fatalf("key %q: %d bytes with the timelines kept (%v), %d without", k, len(v), ok, len(plain.m[k]))
						}
					}
					t.Fatalf("the timelines kept leave %d keys, %d without", len(cached.m), len(plain.m))
				}
				committed = plain.snapshot()
			}
			var wm int64
			ev := 0
			apply := func(pr propEntRecord) {
				t.Helper()
				rec, err := ParseRecord(pr.key, pr.value, pr.written)
				for _, st := range []Store{plain, cached} {
					if err != nil {
						must(t, l.Advance(st, pr.written))
						continue
					}
					if err := l.Apply(st, rec); err != nil {
						t.Fatalf("apply: %v", err)
					}
					switch {
					case rec.IsTick():
					case rec.Key.Reserved == "":
						must(t, l.PruneCustomer(st, rec.Key.Customer, wm-sc.window.Milliseconds()))
					default:
						must(t, l.PruneShared(st, wm-sc.window.Milliseconds()))
					}
				}
			}
			from, evFrom, wmFrom := 0, 0, wm // where the open transaction started
			for i := 0; i < len(sc.records); i++ {
				apply(sc.records[i])
				for ; ev < len(sc.events) && sc.events[ev].ev.Arrival < sc.records[i].written; ev++ {
					pe := sc.events[ev]
					a, err1 := l.Decide(plain, pe.customer, pe.ev)
					b, err2 := l.Decide(cached, pe.customer, pe.ev)
					if fmt.Sprint(err1) != fmt.Sprint(err2) || a.Outcome != b.Outcome || a.Cost != b.Cost || a.Detail != b.Detail {
						t.Fatalf("record %d, event %d: %v %+v with the timelines kept, %v %+v without", i, ev, err2, b, err1, a)
					}
					wm = max(wm, pe.ev.Arrival-sc.window.Milliseconds()/2)
				}
				switch r.IntN(8) {
				case 0:
					commit()
					from, evFrom, wmFrom = i+1, ev, wm
				case 1:
					// An aborted transaction: what it applied and
					// decided is gone, and is read again.
					cached.abort()
					plain.restore(committed)
					cached.restore(committed)
					i, ev, wm = from-1, evFrom, wmFrom
				}
			}
			commit()
		})
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
