package stream

import (
	"cmp"
	"encoding/binary"
	"slices"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// The balancer's side of standby replicas (docs/operations.md, Standby
// replicas).
//
// A member advertises its warm copies in its join metadata: after the
// sticky userdata (kmsg.StickyMemberMetadata, always with its generation,
// so that its length is known), a section
//
//	"mlw1" | count (int32) | count × (partition number int32, checkpoint offset int64)
//
// listing every partition number of which its store holds state with a
// checkpoint (the changelog offset the state reflects) within the restore
// horizon (warmCopies), the ones it owns included. kmsg's sticky reader ignores bytes past the generation, so a
// member of an earlier version reads the claims and skips the section.
//
// The leader decides the standby assignment and carries it in each member's
// assignment userdata (kmsg.ConsumerMemberAssignment.UserData):
//
//	"mls1" | count (int32) | count × int32 standby numbers | count2 (int32) | count2 × int32 deferred numbers
//	       | count3 (int32) | count3 × int32 warm-up numbers
//	       | 3 (int32) | the leader's replicas, the standbys placed per number, the members (3 × int32)
//
// (a member of an earlier version reads the first two lists and ignores
// the rest: it keeps its warm-up copies as standbys without asking for a
// rebalance when they are caught up; a member that finds no placement
// section knows not how many copies the leader placed).
//
// It is carried rather than recomputed by each member because a member of
// the consumer protocol receives only its own assignment: nobody but the
// leader sees the whole plan.

const (
	warmMagic    = "mlw1"
	standbyMagic = "mls1"
	// DefaultAcceptableLag is how far (changelog offsets) a warm copy may
	// be behind the most advanced copy of its partition and still count as
	// caught up: a live owner's partition moves to a member only if that
	// member's copy is caught up, so a joining instance never takes a
	// partition whose state it would first have to restore in full. Kafka
	// Streams' acceptable.recovery.lag has the same default.
	DefaultAcceptableLag = 10_000
	// DefaultMaxWarmups is the most copies a plan has members make at
	// once, group-wide, beyond the standbys in place: deferred numbers
	// and warm-up copies (see StandbyOptions.MaxWarmups). Kafka Streams'
	// max.warmup.replicas has the same default.
	DefaultMaxWarmups = 2
)

// StandbyAssignment is what the leader assigned to this member besides its
// partitions.
type StandbyAssignment struct {
	// Owned are the partition numbers this member owns in the new
	// assignment.
	Owned []int32
	// Standby are the partition numbers this member keeps warm: it tails
	// their changelogs into its store. Never one it owns.
	Standby []int32
	// Deferred are partition numbers the balance would have given this
	// member, but which stayed with their live owner because this member's
	// copy is not caught up. They are among Standby; once they are caught
	// up, the member asks for a rebalance (kgo's ForceRebalance) to take
	// them.
	Deferred []int32
	// Warmup are partition numbers this member copies to take over a
	// standby copy from another member, which keeps its copy meanwhile:
	// they are among Standby, beyond the Replicas standbys of their
	// number. Once they (and the Deferred ones) are caught up, the member
	// asks for a rebalance, which moves the standby copy to it.
	Warmup []int32
	// Replicas is the leader's StandbyOptions.Replicas, Placed the standby
	// copies its plan gave each partition number (min(Replicas, Members−1),
	// warm-up copies aside) and Members the group's member count. Placed
	// is -1 when the leader did not say (a member of an earlier version);
	// a plan without standbys (the leader's Replicas is 0) places 0.
	Replicas, Placed, Members int
}

// StandbyOptions configure the standby side of CopartitionStandbyBalancer.
type StandbyOptions struct {
	// Replicas is the number of standby copies the leader assigns per
	// partition number, each on a member that does not own it (fewer when
	// the group has fewer other members). Zero: none, and partitions move
	// to restore balance even to members without a warm copy.
	Replicas int
	// Warm returns this member's warm copies: partition number → the
	// changelog offset its local state reflects. Called by kgo when the
	// member joins. Nil: none.
	Warm func() map[int32]int64
	// Assigned receives this member's standby assignment from each
	// successful sync, before the partitions' offsets are fetched. It runs
	// on kgo's group goroutine and must not block. Nil: ignored.
	Assigned func(StandbyAssignment)
	// AcceptableLag: see DefaultAcceptableLag (zero takes it).
	AcceptableLag int64
	// MaxWarmups bounds the copies one plan has members make, group-wide:
	// the deferred numbers count first (a member below its quota copies
	// each), and warm-up copies are assigned only while their sum is
	// below it; the other moves of standby copies wait for later plans.
	// Zero takes DefaultMaxWarmups.
	MaxWarmups int
}

// CopartitionStandbyBalancer is CopartitionBalancer with standby replicas:
// members advertise their warm copies, and partitions follow them.
//
//   - A number whose owner left goes to a member holding a warm copy of it,
//     the most caught-up one (highest checkpoint offset) first, among the
//     members below their quota; the numbers of a member that left are
//     placed together, so that as many as can go to caught-up copies (one
//     may go to a less advanced copy, leaving the room of the most
//     advanced to a number kept warm only there). With Replicas > 0,
//     when none of those has a caught-up copy but a member at its quota
//     does, that member takes it, one over its quota (at most one, and
//     only a member that gives no number up); the balance is then
//     restored as when a member joins: a
//     member left below its quota takes one of its numbers at once if its
//     copy of it is caught up, otherwise gets it deferred.
//   - With Replicas > 0, a number an owner over its quota gives up (a member
//     joined) moves only to a member whose copy is caught up (within
//     AcceptableLag of the most advanced copy); if no member below quota is,
//     its owner keeps it for now, over its quota, and the member that would
//     have taken it gets it as a deferred standby. It asks for a rebalance
//     once its copy is caught up, and then takes it. A joining instance
//     thus never takes a partition away from a warm owner to restore it
//     cold.
//   - Every number gets min(Replicas, members−1) standby members, never its
//     owner: its deferred taker first, then the members with the fewest
//     standbys of its owner's numbers (spread), then the members holding
//     a copy, the most advanced first, then the members with the fewest
//     standbys. A member without a copy does not displace one with a
//     copy: that one stays, and the other gets the number as an extra
//     warm-up standby (at most one per number), asks for a rebalance once
//     caught up, and then replaces it. Warm-up copies are assigned only
//     while the plan's deferred numbers and warm-ups number fewer than
//     MaxWarmups: the others stay with the member that has the copy.
//
// Every decision is deterministic in the members' metadata; the balance
// rules of CopartitionBalancer hold otherwise (with Replicas > 0, quotas
// may be exceeded while a deferred number waits for its copy, and an
// owner over its quota gives up first the numbers a member below its
// quota has a caught-up copy of).
func CopartitionStandbyBalancer(o StandbyOptions, topics ...string) kgo.GroupBalancer {
	b := CopartitionBalancer(topics...).(*copartitionBalancer)
	if o.AcceptableLag <= 0 {
		o.AcceptableLag = DefaultAcceptableLag
	}
	if o.Replicas < 0 {
		o.Replicas = 0
	}
	if o.MaxWarmups <= 0 {
		o.MaxWarmups = DefaultMaxWarmups
	}
	b.standby = o
	return b
}

// appendWarm appends the warm section to a member's userdata.
func appendWarm(dst []byte, warm map[int32]int64) []byte {
	ps := make([]int32, 0, len(warm))
	for p, off := range warm {
		if p >= 0 && off >= 0 {
			ps = append(ps, p)
		}
	}
	slices.Sort(ps) // deterministic: Kafka compares metadata on a rejoin
	dst = append(dst, warmMagic...)
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(ps)))
	for _, p := range ps {
		dst = binary.BigEndian.AppendUint32(dst, uint32(p))
		dst = binary.BigEndian.AppendUint64(dst, uint64(warm[p]))
	}
	return dst
}

// appendSticky encodes sticky userdata always with its generation (kmsg
// omits a generation of -1), so that what follows it can be found.
func appendSticky(dst []byte, sm *kmsg.StickyMemberMetadata) []byte {
	dst = sm.AppendTo(dst)
	if sm.Generation == -1 {
		dst = binary.BigEndian.AppendUint32(dst, ^uint32(0))
	}
	return dst
}

// parseWarm reads the warm section that follows the sticky userdata sm was
// read from: the warm copies with numbers in [0, n). Userdata is untrusted
// input: anything malformed is no warm copy, never an error.
func parseWarm(userdata []byte, sm *kmsg.StickyMemberMetadata, n int32) map[int32]int64 {
	rest := userdata[min(len(userdata), len(appendSticky(nil, sm))):]
	if len(rest) < 8 || string(rest[:4]) != warmMagic {
		return nil
	}
	count := binary.BigEndian.Uint32(rest[4:8])
	rest = rest[8:]
	if uint64(count)*12 != uint64(len(rest)) {
		return nil
	}
	out := make(map[int32]int64, count)
	for i := uint32(0); i < count; i++ {
		p := int32(binary.BigEndian.Uint32(rest[12*i:]))
		off := int64(binary.BigEndian.Uint64(rest[12*i+4:]))
		if p >= 0 && p < n && off >= 0 {
			out[p] = off
		}
	}
	return out
}

func appendInt32s(dst []byte, s []int32) []byte {
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(s)))
	for _, v := range s {
		dst = binary.BigEndian.AppendUint32(dst, uint32(v))
	}
	return dst
}

func readInt32s(src []byte) ([]int32, []byte, bool) {
	if len(src) < 4 {
		return nil, nil, false
	}
	n := binary.BigEndian.Uint32(src)
	src = src[4:]
	if uint64(n)*4 > uint64(len(src)) {
		return nil, nil, false
	}
	out := make([]int32, n)
	for i := range out {
		out[i] = int32(binary.BigEndian.Uint32(src[4*i:]))
	}
	return out, src[4*n:], true
}

func encodeStandby(a StandbyAssignment) []byte {
	dst := []byte(standbyMagic)
	dst = appendInt32s(dst, a.Standby)
	dst = appendInt32s(dst, a.Deferred)
	dst = appendInt32s(dst, a.Warmup)
	return appendInt32s(dst, []int32{int32(a.Replicas), int32(a.Placed), int32(a.Members)})
}

// parseStandby reads a member's standby assignment from its assignment
// userdata, dropping numbers that are negative or that the member owns.
// No userdata is a plan without standbys (Placed 0); userdata that is not
// a standby assignment, or has no placement section, leaves Placed -1.
func parseStandby(userdata []byte, owned []int32) StandbyAssignment {
	if len(userdata) == 0 {
		return StandbyAssignment{}
	}
	if len(userdata) < 4 || string(userdata[:4]) != standbyMagic {
		return StandbyAssignment{Placed: -1}
	}
	sb, rest, ok := readInt32s(userdata[4:])
	if !ok {
		return StandbyAssignment{Placed: -1}
	}
	def, rest, ok := readInt32s(rest)
	if !ok {
		def, rest = nil, nil
	}
	wu, rest, ok := readInt32s(rest)
	if !ok {
		wu, rest = nil, nil
	}
	placed := []int32{0, -1, 0}
	if pl, _, ok := readInt32s(rest); ok && len(pl) == 3 && pl[0] >= 0 && pl[1] >= 0 && pl[2] >= 0 {
		placed = pl
	}
	clean := func(s []int32) []int32 {
		s = slices.DeleteFunc(s, func(p int32) bool { return p < 0 || slices.Contains(owned, p) })
		slices.Sort(s)
		return slices.Compact(s)
	}
	a := StandbyAssignment{Standby: clean(sb), Deferred: clean(def), Warmup: clean(wu),
		Replicas: int(placed[0]), Placed: int(placed[1]), Members: int(placed[2])}
	a.Deferred = slices.DeleteFunc(a.Deferred, func(p int32) bool { return !slices.Contains(a.Standby, p) })
	a.Warmup = slices.DeleteFunc(a.Warmup, func(p int32) bool { return !slices.Contains(a.Standby, p) })
	return a
}

// standbyPlan is a balance plan with each member's standby assignment in
// its assignment userdata.
type standbyPlan struct {
	plan     *kgo.BalancePlan
	userdata map[string][]byte // member ID → assignment userdata
}

func (s *standbyPlan) IntoSyncAssignment() []kmsg.SyncGroupRequestGroupAssignment {
	out := s.plan.IntoSyncAssignment()
	for i := range out {
		ud, ok := s.userdata[out[i].MemberID]
		if !ok {
			continue
		}
		var a kmsg.ConsumerMemberAssignment
		if a.ReadFrom(out[i].MemberAssignment) != nil {
			continue // cannot happen: kgo just encoded it
		}
		a.UserData = ud
		out[i].MemberAssignment = a.AppendTo(nil)
	}
	return out
}

// warmInput is what the leader knows of one member beyond its claim.
type warmInput struct {
	warm map[int32]int64 // partition number → checkpoint offset
}

// warmPlan is the outcome of assignWarm.
type warmPlan struct {
	numbers  [][]int32 // owned numbers per member, sorted
	standby  [][]int32 // standby numbers per member, sorted
	deferred [][]int32 // deferred numbers per member, sorted (a subset of standby)
	warmup   [][]int32 // warm-up numbers per member, sorted (a subset of standby)
}

// assignWarm assigns the partition numbers [0, n) to the members (in kgo's
// order) and their standbys, by the rules of CopartitionStandbyBalancer.
// With no warm copies and replicas == 0, the owners are assigned so: in the
// order kgo sorted the members (instance ID, then member ID), each
// member's numbers sorted. A number claimed by several members belongs to
// the highest generation, the first member on a tie. The ⌈n/m⌉ quotas go
// to the members that keep the most (the first on a tie), which maximises
// the numbers kept; each member keeps its lowest claimed numbers up to its
// quota; the rest are dealt in ascending order to the members below quota,
// in member order. The result is deterministic.
func assignWarm(claims []memberClaim, warm []warmInput, n int32, replicas int, acceptableLag int64, maxWarmups int) warmPlan {
	m := len(claims)
	wb := &warmBalance{n: n, m: m, warm: warm, replicas: replicas, acceptableLag: acceptableLag, maxWarmups: maxWarmups,
		out: warmPlan{numbers: make([][]int32, m), standby: make([][]int32, m), deferred: make([][]int32, m), warmup: make([][]int32, m)}}
	if m == 0 || n <= 0 {
		return wb.out
	}
	wb.owners(claims)
	wb.quotas()
	wb.assign()
	if replicas > 0 && m >= 2 {
		wb.standbys()
	}
	return wb.out
}

// warmBalance is one run of assignWarm.
type warmBalance struct {
	n             int32
	m             int
	warm          []warmInput
	replicas      int
	acceptableLag int64
	maxWarmups    int // copies a plan has members make: deferred and warm-up ones

	owner      []int     // claimed owner of each number; -1: none
	owned      [][]int32 // each member's claimed numbers, ascending
	best       []int64   // the most advanced copy of each number; -1: none
	quota      []int
	deferredTo []int // the member a number was deferred to; -1: none
	out        warmPlan
}

// offset returns member i's copy of p: -1 for none.
func (wb *warmBalance) offset(i int, p int32) int64 {
	if i >= len(wb.warm) {
		return -1
	}
	if off, ok := wb.warm[i].warm[p]; ok {
		return off
	}
	return -1
}

func (wb *warmBalance) caughtUp(i int, p int32) bool {
	off := wb.offset(i, p)
	return off >= 0 && wb.best[p]-off <= wb.acceptableLag
}

// owners resolves the claims (the highest generation wins, the first
// member on a tie) and finds each number's most advanced copy.
func (wb *warmBalance) owners(claims []memberClaim) {
	n, m := wb.n, wb.m
	wb.owner = make([]int, n)
	ownerGen := make([]int32, n)
	for i := range wb.owner {
		wb.owner[i] = -1
	}
	for i, c := range claims {
		for _, p := range c.numbers {
			if wb.owner[p] == -1 || c.generation > ownerGen[p] {
				wb.owner[p], ownerGen[p] = i, c.generation
			}
		}
	}
	wb.owned = make([][]int32, m)
	for p, o := range wb.owner {
		if o >= 0 {
			wb.owned[o] = append(wb.owned[o], int32(p))
		}
	}
	wb.best = make([]int64, n)
	for p := range wb.best {
		wb.best[p] = -1
		for i := range m {
			wb.best[p] = max(wb.best[p], wb.offset(i, int32(p)))
		}
	}
}

// quotas gives each member ⌊n/m⌋ numbers, and the n mod m extra ones to the
// members that keep the most; on a tie, to those holding the most advanced
// copy of more orphaned numbers, so that they have room to take them.
func (wb *warmBalance) quotas() {
	n, m := wb.n, wb.m
	base, extra := int(n)/m, int(n)%m
	order := make([]int, m)
	for i := range order {
		order[i] = i
	}
	bestOrphans := make([]int, m)
	for p, o := range wb.owner {
		if o >= 0 || wb.best[p] < 0 {
			continue
		}
		for i := range m {
			if wb.offset(i, int32(p)) == wb.best[p] {
				bestOrphans[i]++
			}
		}
	}
	slices.SortStableFunc(order, func(a, b int) int {
		return cmp.Or(cmp.Compare(len(wb.owned[b]), len(wb.owned[a])), cmp.Compare(bestOrphans[b], bestOrphans[a]))
	})
	wb.quota = make([]int, m)
	for rank, i := range order {
		wb.quota[i] = base
		if rank < extra {
			wb.quota[i]++
		}
	}
}

// assign decides the owners: each member keeps its claimed numbers up to
// its quota (keep); the numbers whose owner left go to members with
// caught-up copies, below quota or, with standbys on, one over it
// (orphans); a number a live owner gives up goes to the member below
// quota with the most advanced caught-up copy (any copy without
// standbys), otherwise its owner keeps it, deferred; the rest is dealt in
// ascending order to the members below quota, in member order; a member
// one over its quota then gives a number back (giveBack).
func (wb *warmBalance) assign() {
	n, m, out := wb.n, wb.m, &wb.out
	// prev[p]: the live owner that gives p up (over its quota); -1 for a
	// number nobody alive owned.
	prev := make([]int, n)
	free := make([]bool, n)
	for p, o := range wb.owner {
		free[p] = o < 0
		prev[p] = -1
	}
	for i := range m {
		kept, given := wb.keep(i)
		out.numbers[i] = append(make([]int32, 0, wb.quota[i]+1), kept...)
		for _, p := range given {
			free[p], prev[p] = true, i
		}
	}
	wb.deferredTo = make([]int, n)
	for p := range wb.deferredTo {
		wb.deferredTo[p] = -1
	}
	var orphans []int32
	for p := range n {
		if free[p] && prev[p] < 0 {
			orphans = append(orphans, p)
		}
	}
	over := make([]bool, m) // took an orphan over its quota
	for _, p := range wb.orphans(orphans, over) {
		free[p] = false
	}
	var given []int32
	for p := range n {
		if free[p] && prev[p] >= 0 {
			given = append(given, p)
		}
	}
	for _, p := range wb.moves(given, prev) {
		free[p] = false
	}
	next := int32(0)
	for i := range m {
		for len(out.numbers[i]) < wb.quota[i] {
			for next < n && !free[next] {
				next++
			}
			if next >= n {
				break // numbers kept over quota for deferral
			}
			free[next] = false
			out.numbers[i] = append(out.numbers[i], next)
		}
	}
	wb.giveBack(over)
	for i := range m {
		slices.Sort(out.numbers[i])
	}
}

// keep returns the claimed numbers member i keeps and those it gives up:
// its lowest up to its quota; with standbys on, it gives up first the
// numbers a member claiming fewer than its quota has a caught-up copy of
// (the highest first), so that a member a deferred standby or a copy of
// its own made ready takes that one.
func (wb *warmBalance) keep(i int) (kept, given []int32) {
	owned, q := wb.owned[i], wb.quota[i]
	if len(owned) <= q {
		return owned, nil
	}
	if wb.replicas <= 0 {
		return owned[:q], owned[q:]
	}
	wanted := func(p int32) bool {
		for j := range wb.m {
			if j != i && len(wb.owned[j]) < wb.quota[j] && wb.caughtUp(j, p) {
				return true
			}
		}
		return false
	}
	give := make([]bool, len(owned))
	k := len(owned) - q
	for pass := range 2 {
		for x := len(owned) - 1; x >= 0 && k > 0; x-- {
			if !give[x] && (pass == 1 || wanted(owned[x])) {
				give[x] = true
				k--
			}
		}
	}
	for x, p := range owned {
		if give[x] {
			given = append(given, p)
		} else {
			kept = append(kept, p)
		}
	}
	return kept, given
}

// orphans places the numbers whose owner left (ps, ascending) and returns
// those placed. As many as can go to a member below quota with a
// caught-up copy (any copy without standbys) do, each to the most
// advanced such copy unless another number needs that member's room (a
// matching, by augmenting paths in ascending number order: a number taken
// in order by the first of two copies could take the room of a number
// kept warm only there, restored in full elsewhere). With standbys on, as
// many of the others as can then go to a member with a caught-up copy
// one over its quota (at most one each, and only a member that gives
// nothing up; over records it), the numbers placed before staying on
// caught-up copies. Each of the rest goes to the member below quota with
// the most advanced copy, if any; otherwise it is dealt.
func (wb *warmBalance) orphans(ps []int32, over []bool) []int32 {
	out := &wb.out
	room, extra := make([]int, wb.m), make([]int, wb.m)
	for i := range wb.m {
		room[i] = wb.quota[i] - len(out.numbers[i])
		if wb.replicas > 0 && len(wb.owned[i]) <= wb.quota[i] {
			extra[i] = room[i] + 1
		} else {
			extra[i] = room[i]
		}
	}
	takers := func(p int32) []int {
		var ts []int
		for i := range wb.m {
			if wb.offset(i, p) >= 0 && (wb.replicas <= 0 || wb.caughtUp(i, p)) {
				ts = append(ts, i)
			}
		}
		slices.SortStableFunc(ts, func(a, b int) int { return cmp.Compare(wb.offset(b, p), wb.offset(a, p)) })
		return ts
	}
	held := make([][]int32, wb.m)
	rest := match(ps, room, takers, held)
	if wb.replicas > 0 {
		rest = match(rest, extra, takers, held)
	}
	var placed []int32
	for i := range wb.m {
		over[i] = len(held[i]) > room[i]
		out.numbers[i] = append(out.numbers[i], held[i]...)
		placed = append(placed, held[i]...)
	}
	for _, p := range rest {
		cand := -1
		for i := range wb.m {
			if len(out.numbers[i]) >= wb.quota[i] || wb.offset(i, p) < 0 {
				continue
			}
			if cand < 0 || wb.offset(i, p) > wb.offset(cand, p) {
				cand = i
			}
		}
		if cand >= 0 {
			out.numbers[cand] = append(out.numbers[cand], p)
			placed = append(placed, p)
		}
	}
	return placed
}

// match places as many of the numbers ps as it can on their takers (in
// order of preference; member i holding at most capacity[i] numbers), in
// ascending number order by augmenting paths: a number goes to its first
// taker with room, or moves a number another taker holds on to another of
// that one's takers. held holds each member's numbers, the numbers
// already placed included (they stay placed, possibly on another of their
// takers); it returns the numbers not placed.
func match(ps []int32, capacity []int, takers func(int32) []int, held [][]int32) []int32 {
	var try func(p int32, seen []bool) bool
	try = func(p int32, seen []bool) bool {
		ts := takers(p)
		for _, i := range ts {
			if !seen[i] && len(held[i]) < capacity[i] {
				held[i] = append(held[i], p)
				return true
			}
		}
		for _, i := range ts {
			if seen[i] {
				continue
			}
			seen[i] = true
			for k, q := range held[i] {
				if try(q, seen) {
					held[i][k] = p
					return true
				}
			}
		}
		return false
	}
	var rest []int32
	for _, p := range ps {
		if !try(p, make([]bool, len(capacity))) {
			rest = append(rest, p)
		}
	}
	return rest
}

// moves places the numbers live owners give up (prev: the owner of
// each): as many as can go to a member below quota with a caught-up copy
// (any copy without standbys) do, each to the most advanced such copy
// unless another number needs that member's room (a matching, by
// augmenting paths in ascending number order); with standbys on, each of
// the others of which some member has a copy stays with its owner, and a
// member below quota (the first with room left) warms up for it
// (deferredTo). It returns the numbers placed; a number of which nobody
// has a copy, not even its owner, has nothing to restore and is dealt.
func (wb *warmBalance) moves(given []int32, prev []int) []int32 {
	out := &wb.out
	room := make([]int, wb.m)
	for i := range wb.m {
		room[i] = wb.quota[i] - len(out.numbers[i])
	}
	takers := func(p int32) []int {
		var ts []int
		for i := range wb.m {
			if room[i] <= 0 || i == prev[p] || wb.offset(i, p) < 0 || (wb.replicas > 0 && !wb.caughtUp(i, p)) {
				continue
			}
			ts = append(ts, i)
		}
		slices.SortStableFunc(ts, func(a, b int) int { return cmp.Compare(wb.offset(b, p), wb.offset(a, p)) })
		return ts
	}
	held := make([][]int32, wb.m)
	rest := match(given, room, takers, held)
	var placed []int32
	for i := range wb.m {
		out.numbers[i] = append(out.numbers[i], held[i]...)
		placed = append(placed, held[i]...)
		room[i] -= len(held[i])
	}
	for _, p := range rest {
		if wb.replicas <= 0 || wb.best[p] < 0 {
			continue
		}
		out.numbers[prev[p]] = append(out.numbers[prev[p]], p)
		placed = append(placed, p)
		for i := range wb.m {
			if room[i] > 0 && i != prev[p] {
				wb.deferredTo[p] = i
				room[i]--
				break
			}
		}
	}
	return placed
}

// giveBack restores the balance after orphan let members take a number
// over their quota. The target is what the next plan's quotas make of
// these holdings (the n mod m extra ones to the members holding the most,
// the first on a tie, as quotas does when no number is orphaned): each member over it gives numbers to the members
// below it, at once to a member with a caught-up copy (its highest such
// number), otherwise deferred: the first member below it warms up for
// the giver's highest number, and takes it once caught up (keep gives
// that one up first).
func (wb *warmBalance) giveBack(over []bool) {
	if !slices.Contains(over, true) {
		return
	}
	out := &wb.out
	for pass := range 2 {
		surplus, short := wb.nextQuotas()
		for x := range wb.m {
			for surplus[x] > 0 {
				q, y := wb.giveOne(x, short, pass == 1)
				if q < 0 {
					break
				}
				surplus[x]--
				short[y]--
				if pass == 0 {
					out.numbers[x] = slices.DeleteFunc(out.numbers[x], func(p int32) bool { return p == q })
					out.numbers[y] = append(out.numbers[y], q)
				} else {
					wb.deferredTo[q] = y
				}
			}
		}
	}
}

// nextQuotas returns how far each member's holding is over and under the
// quota the next plan would give it, less the numbers already deferred
// from and to it.
func (wb *warmBalance) nextQuotas() (surplus, short []int) {
	out := &wb.out
	base, extra := int(wb.n)/wb.m, int(wb.n)%wb.m
	order := make([]int, wb.m)
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int {
		return cmp.Compare(len(out.numbers[b]), len(out.numbers[a]))
	})
	surplus, short = make([]int, wb.m), make([]int, wb.m)
	for rank, i := range order {
		q := base
		if rank < extra {
			q++
		}
		surplus[i] = max(len(out.numbers[i])-q, 0)
		short[i] = max(q-len(out.numbers[i]), 0)
	}
	for p, d := range wb.deferredTo {
		if d >= 0 {
			short[d]--
			for i := range wb.m {
				if slices.Contains(out.numbers[i], int32(p)) {
					surplus[i]--
				}
			}
		}
	}
	return surplus, short
}

// giveOne picks a number of member x for a member y short of numbers: its
// highest number y has a caught-up copy of, or, when deferring, its
// highest number not deferred yet to the first member short; -1: none.
func (wb *warmBalance) giveOne(x int, short []int, deferring bool) (int32, int) {
	ps := slices.Sorted(slices.Values(wb.out.numbers[x]))
	for k := len(ps) - 1; k >= 0; k-- {
		if wb.deferredTo[ps[k]] >= 0 {
			continue
		}
		for y := range wb.m {
			if y != x && short[y] > 0 && (deferring || wb.caughtUp(y, ps[k])) {
				return ps[k], y
			}
		}
	}
	return -1, -1
}

// standbys gives each number min(replicas, m−1) standby members, never its
// owner: its deferred taker first, then the members holding the fewest
// standbys of that owner's numbers (so that when it leaves, its numbers
// have warm copies on several members, each with room under its new
// quota), then those with a copy of it (the most advanced first), then the
// fewest in all. A member without a copy that this choice prefers to a
// member with one (a copy would move: a full copy read) does not displace
// it yet: the member with the copy stays a standby, and the other warms up
// as an extra standby (warmup; at most one per number), asks for a
// rebalance once caught up, and then replaces it; only while the plan's
// deferred numbers and warm-ups are fewer than maxWarmups (warmupBudget).
func (wb *warmBalance) standbys() {
	n, m, out := wb.n, wb.m, &wb.out
	newOwner := make([]int, n)
	for i, ps := range out.numbers {
		for _, p := range ps {
			newOwner[p] = i
		}
	}
	r := min(wb.replicas, m-1)
	budget := wb.warmupBudget()
	load := make([]int, m)
	perOwner := make([][]int, m)
	for i := range perOwner {
		perOwner[i] = make([]int, m)
	}
	for p := range n {
		o := newOwner[p]
		chosen := make([]int, 0, r+1)
		taken := func(i int) bool { return i == o || slices.Contains(chosen, i) }
		if d := wb.deferredTo[p]; d >= 0 && !taken(d) {
			chosen = append(chosen, d)
			out.deferred[d] = append(out.deferred[d], p)
		}
		forced := len(chosen)
		cands := make([]int, 0, m)
		for i := range m {
			if !taken(i) {
				cands = append(cands, i)
			}
		}
		has := func(i int) int { return b2i(wb.offset(i, p) >= 0) }
		slices.SortStableFunc(cands, func(a, b int) int {
			return cmp.Or(cmp.Compare(perOwner[a][o], perOwner[b][o]), cmp.Compare(has(b), has(a)),
				cmp.Compare(wb.offset(b, p), wb.offset(a, p)), cmp.Compare(load[a], load[b]))
		})
		target := append(chosen, cands[:min(max(r-len(chosen), 0), len(cands))]...)
		for _, i := range target {
			load[i]++
			perOwner[i][o]++
		}
		// Copies the target would drop, the most advanced first.
		var kept []int
		for _, i := range cands {
			if !slices.Contains(target, i) && has(i) == 1 {
				kept = append(kept, i)
			}
		}
		slices.SortStableFunc(kept, func(a, b int) int { return cmp.Compare(wb.offset(b, p), wb.offset(a, p)) })
		standby := slices.Clone(target)
		warmup := -1
		for x := len(standby) - 1; x >= forced && len(kept) > 0; x-- {
			if has(standby[x]) == 1 {
				continue
			}
			if warmup < 0 && budget > 0 {
				warmup = standby[x]
				budget--
			}
			standby[x], kept = kept[0], kept[1:]
		}
		if warmup >= 0 {
			standby = append(standby, warmup)
			out.warmup[warmup] = append(out.warmup[warmup], p)
		}
		for _, i := range standby {
			out.standby[i] = append(out.standby[i], p)
		}
	}
}

// warmupBudget returns how many warm-up copies the plan may add: maxWarmups
// less the numbers deferred (each a copy a member makes, to take it).
func (wb *warmBalance) warmupBudget() int {
	budget := wb.maxWarmups
	for _, d := range wb.deferredTo {
		if d >= 0 {
			budget--
		}
	}
	return max(budget, 0)
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}
