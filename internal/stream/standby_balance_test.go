package stream

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// standbySim plays a classic consumer group of members that each run
// CopartitionStandbyBalancer with their own warm copies, through the
// balancer's public interface (join metadata, plan, sync assignment), as
// groupSim does for the plain balancer.
type standbySim struct {
	topics   []string
	replicas int
	gen      int32
	last     map[string]map[string][]int32 // member => topic => partitions
	warm     map[string]map[int32]int64    // member => its warm copies
	assigned map[string]StandbyAssignment
}

func newStandbySim(replicas int, topics ...string) *standbySim {
	return &standbySim{topics: topics, replicas: replicas, last: map[string]map[string][]int32{},
		warm: map[string]map[int32]int64{}, assigned: map[string]StandbyAssignment{}}
}

func (g *standbySim) balancer(id string) kgo.GroupBalancer {
	return CopartitionStandbyBalancer(StandbyOptions{
		Replicas: g.replicas,
		Warm:     func() map[int32]int64 { return maps.Clone(g.warm[id]) },
		Assigned: func(a StandbyAssignment) { g.assigned[id] = a },
	}, g.topics...)
}

// rebalance returns each member's numbers; g.assigned holds the standbys.
func (g *standbySim) rebalance(t *testing.T, members []string, n int32) map[string][]int32 {
	t.Helper()
	counts := map[string]int32{}
	for _, tp := range g.topics {
		counts[tp] = n
	}
	g.assigned = map[string]StandbyAssignment{}
	got, err := syncRound(t, g.balancer, g.topics, members, g.last, g.gen, counts)
	if err != nil {
		t.Fatalf("balance: %v", err)
	}
	g.gen++
	g.last = got
	out := map[string][]int32{}
	for id, m := range got {
		out[id] = numbersOf(t, g.topics, m)
	}
	return out
}

// checkStandbys checks the standby rules: each number has min(replicas,
// m−1) distinct standby members, never its owner, and at most one more
// warming up; deferred ⊆ standby, warm-up ⊆ standby.
func (g *standbySim) checkStandbys(t *testing.T, owners map[string][]int32, n int32) {
	t.Helper()
	m := len(owners)
	want := min(g.replicas, m-1)
	per, warmups := make([]int, n), make([]int, n)
	for id, a := range g.assigned {
		for _, p := range a.Standby {
			if slices.Contains(owners[id], p) {
				t.Fatalf("member %s is standby of %d, which it owns", id, p)
			}
			per[p]++
		}
		for _, p := range a.Deferred {
			if !slices.Contains(a.Standby, p) {
				t.Fatalf("member %s: deferred %d is not among its standbys %v", id, p, a.Standby)
			}
		}
		for _, p := range a.Warmup {
			if !slices.Contains(a.Standby, p) {
				t.Fatalf("member %s: warm-up %d is not among its standbys %v", id, p, a.Standby)
			}
			warmups[p]++
		}
	}
	for p, c := range per {
		if c-warmups[p] != want || warmups[p] > 1 {
			t.Fatalf("number %d has %d standbys (%d warming up), want %d and at most one more (%v)", p, c, warmups[p], want, g.assigned)
		}
	}
}

// warmUp makes each member's warm copies what a running group has: its own
// numbers and its standbys, each at the changelog end (end[p]) minus a
// random lag for standbys.
func (g *standbySim) warmUp(rng *rand.Rand, owners map[string][]int32, end []int64, maxLag int64) {
	for id, ps := range owners {
		w := map[int32]int64{}
		for _, p := range ps {
			w[p] = end[p]
		}
		for _, p := range g.assigned[id].Standby {
			w[p] = max(end[p]-rng.Int64N(maxLag+1), 0)
		}
		g.warm[id] = w
	}
}

// TestStandbyBalancerProperty runs random groups with standbys through
// leaves and joins and checks the warm rules:
//   - co-partitioned, every number owned once, standbys as checkStandbys;
//   - a number whose owner left goes to a member holding a warm copy of it
//     whenever such a member has room under its quota, the most caught-up
//     of those;
//   - a live owner's number never moves to a member whose copy is not
//     caught up (a joiner takes nothing cold): it gets it deferred instead,
//     and once its copies are caught up the group is balanced again;
//   - warm-up copies end: a few rounds of catching up later, none is left.
func TestStandbyBalancerProperty(t *testing.T) {
	rng := rand.New(rand.NewPCG(16, 10))
	for iter := range 300 {
		replicas := 1 + rng.IntN(2)
		n := int32(1 + rng.IntN(24))
		g := newStandbySim(replicas, "a", "b")
		var members []string
		for i := range 2 + rng.IntN(4) {
			members = append(members, fmt.Sprintf("m%02d", i))
		}
		end := make([]int64, n)
		for p := range end {
			end[p] = 100_000 + rng.Int64N(1_000_000)
		}
		owners := g.rebalance(t, members, n)
		g.checkStandbys(t, owners, n)
		g.warmUp(rng, owners, end, 2*DefaultAcceptableLag)
		// Settle: a second round with warm copies everywhere.
		owners = g.rebalance(t, members, n)
		g.checkStandbys(t, owners, n)
		g.warmUp(rng, owners, end, 2*DefaultAcceptableLag)

		nextID := len(members)
		for step := range 12 {
			ctx := fmt.Sprintf("iter %d step %d (n=%d replicas=%d)", iter, step, n, replicas)
			before := owners
			warmBefore := map[string]map[int32]int64{}
			for id, w := range g.warm {
				warmBefore[id] = maps.Clone(w)
			}
			leave := len(members) > 1 && rng.IntN(2) == 0
			var gone, joined string
			if leave {
				i := rng.IntN(len(members))
				gone = members[i]
				members = slices.Delete(slices.Clone(members), i, i+1)
				delete(g.last, gone)
				delete(g.warm, gone)
			} else {
				joined = fmt.Sprintf("m%02d", nextID)
				nextID++
				members = append(slices.Clone(members), joined)
			}
			owners = g.rebalance(t, members, n)
			owner := map[int32]string{}
			counts := map[string]int{}
			for id, ps := range owners {
				counts[id] = len(ps)
				for _, p := range ps {
					if o, dup := owner[p]; dup {
						t.Fatalf("%s: number %d owned by %s and %s", ctx, p, o, id)
					}
					owner[p] = id
				}
			}
			if len(owner) != int(n) {
				t.Fatalf("%s: %d of %d numbers owned", ctx, len(owner), n)
			}
			g.checkStandbys(t, owners, n)
			floor := int(n) / len(members) // every member's quota is at least this

			for p := range n {
				newOwner := owner[p]
				var prev string
				for id, ps := range before {
					if slices.Contains(ps, p) {
						prev = id
					}
				}
				newOff, newWarm := warmBefore[newOwner][p]
				if prev == gone && leave {
					// Orphaned: the best warm copy below quota wins.
					bestOff, bestRoom := int64(-1), false
					for _, id := range members {
						off, ok := warmBefore[id][p]
						if !ok {
							continue
						}
						if counts[id] < floor || id == newOwner {
							bestRoom = true
							bestOff = max(bestOff, off)
						}
					}
					if bestRoom && (!newWarm || newOff < bestOff) {
						t.Fatalf("%s: orphaned %d went to %s (copy %v at %d), but a member with room had a copy at %d", ctx, p, newOwner, newWarm, newOff, bestOff)
					}
					continue
				}
				if newOwner == prev {
					continue
				}
				// Moved from a live owner: only to a caught-up copy.
				bestOff := int64(-1)
				for _, w := range warmBefore {
					if off, ok := w[p]; ok {
						bestOff = max(bestOff, off)
					}
				}
				if !newWarm || bestOff-newOff > DefaultAcceptableLag {
					t.Fatalf("%s: %d moved from live %s to %s whose copy (%v, %d) is not caught up to %d", ctx, p, prev, newOwner, newWarm, newOff, bestOff)
				}
			}
			if joined != "" {
				if len(owners[joined]) > 0 && len(warmBefore[joined]) == 0 {
					t.Fatalf("%s: cold joiner %s took %v", ctx, joined, owners[joined])
				}
			}
			// The running group warms up, and the members that were
			// deferred ask for a rebalance: afterwards it is balanced.
			g.warmUp(rng, owners, end, 0)
			owners = g.rebalance(t, members, n)
			g.checkStandbys(t, owners, n)
			lo, hi := int(n), 0
			for _, id := range members {
				lo, hi = min(lo, len(owners[id])), max(hi, len(owners[id]))
			}
			if hi-lo > 1 {
				t.Fatalf("%s: after warming up, not balanced: %v", ctx, owners)
			}
			for id, a := range g.assigned {
				if len(a.Deferred) > 0 {
					t.Fatalf("%s: after warming up, %s still has deferred %v", ctx, id, a.Deferred)
				}
			}
			// Warm-up copies catch up and take over their standbys: a
			// few rounds later, none is left.
			for round := 0; slices.ContainsFunc(slices.Collect(maps.Values(g.assigned)), func(a StandbyAssignment) bool { return len(a.Warmup) > 0 }); round++ {
				if round == int(n)*replicas {
					t.Fatalf("%s: warm-ups left after %d rounds: %v", ctx, round, g.assigned)
				}
				g.warmUp(rng, owners, end, 0)
				owners = g.rebalance(t, members, n)
				g.checkStandbys(t, owners, n)
			}
			g.warmUp(rng, owners, end, 2*DefaultAcceptableLag)
		}
	}
}

// TestStandbyBalancerFailover: three members with one standby each; when
// a member leaves, every number it owned goes to the member that kept it
// warm, and that member was its only standby.
func TestStandbyBalancerFailover(t *testing.T) {
	for _, n := range []int32{3, 6, 12, 24} {
		g := newStandbySim(1, "usage.deduped", "usage.entitlements")
		members := []string{"a", "b", "c"}
		owners := g.rebalance(t, members, n)
		end := make([]int64, n)
		for p := range end {
			end[p] = int64(1000 * (p + 1))
		}
		g.warmUp(rand.New(rand.NewPCG(1, 2)), owners, end, 0)
		owners = g.rebalance(t, members, n)
		standbyOf := map[int32]string{}
		for id, a := range g.assigned {
			for _, p := range a.Standby {
				standbyOf[p] = id
			}
		}
		g.warmUp(rand.New(rand.NewPCG(1, 2)), owners, end, 0)
		lost := owners["b"]
		after := g.rebalance(t, []string{"a", "c"}, n)
		for _, p := range lost {
			if !slices.Contains(after[standbyOf[p]], p) {
				t.Fatalf("n=%d: %d of the departed member went to %v, not to its standby %s (owners %v)", n, p, after, standbyOf[p], after)
			}
		}
	}
}

// TestStandbyBalancerColdJoin: a member joining a warm group takes nothing
// until its copies are caught up; it gets its share as deferred standbys.
func TestStandbyBalancerColdJoin(t *testing.T) {
	const n = 8
	g := newStandbySim(1, "in")
	owners := g.rebalance(t, []string{"a", "b"}, n)
	end := make([]int64, n)
	for p := range end {
		end[p] = 1_000_000
	}
	g.warmUp(rand.New(rand.NewPCG(3, 4)), owners, end, 0)
	owners = g.rebalance(t, []string{"a", "b", "c"}, n)
	if len(owners["c"]) != 0 {
		t.Fatalf("cold joiner took %v", owners["c"])
	}
	if d := g.assigned["c"].Deferred; len(d) != 2 {
		t.Fatalf("joiner's deferred numbers %v, want its share of 2 (quota 2 or 3 of 8)", d)
	}
	// Its copies catch up; it rejoins and takes them.
	deferred := g.assigned["c"].Deferred
	g.warmUp(rand.New(rand.NewPCG(3, 4)), owners, end, 0)
	owners = g.rebalance(t, []string{"a", "b", "c"}, n)
	if !slices.Equal(owners["c"], deferred) {
		t.Fatalf("after catching up the joiner owns %v, want its deferred %v", owners["c"], deferred)
	}
}

// TestStandbyUserdataHostile: malformed warm sections and standby
// userdata are ignored, never an error or a panic.
func TestStandbyUserdataHostile(t *testing.T) {
	sm := kmsg.NewStickyMemberMetadata()
	sm.Generation = -1
	good := appendWarm(appendSticky(nil, &sm), map[int32]int64{0: 5, 3: 7, -1: 4, 9: -2})
	var rd kmsg.StickyMemberMetadata
	if err := rd.ReadFrom(good); err != nil {
		t.Fatal(err)
	}
	if w := parseWarm(good, &rd, 4); len(w) != 2 || w[0] != 5 || w[3] != 7 {
		t.Fatalf("warm %v", w)
	}
	if w := parseWarm(good, &rd, 3); len(w) != 1 {
		t.Fatalf("out-of-range number kept: %v", w)
	}
	rng := rand.New(rand.NewPCG(5, 6))
	for range 2000 {
		b := slices.Clone(good)
		b = b[:rng.IntN(len(b)+1)]
		for range rng.IntN(3) {
			if len(b) > 0 {
				b[rng.IntN(len(b))] = byte(rng.Uint32())
			}
		}
		var sm kmsg.StickyMemberMetadata
		if sm.ReadFrom(b) == nil {
			_ = parseWarm(b, &sm, 8)
		}
		_, _ = parseClaimWarm(b, []string{"a"}, 8)
		a := parseStandby(append([]byte(standbyMagic), b...), []int32{1})
		if slices.Contains(a.Standby, 1) {
			t.Fatal("standby of an owned number")
		}
	}
	a := parseStandby(encodeStandby(StandbyAssignment{Standby: []int32{2, 1, 2, -3}, Deferred: []int32{2, 7}, Warmup: []int32{7, 2, 1}}), []int32{1})
	if !slices.Equal(a.Standby, []int32{2}) || !slices.Equal(a.Deferred, []int32{2}) || !slices.Equal(a.Warmup, []int32{2}) {
		t.Fatalf("parsed %+v", a)
	}
}

// TestStandbyBalancerMostCaughtUp: with two standbys per number, the
// departed member's number goes to the copy with the higher offset.
func TestStandbyBalancerMostCaughtUp(t *testing.T) {
	for _, ahead := range []string{"a", "c"} {
		g := newStandbySim(2, "in")
		owners := g.rebalance(t, []string{"a", "b", "c"}, 3)
		lost := owners["b"][0]
		g.warm = map[string]map[int32]int64{"a": {lost: 500}, "b": {}, "c": {lost: 500}}
		g.warm[ahead][lost] = 900
		for id, ps := range owners {
			for _, p := range ps {
				g.warm[id][p] = 1000
			}
		}
		delete(g.last, "b")
		after := g.rebalance(t, []string{"a", "c"}, 3)
		if !slices.Contains(after[ahead], lost) {
			t.Fatalf("%d went to %v, want the most caught-up copy on %s", lost, after, ahead)
		}
	}
}

// TestStandbyPlacedFewerThanAsked: two members asking for two standby
// copies each get one per partition; the assignment says so, and each
// member warns and exports asked against placed (docs/operations.md,
// Standby replicas).
func TestStandbyPlacedFewerThanAsked(t *testing.T) {
	g := newStandbySim(2, "in")
	g.rebalance(t, []string{"a", "b"}, 4)
	a := g.assigned["a"]
	if a.Replicas != 2 || a.Placed != 1 || a.Members != 2 {
		t.Fatalf("assignment says replicas %d, placed %d, members %d; want 2, 1, 2", a.Replicas, a.Placed, a.Members)
	}
	core, logs := observer.New(zap.WarnLevel)
	reg := prometheus.NewRegistry()
	rt := &Runtime{cfg: Config{StandbyReplicas: 2}, log: zap.New(core), parts: map[int32]*partState{}}
	rt.sb = &standbys{rt: rt, tails: map[int32]*tail{}, stopping: map[int32]*tail{}, m: newStandbyMetrics(reg, "aggregate")}
	a.Standby = nil // no tails: this runtime has no Kafka
	rt.sb.assigned(a)
	warned := logs.FilterMessageSnippet("fewer standby copies").All()
	if len(warned) != 1 || warned[0].ContextMap()["placed"] != int64(1) {
		t.Fatalf("warnings: %v, want one saying placed 1", logs.All())
	}
	if got := testutil.ToFloat64(rt.sb.m.asked); got != 2 {
		t.Fatalf("asked gauge %v, want 2", got)
	}
	if got := testutil.ToFloat64(rt.sb.m.placed.WithLabelValues()); got != 1 {
		t.Fatalf("placed gauge %v, want 1", got)
	}
	if asked, placed, members := rt.StandbyPlacement(); asked != 2 || placed != 1 || members != 2 {
		t.Fatalf("status page placement: asked %d, placed %d, members %d; want 2, 1, 2", asked, placed, members)
	}

	// Three members hold two copies: no warning.
	g.rebalance(t, []string{"a", "b", "c"}, 4)
	a = g.assigned["a"]
	a.Standby, a.Deferred, a.Warmup = nil, nil, nil
	rt.sb.assigned(a)
	if n := len(logs.FilterMessageSnippet("fewer standby copies").All()); n != 1 {
		t.Fatalf("%d warnings after an assignment that holds the copies, want still 1", n)
	}
	if got := testutil.ToFloat64(rt.sb.m.placed.WithLabelValues()); got != 2 {
		t.Fatalf("placed gauge %v, want 2", got)
	}
	// A leader that does not say: no placed gauge, no warning.
	rt.sb.assigned(parseStandby([]byte(standbyMagic+"\x00\x00\x00\x00"), nil))
	if n := testutil.CollectAndCount(rt.sb.m.placed); n != 0 || len(logs.FilterMessageSnippet("fewer standby copies").All()) != 1 {
		t.Fatalf("unknown placement: %d placed series, logs %v", n, logs.All())
	}
}

// TestStandbyPlacedFewerWarnsOnChange: the warning that the group places
// fewer standby copies than asked for is logged when the shortfall begins
// or changes, not again on a rebalance that leaves it as it was, nor on
// one that does not say what it placed; its end is logged once, and a new
// shortfall warns again. The gauges follow every assignment.
func TestStandbyPlacedFewerWarnsOnChange(t *testing.T) {
	core, logs := observer.New(zap.InfoLevel)
	rt := &Runtime{cfg: Config{StandbyReplicas: 3}, log: zap.New(core), parts: map[int32]*partState{}}
	rt.sb = &standbys{rt: rt, tails: map[int32]*tail{}, stopping: map[int32]*tail{}, m: newStandbyMetrics(prometheus.NewRegistry(), "dedup")}
	const fewer, enough = "fewer standby copies", "places the standby copies"
	steps := []struct {
		what                      string
		replicas, placed, members int
		warned, ended             int // lines logged so far
	}{
		{"two members", 3, 1, 2, 1, 0},
		{"the same two members again", 3, 1, 2, 1, 0},
		{"a rebalance that does not say", 3, -1, 2, 1, 0},
		{"the same two members after it", 3, 1, 2, 1, 0},
		{"a third member", 3, 2, 3, 2, 0},
		{"the same three again", 3, 2, 3, 2, 0},
		{"a leader asking for one, five members", 1, 1, 5, 3, 0},
		{"a sixth member under that leader", 1, 1, 6, 3, 0},
		{"four members, the copies asked for", 3, 3, 4, 3, 1},
		{"the same four again", 3, 3, 4, 3, 1},
		{"down to two members", 3, 1, 2, 4, 1},
	}
	for _, st := range steps {
		rt.sb.assigned(StandbyAssignment{Replicas: st.replicas, Placed: st.placed, Members: st.members})
		warned, ended := logs.FilterMessageSnippet(fewer).All(), logs.FilterMessageSnippet(enough).All()
		if len(warned) != st.warned || len(ended) != st.ended {
			t.Fatalf("after %s: %d shortfall warnings, %d lines saying it ended; want %d and %d (%v)",
				st.what, len(warned), len(ended), st.warned, st.ended, logs.All())
		}
		if st.placed < 0 {
			if n := testutil.CollectAndCount(rt.sb.m.placed); n != 0 {
				t.Fatalf("after %s: %d placed series, want none", st.what, n)
			}
			continue
		}
		if got := testutil.ToFloat64(rt.sb.m.placed.WithLabelValues()); got != float64(st.placed) {
			t.Fatalf("after %s: placed gauge %v, want %d", st.what, got, st.placed)
		}
		if asked, placed, members := rt.StandbyPlacement(); asked != 3 || placed != st.placed || members != st.members {
			t.Fatalf("after %s: status placement %d, %d, %d; want 3, %d, %d", st.what, asked, placed, members, st.placed, st.members)
		}
		if last := warned[len(warned)-1].ContextMap(); st.placed < 3 && (last["placed"] != int64(st.placed) || last["leader_standby_replicas"] != int64(st.replicas)) {
			t.Fatalf("after %s: the last warning says %v", st.what, last)
		}
	}
}

// TestStandbyBalancerChurnThenKill: members join and leave repeatedly,
// each keeping in its store the copies of every number it held (as the
// state cleanup does for --state-cleanup-delay): its own numbers at the
// changelog's end, its standbys a little behind, the others where it left
// them, caught up while their changelog stays quiet. Once the group has
// settled (balanced, nothing deferred, no warm-up left), each member in
// turn dies: every number it owned goes to a member with a copy of it.
// Placed in number order, a number with two caught-up copies could take
// the room of a number kept warm only on one of them, which then went
// cold to another member.
func TestStandbyBalancerChurnThenKill(t *testing.T) {
	for seed := range uint64(140) {
		rng := rand.New(rand.NewPCG(seed, 7))
		replicas, n := 1+rng.IntN(3), int32(1+rng.IntN(16))
		g := newStandbySim(replicas, "a")
		var members []string
		for i := range 1 + rng.IntN(4) {
			members = append(members, fmt.Sprintf("m%02d", i))
		}
		end := make([]int64, n)
		for p := range end {
			end[p] = 50_000 + rng.Int64N(100_000)
		}
		store := map[string]map[int32]int64{} // member → the copies in its store
		sync := func(owners map[string][]int32, maxLag int64) {
			for _, id := range members {
				if store[id] == nil {
					store[id] = map[int32]int64{}
				}
				for _, p := range owners[id] {
					store[id][p] = end[p]
				}
				for _, p := range g.assigned[id].Standby {
					store[id][p] = max(end[p]-rng.Int64N(maxLag+1), 0)
				}
				g.warm[id] = maps.Clone(store[id])
			}
		}
		owners := g.rebalance(t, members, n)
		next := len(members)
		for range 30 {
			for p := range end {
				end[p] += rng.Int64N(30_000)
			}
			sync(owners, 3*DefaultAcceptableLag)
			switch r := rng.IntN(3); {
			case r == 0 && len(members) > 1:
				i := rng.IntN(len(members))
				gone := members[i]
				members = slices.Delete(slices.Clone(members), i, i+1)
				delete(g.last, gone)
				delete(g.warm, gone)
				if rng.IntN(2) == 0 {
					delete(store, gone) // its state directory lost
				}
			case r == 1:
				id := fmt.Sprintf("m%02d", next)
				next++
				for old := range store {
					if !slices.Contains(members, old) && rng.IntN(2) == 0 {
						id = old // back, with its store
						break
					}
				}
				members = append(slices.Clone(members), id)
				g.warm[id] = maps.Clone(store[id])
			}
			owners = g.rebalance(t, members, n)
			g.checkStandbys(t, owners, n)
		}
		for round := 0; ; round++ {
			if round == 40 {
				t.Fatalf("seed %d: not settled after %d rounds: %v %v", seed, round, owners, g.assigned)
			}
			sync(owners, 0)
			owners = g.rebalance(t, members, n)
			g.checkStandbys(t, owners, n)
			lo, hi := int(n), 0
			for _, id := range members {
				lo, hi = min(lo, len(owners[id])), max(hi, len(owners[id]))
			}
			pending := false
			for _, a := range g.assigned {
				pending = pending || len(a.Deferred) > 0 || len(a.Warmup) > 0
			}
			if hi-lo <= 1 && !pending {
				break
			}
		}
		sync(owners, 0)
		for _, dead := range members {
			h := newStandbySim(replicas, "a")
			h.gen = g.gen
			var rest []string
			for _, id := range members {
				if id != dead {
					rest = append(rest, id)
					h.last[id], h.warm[id] = g.last[id], maps.Clone(g.warm[id])
				}
			}
			if len(rest) == 0 {
				continue
			}
			after := h.rebalance(t, rest, n)
			for id, ps := range after {
				for _, p := range ps {
					if _, warm := h.warm[id][p]; slices.Contains(owners[dead], p) && !warm {
						t.Errorf("seed %d (n=%d replicas=%d): %s died, and its %d went to %s, which has no copy of it (owners %v, standbys %v; after %v)",
							seed, n, replicas, dead, p, id, owners, g.assigned, after)
					}
				}
			}
		}
	}
}
