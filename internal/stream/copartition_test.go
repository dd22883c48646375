package stream

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/meterline/meterline/internal/testenv"
)

// groupSim plays the leader's side of a classic consumer group against the
// balancer through its public interface: each member's join metadata is
// written by JoinGroupMetadata from its last assignment, the plan goes
// through IntoSyncAssignment and each member parses its own share.
type groupSim struct {
	bals   map[string]kgo.GroupBalancer // each member's own (it remembers its last assignment)
	topics []string
	gen    int32
	last   map[string]map[string][]int32 // member => topic => partitions
}

func newGroupSim(topics ...string) *groupSim {
	return &groupSim{bals: map[string]kgo.GroupBalancer{}, topics: topics, last: map[string]map[string][]int32{}}
}

// bal returns member id's balancer.
func (g *groupSim) bal(id string) kgo.GroupBalancer {
	b, ok := g.bals[id]
	if !ok {
		b = CopartitionBalancer(g.topics...)
		g.bals[id] = b
	}
	return b
}

// rebalance balances members (any order) over topics with counts, and
// returns each member's assignment.
func (g *groupSim) rebalance(t *testing.T, members []string, counts map[string]int32) (map[string]map[string][]int32, error) {
	t.Helper()
	got, err := syncRound(t, g.bal, g.topics, members, g.last, g.gen, counts)
	if err != nil {
		return nil, err
	}
	g.gen++
	g.last = got
	return got, nil
}

// syncRound plays one round of a classic consumer group at generation gen
// through the balancers' public interface: each member's join metadata is
// written by its balancer (bal) from its last assignment, the leader (the
// first member by ID, as kgo sorts them) plans, the plan goes through
// IntoSyncAssignment and each member's balancer parses its own share. It
// returns each member's assignment, or the plan's error.
func syncRound(t *testing.T, bal func(id string) kgo.GroupBalancer, topics, members []string, last map[string]map[string][]int32, gen int32, counts map[string]int32) (map[string]map[string][]int32, error) {
	t.Helper()
	members = slices.Sorted(slices.Values(members))
	var join []kmsg.JoinGroupResponseMember
	for _, id := range members {
		m := kmsg.NewJoinGroupResponseMember()
		m.MemberID = id
		m.ProtocolMetadata = bal(id).JoinGroupMetadata(slices.Clone(topics), last[id], gen)
		join = append(join, m)
	}
	mb, interests, err := bal(members[0]).MemberBalancer(join)
	if err != nil {
		t.Fatalf("MemberBalancer: %v", err)
	}
	for _, tp := range topics {
		if _, ok := interests[tp]; !ok {
			t.Fatalf("interests %v lack %s", interests, tp)
		}
	}
	into, err := mb.(kgo.GroupMemberBalancerOrError).BalanceOrError(counts)
	if err != nil {
		return nil, err
	}
	got := map[string]map[string][]int32{}
	for _, a := range into.IntoSyncAssignment() {
		m, err := bal(a.MemberID).ParseSyncAssignment(a.MemberAssignment)
		if err != nil {
			t.Fatalf("ParseSyncAssignment for %s: %v", a.MemberID, err)
		}
		got[a.MemberID] = m
	}
	return got, nil
}

// numbersOf returns a member's partition numbers, checking that every topic
// carries the same ones (or that the member has none at all).
func numbersOf(t *testing.T, topics []string, a map[string][]int32) []int32 {
	t.Helper()
	if len(a) == 0 {
		return nil
	}
	want := slices.Sorted(slices.Values(a[topics[0]]))
	for _, tp := range topics {
		got, ok := a[tp]
		if !ok {
			t.Fatalf("assignment %v lacks topic %s", a, tp)
		}
		if got := slices.Sorted(slices.Values(got)); !slices.Equal(got, want) {
			t.Fatalf("not co-partitioned: %s%v, %s%v", topics[0], want, tp, got)
		}
	}
	if len(a) != len(topics) {
		t.Fatalf("assignment %v names topics outside %v", a, topics)
	}
	return want
}

// maxKept is the most numbers a balanced plan can leave with their owners:
// by brute force over which members get the ⌈n/m⌉ quotas.
func maxKept(owned []int, n int) int {
	m := len(owned)
	base, extra := n/m, n%m
	best := 0
	var rec func(i, left, sum int)
	rec = func(i, left, sum int) {
		if i == m {
			if left == 0 {
				best = max(best, sum)
			}
			return
		}
		rec(i+1, left, sum+min(owned[i], base))
		if left > 0 {
			rec(i+1, left-1, sum+min(owned[i], base+1))
		}
	}
	rec(0, extra, 0)
	return best
}

// TestCopartitionBalancerProperty runs random joins, leaves and partition
// count changes through the balancer: partition p of every topic always goes
// to one member, every partition is assigned once, counts differ by at most
// one, and the plan moves no more numbers than the best balanced plan.
func TestCopartitionBalancerProperty(t *testing.T) {
	seeds := 200
	if testing.Short() {
		seeds = 60
	}
	for seed := range seeds {
		rng := rand.New(rand.NewPCG(uint64(seed), 14))
		topics := []string{"usage.deduped", "usage.entitlements"}
		if seed%3 == 0 {
			topics = append(topics, "usage.third")
		}
		g := newGroupSim(topics...)
		n := int32(1 + rng.IntN(24))
		var members []string
		nextID := 0
		join := func() {
			members = append(members, fmt.Sprintf("m%03d", nextID))
			nextID++
		}
		join()
		for step := range 40 {
			prevOwner := map[int32]string{}
			prevCount := map[string]int{}
			for id, a := range g.last {
				for _, p := range numbersOf(t, topics, a) {
					prevOwner[p] = id
					prevCount[id]++
				}
			}
			wasBalanced := g.gen > 0 && balanced(prevCount, members)
			prevN := n
			var joined, left []string
			switch op := rng.IntN(10); {
			case op < 4 && len(members) < 12:
				join()
				joined = members[len(members)-1:]
			case op < 8 && len(members) > 1:
				i := rng.IntN(len(members))
				left = []string{members[i]}
				members = slices.Delete(members, i, i+1)
			case op < 9:
				n = max(1, n+int32(rng.IntN(9))-3) // grow or shrink, all topics together
			default: // a rebalance with no change must move nothing
			}
			counts := map[string]int32{}
			for _, tp := range topics {
				counts[tp] = n
			}
			got, err := g.rebalance(t, members, counts)
			if err != nil {
				t.Fatalf("seed %d step %d: %v", seed, step, err)
			}
			where := fmt.Sprintf("seed %d step %d (members %v, n %d, joined %v, left %v)", seed, step, members, n, joined, left)

			owner := map[int32]string{}
			counts2 := map[string]int{}
			for _, id := range members {
				for _, p := range numbersOf(t, topics, got[id]) {
					if o, dup := owner[p]; dup {
						t.Fatalf("%s: partition %d to %s and %s", where, p, o, id)
					}
					if p < 0 || p >= n {
						t.Fatalf("%s: partition %d out of range", where, p)
					}
					owner[p] = id
					counts2[id]++
				}
			}
			if len(owner) != int(n) {
				t.Fatalf("%s: %d of %d partitions assigned", where, len(owner), n)
			}
			if !balanced(counts2, members) {
				t.Fatalf("%s: unbalanced %v", where, counts2)
			}

			// Stickiness: the numbers kept by their previous owners
			// are the most a balanced plan can keep.
			var owned []int
			for _, id := range members {
				c := 0
				for p, o := range prevOwner {
					if o == id && p < n {
						c++
					}
				}
				owned = append(owned, c)
			}
			kept := 0
			for p, o := range owner {
				if prevOwner[p] == o {
					kept++
				}
			}
			if best := maxKept(owned, int(n)); kept != best {
				t.Fatalf("%s: kept %d numbers with their owners, a balanced plan keeps %d\nbefore %v\nafter %v", where, kept, best, prevOwner, owner)
			}
			if wasBalanced && n == prevN {
				for _, id := range members {
					before := numbersFor(prevOwner, id)
					after := numbersFor(owner, id)
					switch {
					case len(joined) > 0 && id != joined[0] && !isSubset(after, before):
						t.Fatalf("%s: %s gained %v -> %v on another member's join", where, id, before, after)
					case len(left) > 0 && !isSubset(before, after):
						t.Fatalf("%s: %s lost %v -> %v on another member's leave", where, id, before, after)
					case len(joined) == 0 && len(left) == 0 && !slices.Equal(before, after):
						t.Fatalf("%s: %s moved %v -> %v with no change", where, id, before, after)
					}
				}
			}
		}
	}
}

func balanced(counts map[string]int, members []string) bool {
	lo, hi := -1, 0
	for _, id := range members {
		c := counts[id]
		if lo < 0 || c < lo {
			lo = c
		}
		hi = max(hi, c)
	}
	return hi-lo <= 1
}

func numbersFor(owner map[int32]string, id string) []int32 {
	var ps []int32
	for p, o := range owner {
		if o == id {
			ps = append(ps, p)
		}
	}
	slices.Sort(ps)
	return ps
}

func isSubset(a, b []int32) bool {
	for _, p := range a {
		if !slices.Contains(b, p) {
			return false
		}
	}
	return true
}

// TestCopartitionBalancerStaleClaim: a member rejoining with an old
// generation's assignment does not take back numbers a newer generation
// holds.
func TestCopartitionBalancerStaleClaim(t *testing.T) {
	topics := []string{"a", "b"}
	bal := CopartitionBalancer(topics...)
	mk := func(id string, gen int32, ps ...int32) kmsg.JoinGroupResponseMember {
		m := kmsg.NewJoinGroupResponseMember()
		m.MemberID = id
		m.ProtocolMetadata = bal.JoinGroupMetadata(topics, map[string][]int32{"a": ps, "b": ps}, gen)
		return m
	}
	// m1 held 0-3 at generation 5; m0 still claims 0-1 from generation 3.
	// m0 is first in order, so a tie would go to it: only the generation
	// decides.
	members := []kmsg.JoinGroupResponseMember{mk("m0", 3, 0, 1), mk("m1", 5, 0, 1, 2, 3)}
	mb, _, err := bal.MemberBalancer(members)
	if err != nil {
		t.Fatal(err)
	}
	into, err := mb.(kgo.GroupMemberBalancerOrError).BalanceOrError(map[string]int32{"a": 4, "b": 4})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string][]int32{}
	for _, a := range into.IntoSyncAssignment() {
		m, err := bal.ParseSyncAssignment(a.MemberAssignment)
		if err != nil {
			t.Fatal(err)
		}
		got[a.MemberID] = numbersOf(t, topics, m)
	}
	// m1 keeps two of its four (its lowest), m0 gets the other two.
	if !slices.Equal(got["m1"], []int32{0, 1}) || !slices.Equal(got["m0"], []int32{2, 3}) {
		t.Fatalf("got %v, want m1 [0 1] (newest claim kept), m0 [2 3]", got)
	}
}

// TestCopartitionBalancerErrors: topics with different partition counts, a
// missing topic and members with different subscriptions fail the balance
// with an error naming them; an assignment that is not co-partitioned is
// refused by the member.
func TestCopartitionBalancerErrors(t *testing.T) {
	g := newGroupSim("usage.deduped", "usage.entitlements")
	_, err := g.rebalance(t, []string{"m0", "m1"}, map[string]int32{"usage.deduped": 8, "usage.entitlements": 4})
	var ce *CopartitionError
	if !errors.Is(err, ErrNotCopartitioned) || !errors.As(err, &ce) {
		t.Fatalf("mismatched counts: err %v, want a *CopartitionError", err)
	}
	if want := "usage.deduped has 8 partitions, usage.entitlements has 4 partitions"; !strings.Contains(err.Error(), want) {
		t.Fatalf("error %q does not name the topics and counts (%q)", err, want)
	}
	_, err = g.rebalance(t, []string{"m0"}, map[string]int32{"usage.deduped": 8})
	if !errors.Is(err, ErrNotCopartitioned) || !strings.Contains(err.Error(), "usage.entitlements has 0 partitions") {
		t.Fatalf("missing topic: err %v", err)
	}

	// Members subscribing to different topics.
	bal := CopartitionBalancer("a", "b")
	m0, m1 := kmsg.NewJoinGroupResponseMember(), kmsg.NewJoinGroupResponseMember()
	m0.MemberID, m0.ProtocolMetadata = "m0", bal.JoinGroupMetadata([]string{"a", "b"}, nil, -1)
	m1.MemberID, m1.ProtocolMetadata = "m1", bal.JoinGroupMetadata([]string{"a"}, nil, -1)
	mb, _, err := bal.MemberBalancer([]kmsg.JoinGroupResponseMember{m0, m1})
	if err != nil {
		t.Fatal(err)
	}
	_, err = mb.(kgo.GroupMemberBalancerOrError).BalanceOrError(map[string]int32{"a": 2, "b": 2})
	if !errors.Is(err, ErrNotCopartitioned) || !strings.Contains(err.Error(), "member m1 subscribes to [a]") {
		t.Fatalf("mixed subscriptions: err %v", err)
	}

	// A member refuses an assignment that splits partition numbers.
	var bad kmsg.ConsumerMemberAssignment
	for _, a := range []struct {
		topic string
		ps    []int32
	}{{"a", []int32{0, 1}}, {"b", []int32{0, 2}}} {
		at := kmsg.NewConsumerMemberAssignmentTopic()
		at.Topic, at.Partitions = a.topic, a.ps
		bad.Topics = append(bad.Topics, at)
	}
	if _, err := bal.ParseSyncAssignment(bad.AppendTo(nil)); !errors.Is(err, ErrNotCopartitioned) {
		t.Fatalf("split assignment parsed: err %v", err)
	}
	bad.Topics[0].Partitions = nil // a: none, b: [0 2]
	if _, err := bal.ParseSyncAssignment(bad.AppendTo(nil)); !errors.Is(err, ErrNotCopartitioned) {
		t.Fatalf("assignment with an empty first topic parsed: err %v", err)
	}
}

// killableDialer dials through net.Dialer until killed; then it closes every
// connection and refuses new ones, as a crashed process would stop talking.
type killableDialer struct {
	mu     sync.Mutex
	dead   bool
	conns  []net.Conn
	dialer net.Dialer
}

func (d *killableDialer) dial(ctx context.Context, network, host string) (net.Conn, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.dead {
		return nil, errors.New("killed")
	}
	c, err := d.dialer.DialContext(ctx, network, host)
	if err == nil {
		d.conns = append(d.conns, c)
	}
	return c, err
}

func (d *killableDialer) kill() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.dead = true
	for _, c := range d.conns {
		c.Close()
	}
}

// groupMember is one kgo client in TestCopartitionBalancerKFakeGroup.
type groupMember struct {
	cl     *kgo.Client
	dialer *killableDialer
	cancel context.CancelFunc
	done   chan struct{}

	mu       sync.Mutex
	assigned map[string][]int32
	seen     map[string]map[int32]bool // since the last assignment
	errs     []error
}

func (m *groupMember) state() (map[string][]int32, map[string]map[int32]bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	a := map[string][]int32{}
	for t, ps := range m.assigned {
		a[t] = slices.Sorted(slices.Values(ps))
	}
	s := map[string]map[int32]bool{}
	for t, ps := range m.seen {
		s[t] = map[int32]bool{}
		for p := range ps {
			s[t][p] = true
		}
	}
	return a, s
}

// TestCopartitionBalancerKFakeGroup runs three kgo clients with the balancer
// on kfake, consuming two seeded co-partitioned topics; kills one (its
// connections drop, as in a crash) and checks, before and after, that every
// client is assigned the same partition numbers of both topics, that the
// numbers cover every partition once, and that each client reads records of
// both topics for its numbers.
func TestCopartitionBalancerKFakeGroup(t *testing.T) {
	_, brokers := testenv.KFake(t, kfake.GroupMinSessionTimeout(100*time.Millisecond))
	const parts = 6
	topics := []string{testenv.Name(t, "deduped"), testenv.Name(t, "entitlements")}
	slices.Sort(topics)
	group := testenv.Name(t, "group")
	for _, tp := range topics {
		testenv.CreateTopic(t, brokers, tp, parts, nil)
	}
	prod, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	var recs []*kgo.Record
	for _, tp := range topics {
		for p := range int32(parts) {
			for i := range 3 {
				recs = append(recs, &kgo.Record{Topic: tp, Partition: p, Value: fmt.Appendf(nil, "%d-%d", p, i)})
			}
		}
	}
	if err := prod.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}

	start := func() *groupMember {
		m := &groupMember{dialer: &killableDialer{}, done: make(chan struct{})}
		cl, err := kgo.NewClient(
			kgo.SeedBrokers(brokers...),
			kgo.Dialer(m.dialer.dial),
			kgo.ConsumerGroup(group),
			kgo.ConsumeTopics(topics...),
			kgo.Balancers(CopartitionBalancer(topics...)),
			kgo.DisableAutoCommit(),
			kgo.SessionTimeout(time.Second),
			kgo.HeartbeatInterval(100*time.Millisecond),
			kgo.RebalanceTimeout(3*time.Second),
			kgo.RetryBackoffFn(func(int) time.Duration { return 50 * time.Millisecond }),
			kgo.OnPartitionsAssigned(func(_ context.Context, _ *kgo.Client, a map[string][]int32) {
				m.mu.Lock()
				defer m.mu.Unlock()
				m.assigned = a // eager: the whole assignment
				m.seen = map[string]map[int32]bool{}
			}),
			kgo.OnPartitionsRevoked(func(context.Context, *kgo.Client, map[string][]int32) {
				m.mu.Lock()
				defer m.mu.Unlock()
				m.assigned, m.seen = nil, nil
			}),
		)
		if err != nil {
			t.Fatal(err)
		}
		m.cl = cl
		ctx, cancel := context.WithCancel(context.Background())
		m.cancel = cancel
		go func() {
			defer close(m.done)
			for ctx.Err() == nil {
				fs := cl.PollFetches(ctx)
				m.mu.Lock()
				fs.EachError(func(_ string, _ int32, err error) {
					if !errors.Is(err, context.Canceled) {
						m.errs = append(m.errs, err)
					}
				})
				fs.EachRecord(func(r *kgo.Record) {
					if m.seen != nil {
						if m.seen[r.Topic] == nil {
							m.seen[r.Topic] = map[int32]bool{}
						}
						m.seen[r.Topic][r.Partition] = true
					}
				})
				m.mu.Unlock()
			}
		}()
		return m
	}
	members := []*groupMember{start(), start(), start()}
	defer func() {
		for _, m := range members {
			m.cancel()
			<-m.done
			m.cl.Close()
		}
	}()

	// settled waits until the live members hold every number once, each
	// the same numbers of both topics, with records of both topics read for
	// each of its numbers.
	settled := func(live []*groupMember, wantPerMember int) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		var last string
		for time.Now().Before(deadline) {
			last = ""
			owner := map[int32]int{}
			for i, m := range live {
				a, seen := m.state()
				if len(a) == 0 {
					last = fmt.Sprintf("member %d has no assignment", i)
					break
				}
				nums := numbersOf(t, topics, a) // fails the test on a split
				if len(nums) != wantPerMember {
					last = fmt.Sprintf("member %d has %v", i, nums)
					break
				}
				for _, p := range nums {
					if o, dup := owner[p]; dup {
						last = fmt.Sprintf("partition %d on members %d and %d", p, o, i)
					}
					owner[p] = i
					for _, tp := range topics {
						if !seen[tp][p] {
							last = fmt.Sprintf("member %d has not read %s/%d yet", i, tp, p)
						}
					}
				}
			}
			if last == "" && len(owner) == parts {
				for i, m := range live {
					a, _ := m.state()
					t.Logf("member %d: %v", i, a)
				}
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Fatalf("group did not settle: %s", last)
	}
	settled(members, parts/3)

	members[2].dialer.kill()
	settled(members[:2], parts/2)

	for i, m := range members[:2] {
		m.mu.Lock()
		for _, err := range m.errs {
			if errors.Is(err, ErrNotCopartitioned) {
				t.Errorf("member %d: %v", i, err)
			}
		}
		m.mu.Unlock()
	}
}

// TestCopartitionBalancerKFakeMismatch: on kfake, a group whose topics have
// different partition counts assigns nothing, and the poll reports the
// balancer's error naming the topics and counts.
func TestCopartitionBalancerKFakeMismatch(t *testing.T) {
	_, brokers := testenv.KFake(t)
	topics := []string{testenv.Name(t, "a"), testenv.Name(t, "b")}
	testenv.CreateTopic(t, brokers, topics[0], 4, nil)
	testenv.CreateTopic(t, brokers, topics[1], 3, nil)
	var mu sync.Mutex
	var assigned map[string][]int32
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(brokers...),
		kgo.ConsumerGroup(testenv.Name(t, "group")),
		kgo.ConsumeTopics(topics...),
		kgo.Balancers(CopartitionBalancer(topics...)),
		kgo.DisableAutoCommit(),
		kgo.RetryBackoffFn(func(int) time.Duration { return 50 * time.Millisecond }),
		kgo.OnPartitionsAssigned(func(_ context.Context, _ *kgo.Client, a map[string][]int32) {
			mu.Lock()
			defer mu.Unlock()
			assigned = a
		}),
	)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	want := fmt.Sprintf("%s has 4 partitions, %s has 3 partitions", topics[0], topics[1])
	for {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatal("no balance error reported")
		}
		var found error
		fs.EachError(func(_ string, _ int32, err error) {
			var ge *kgo.ErrGroupSession
			if errors.As(err, &ge) && strings.Contains(err.Error(), want) {
				found = err
			}
		})
		if found != nil {
			t.Logf("poll: %v", found)
			break
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(assigned) != 0 {
		t.Fatalf("assigned %v despite mismatched partition counts", assigned)
	}
}
