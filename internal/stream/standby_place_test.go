package stream

import (
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
)

// placeMember is one member's join metadata in a placement table: the
// numbers it claims (generation 1) and its warm copies.
type placeMember struct {
	owns []int32
	warm map[int32]int64
}

// placeCase is member metadata → the leader's plan. A nil want list is
// not checked.
type placeCase struct {
	name     string
	n        int32
	replicas int
	members  []placeMember
	owns     [][]int32
	deferred [][]int32
	standby  [][]int32
	warmup   [][]int32
}

func (c placeCase) run(t *testing.T) warmPlan {
	t.Helper()
	claims := make([]memberClaim, len(c.members))
	warm := make([]warmInput, len(c.members))
	for i, m := range c.members {
		claims[i] = memberClaim{numbers: slices.Sorted(slices.Values(m.owns)), generation: 1}
		warm[i] = warmInput{warm: m.warm}
	}
	wp := assignWarm(claims, warm, c.n, c.replicas, DefaultAcceptableLag, DefaultMaxWarmups)
	check := func(what string, got, want [][]int32) {
		t.Helper()
		if want == nil {
			return
		}
		for i := range want {
			if !slices.Equal(got[i], want[i]) && (len(got[i]) > 0 || len(want[i]) > 0) {
				t.Fatalf("%s: %s %v, want %v (owns %v standby %v deferred %v)", c.name, what, got, want, wp.numbers, wp.standby, wp.deferred)
			}
		}
	}
	check("owns", wp.numbers, c.owns)
	check("deferred", wp.deferred, c.deferred)
	check("standby", wp.standby, c.standby)
	check("warmup", wp.warmup, c.warmup)
	return wp
}

// copies returns warm copies of ps, all at off.
func copies(off int64, ps ...int32) map[int32]int64 {
	w := map[int32]int64{}
	for _, p := range ps {
		w[p] = off
	}
	return w
}

// TestStandbyPlaceFailoverOverQuota: a number whose owner left goes to a
// member with a caught-up copy of it even when that member is at its
// quota (one over it at most, and only when it gives nothing up); the
// member left short gets a number of it as a deferred standby, or at once
// when it has a caught-up copy of one.
func TestStandbyPlaceFailoverOverQuota(t *testing.T) {
	for _, c := range []placeCase{{
		// The owner of 0 and 1 died; b kept both warm. 1 used to go to c,
		// which restored it in full.
		name: "both to the warm member, one over", n: 4, replicas: 1,
		members: []placeMember{
			{owns: []int32{2}, warm: copies(1000, 0, 1, 2)},
			{owns: []int32{3}, warm: copies(1000, 3)},
		},
		owns:     [][]int32{{0, 1, 2}, {3}},
		deferred: [][]int32{nil, {2}},
	}, {
		name: "the one over moves at once to a caught-up copy", n: 4, replicas: 1,
		members: []placeMember{
			{owns: []int32{2}, warm: copies(1000, 0, 1, 2)},
			{owns: []int32{3}, warm: map[int32]int64{2: 995, 3: 1000}},
		},
		owns:     [][]int32{{0, 1}, {2, 3}},
		deferred: [][]int32{nil, nil},
	}, {
		name: "a caught-up copy at quota before a stale one below it", n: 4, replicas: 1,
		members: []placeMember{
			{owns: []int32{2}, warm: copies(100_000, 0, 1, 2)},
			{owns: []int32{3}, warm: map[int32]int64{1: 50_000, 3: 100_000}},
		},
		owns:     [][]int32{{0, 1, 2}, {3}},
		deferred: [][]int32{nil, {2}},
	}, {
		name: "one over at most", n: 6, replicas: 1,
		members: []placeMember{
			{owns: []int32{3, 4, 5}, warm: copies(1000, 0, 1, 2, 3, 4, 5)},
			{},
		},
		owns:     [][]int32{{0, 3, 4, 5}, {1, 2}},
		deferred: [][]int32{nil, {5}},
	}, {
		name: "not by a member that gives numbers up", n: 4, replicas: 1,
		members: []placeMember{
			{owns: []int32{1, 2, 3}, warm: copies(1000, 0, 1, 2, 3)},
			{},
		},
		owns:     [][]int32{{1, 2, 3}, {0}},
		deferred: [][]int32{nil, {3}},
	}, {
		name: "without standbys, balance first", n: 4, replicas: 0,
		members: []placeMember{
			{owns: []int32{2}, warm: copies(1000, 0, 1, 2)},
			{owns: []int32{3}, warm: copies(1000, 3)},
		},
		owns: [][]int32{{0, 2}, {1, 3}},
	}} {
		t.Run(c.name, func(t *testing.T) { c.run(t) })
	}
}

// TestStandbyPlaceOrphansMatched: the numbers of a member that died go
// to members with caught-up copies of them whenever such a placement
// exists, also when the most advanced copy of one is on a member whose
// room another number needs. Here a owned 0 until a recent rebalance:
// its copy of 0, not held since, stays (--state-cleanup-delay) and is as
// advanced as b's standby copy on a quiet changelog. The dead member
// owned 0, 1 and 2; a keeps 1 and 2 warm, b keeps 0 warm. a has room for
// one, and may take one more over its quota: 0 goes to b, 1 and 2 to a.
// Taken in order, 0 went to a (the first of two equal copies), 1 to a
// over its quota, and 2, kept warm only on a, was restored in full on b.
func TestStandbyPlaceOrphansMatched(t *testing.T) {
	for _, c := range []placeCase{{
		name: "a stale copy does not take the room of the only warm one", n: 8, replicas: 1,
		members: []placeMember{
			{owns: []int32{3, 4, 5}, warm: copies(1000, 0, 1, 2, 3, 4, 5)},
			{owns: []int32{6, 7}, warm: copies(1000, 0, 6, 7)},
		},
		owns:     [][]int32{{1, 2, 3, 4, 5}, {0, 6, 7}},
		deferred: [][]int32{nil, {5}},
	}, {
		name: "within quota before over it", n: 8, replicas: 1,
		members: []placeMember{
			{owns: []int32{3, 4}, warm: map[int32]int64{0: 1000, 1: 1000, 2: 1000, 3: 1000, 4: 1000}},
			{owns: []int32{6, 7}, warm: map[int32]int64{0: 990, 6: 1000, 7: 1000}},
		},
		owns:     [][]int32{{1, 2, 3, 4}, {0, 5, 6, 7}},
		deferred: [][]int32{nil, nil},
	}, {
		name: "without standbys, every orphan to a copy with room", n: 6, replicas: 0,
		members: []placeMember{
			{owns: []int32{3, 4}, warm: copies(1000, 0, 1, 3, 4)},
			{owns: []int32{5}, warm: copies(1000, 0, 5)},
		},
		owns: [][]int32{{1, 3, 4}, {0, 2, 5}},
	}} {
		t.Run(c.name, func(t *testing.T) { c.run(t) })
	}
}

// TestStandbyPlaceOverQuotaSettles: after a member took a number over its
// quota, the member left short catches up on its deferred standby and
// the next plan is balanced, the number moving to it warm.
func TestStandbyPlaceOverQuotaSettles(t *testing.T) {
	c := placeCase{name: "settle", n: 4, replicas: 1,
		members: []placeMember{
			{owns: []int32{0, 1, 2}, warm: copies(1000, 0, 1, 2)},
			{owns: []int32{3}, warm: copies(1000, 2, 3)},
		},
		owns:     [][]int32{{0, 1}, {2, 3}},
		deferred: [][]int32{nil, nil},
	}
	c.run(t)
}

// TestStandbyPlaceKillOwnerOfTwo: 4 numbers, three members, one standby
// each, the third member joined a warm group: the member owning two
// numbers dies, and both return on members with a caught-up copy, one on
// each (their standbys were on different members).
func TestStandbyPlaceKillOwnerOfTwo(t *testing.T) {
	const n = 4
	end := make([]int64, n)
	for p := range end {
		end[p] = int64(100_000 * (p + 1))
	}
	rng := rand.New(rand.NewPCG(7, 8))
	g := newStandbySim(1, "usage.deduped", "usage.entitlements")
	owners := g.rebalance(t, []string{"a", "b"}, n)
	g.warmUp(rng, owners, end, 0)
	owners = g.rebalance(t, []string{"a", "b"}, n)
	g.warmUp(rng, owners, end, 0)
	all := []string{"a", "b", "c"}
	// c joins, catches up on its deferred and warm-up standbys, and asks
	// for a rebalance until it has none left.
	for round := 0; ; round++ {
		owners = g.rebalance(t, all, n)
		g.checkStandbys(t, owners, n)
		g.warmUp(rng, owners, end, 0)
		if len(g.assigned["c"].Deferred)+len(g.assigned["c"].Warmup) == 0 {
			break
		}
		if round > 3 {
			t.Fatalf("still warming up after %d rounds: %v", round, g.assigned)
		}
	}
	var victim string
	for _, id := range all {
		if len(owners[id]) == 2 {
			victim = id
		}
	}
	if victim == "" {
		t.Fatalf("nobody owns two numbers: %v", owners)
	}
	lost := owners[victim]
	warmBefore := map[string]map[int32]int64{}
	for id, w := range g.warm {
		warmBefore[id] = maps.Clone(w)
	}
	rest := slices.DeleteFunc(slices.Clone(all), func(id string) bool { return id == victim })
	delete(g.last, victim)
	delete(g.warm, victim)
	after := g.rebalance(t, rest, n)
	g.checkStandbys(t, after, n)
	for _, p := range lost {
		for _, id := range rest {
			if slices.Contains(after[id], p) {
				if off, ok := warmBefore[id][p]; !ok || end[p]-off > DefaultAcceptableLag {
					t.Fatalf("%d of the dead %s went to %s, whose copy is (%v, %d) of %d (owners before %v, after %v, standbys %v)", p, victim, id, ok, off, end[p], owners, after, g.assigned)
				}
			}
		}
	}
	for _, id := range rest {
		if len(after[id]) != 2 {
			t.Fatalf("not balanced after the death of %s: %v (before %v)", victim, after, owners)
		}
	}
}

// TestStandbyPlaceSpread: the standbys of one owner's numbers go to
// different members; a member without a copy that would take a standby
// from a member with one first warms up beside it, and takes it over once
// its copy is caught up.
func TestStandbyPlaceSpread(t *testing.T) {
	for _, c := range []placeCase{{
		// c joined and took 3; b keeps the copies of both of a's numbers.
		name: "a joiner warms up for one of two copies on one member", n: 4, replicas: 1,
		members: []placeMember{
			{owns: []int32{0, 1}, warm: copies(1000, 0, 1, 2)},
			{owns: []int32{2}, warm: copies(1000, 0, 1, 2, 3)},
			{owns: []int32{3}, warm: copies(1000, 3)},
		},
		owns:    [][]int32{{0, 1}, {2}, {3}},
		standby: [][]int32{{2}, {0, 1, 3}, {1}},
		warmup:  [][]int32{nil, nil, {1}},
	}, {
		name: "caught up, the copy moves", n: 4, replicas: 1,
		members: []placeMember{
			{owns: []int32{0, 1}, warm: copies(1000, 0, 1, 2)},
			{owns: []int32{2}, warm: copies(1000, 0, 1, 2, 3)},
			{owns: []int32{3}, warm: copies(1000, 1, 3)},
		},
		owns:    [][]int32{{0, 1}, {2}, {3}},
		standby: [][]int32{{2}, {0, 3}, {1}},
		warmup:  [][]int32{nil, nil, nil},
	}, {
		name: "between members with copies, spread first", n: 4, replicas: 1,
		members: []placeMember{
			{owns: []int32{0, 1}, warm: copies(1000, 0, 1, 2)},
			{owns: []int32{2}, warm: copies(1000, 0, 1, 2, 3)},
			{owns: []int32{3}, warm: map[int32]int64{1: 900, 3: 1000}},
		},
		standby: [][]int32{{2}, {0, 3}, {1}},
		warmup:  [][]int32{nil, nil, nil},
	}, {
		name: "a fresh group spreads without warm-ups", n: 4, replicas: 1,
		members: []placeMember{{}, {}, {}},
		owns:    [][]int32{{0, 1}, {2}, {3}},
		standby: [][]int32{{2, 3}, {0}, {1}},
		warmup:  [][]int32{nil, nil, nil},
	}} {
		t.Run(c.name, func(t *testing.T) { c.run(t) })
	}
}

// TestStandbyPlaceWarmupsBounded: a member joining a group whose copies
// all sit on the other members would warm up a copy of most numbers at
// once, each a full read of a changelog. The plan holds at most
// DefaultMaxWarmups copies being made group-wide, deferred numbers first:
// the other warm-ups come in later plans, as these end.
func TestStandbyPlaceWarmupsBounded(t *testing.T) {
	const n = 24
	all := make([]int32, n)
	for p := range all {
		all[p] = int32(p)
	}
	var members []placeMember
	for k := range 3 {
		// Its own numbers and the copies of the previous member's.
		prev := (k + 2) % 3
		members = append(members, placeMember{owns: all[8*k : 8*k+8], warm: copies(1000, slices.Concat(all[8*k:8*k+8], all[8*prev:8*prev+8])...)})
	}
	count := func(wp warmPlan) (deferred, warmups int) {
		for i := range wp.warmup {
			deferred += len(wp.deferred[i])
			warmups += len(wp.warmup[i])
		}
		return deferred, warmups
	}
	// Balanced, each owner's copies on one member: warm-ups only.
	c := placeCase{name: "spread", n: n, replicas: 1, members: members}
	if _, w := count(c.run(t)); w == 0 || w > DefaultMaxWarmups {
		t.Fatalf("%d warm-ups, want 1..%d", w, DefaultMaxWarmups)
	}
	// A cold joiner: its deferred numbers (a quota's worth) and no
	// warm-up beyond the bound.
	c = placeCase{name: "join", n: n, replicas: 1, members: append(slices.Clone(members), placeMember{})}
	wp := c.run(t)
	if d, w := count(wp); d != n/4 || w > max(DefaultMaxWarmups-d, 0) {
		t.Fatalf("%d deferred and %d warm-ups (%v), want %d and at most %d", d, w, wp.warmup, n/4, max(DefaultMaxWarmups-d, 0))
	}
}
