package stream

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// CopartitionProtocol is the group protocol name of CopartitionBalancer. A
// group whose members offer only this protocol can never be balanced by
// kgo's range or sticky balancers, which do not co-partition.
const CopartitionProtocol = "meterline-copartition-v1"

// ErrNotCopartitioned is returned (wrapped, from the group leader's balance,
// and so from the leader's poll in a kgo.ErrGroupSession) when the group's
// topics cannot be assigned by partition number: they have different
// partition counts, one has no partition in the leader's metadata, or the
// members do not all subscribe to the same co-partitioned topics. The group
// then gets no assignment at all, rather than a wrong one.
var ErrNotCopartitioned = errors.New("topics are not co-partitioned")

// CopartitionError reports topics whose partition counts differ (a count of
// 0 means the topic had no partitions in the leader's metadata: it does not
// exist, or its metadata has not loaded).
type CopartitionError struct {
	Topics     []string // sorted
	Partitions []int32  // Partitions[i] is the count of Topics[i]
}

func (e *CopartitionError) Error() string {
	var sb strings.Builder
	sb.WriteString("stream: copartition balancer: ")
	sb.WriteString(ErrNotCopartitioned.Error())
	sb.WriteString(": ")
	for i, t := range e.Topics {
		if i > 0 {
			sb.WriteString(", ")
		}
		fmt.Fprintf(&sb, "%s has %d partitions", t, e.Partitions[i])
	}
	sb.WriteString(" (co-partitioned topics must have the same partition count; add partitions to all of them together)")
	return sb.String()
}

func (e *CopartitionError) Unwrap() error { return ErrNotCopartitioned }

// CopartitionBalancer returns a group balancer that assigns co-partitioned
// topics by partition number: each member gets a set of numbers and, for
// each number p, partition p of every topic, so that one member reads the
// same keys from all of them (docs/design.md, Exactly-once, "Co-partitioned
// inputs": partition p of usage.deduped and of usage.entitlements in the
// same transactions). kgo's range, round-robin and sticky balancers place
// each topic's partitions independently and do not guarantee this.
//
// topics is the co-partitioned set. Every member must subscribe to exactly
// these topics, and all of them must have the same partition count; if not,
// the balance fails with ErrNotCopartitioned naming the members or the
// topics and counts, and nobody is assigned anything (kgo retries the join
// after its backoff). With no topics, the set is whatever the members
// subscribe to, and every member must subscribe to the same set. A member
// also refuses an assignment that is not co-partitioned, should a leader
// speaking the same protocol name send one.
//
// Balance: each member gets ⌊n/m⌋ or ⌈n/m⌉ numbers (n partitions per topic,
// m members). Stickiness: each member's join metadata carries the partitions
// it was last assigned and that generation (the userdata kgo's sticky
// balancer writes, kmsg.StickyMemberMetadata); a number claimed by two
// members goes to the higher generation. The balancer keeps the most
// previously-owned numbers a balanced plan can keep: the ⌈n/m⌉ quotas go to
// the members that owned the most, each member keeps its owned numbers up to
// its quota (the lowest ones), and only the rest moves. A member that joins
// a balanced group therefore takes only the numbers it needs, and a member
// that leaves moves only its own numbers.
//
// The balancer is eager: every member revokes all of its partitions before
// each rebalance. Cooperative rebalancing (KIP-429) would keep a number on
// its owner until a second round only if kgo's per-(topic, partition)
// AdjustCooperative made the same decision for partition p of every topic;
// it does when every member's owned partitions are co-partitioned, but not
// for a member whose previous assignment came from another balancer or
// another topic set (a group migrating from cooperative-sticky, or a member
// that had not loaded one topic's metadata), which would hand over half a
// number for one round. Eager costs a pause of all partitions per
// rebalance; the runtime already restores only a checkpoint's tail, and
// the aggregator's correctness must not depend on every member's history.
func CopartitionBalancer(topics ...string) kgo.GroupBalancer {
	s := slices.Clone(topics)
	slices.Sort(s)
	return &copartitionBalancer{topics: slices.Compact(s)}
}

type copartitionBalancer struct {
	topics  []string // sorted, unique; empty: the members' common set
	standby StandbyOptions

	// last is this member's last assignment (ParseSyncAssignment), for
	// its claims: kgo clears its own record of it when an eager member
	// revokes before joining, and passes JoinGroupMetadata nothing.
	mu   sync.Mutex
	last map[string][]int32
}

func (*copartitionBalancer) ProtocolName() string { return CopartitionProtocol }
func (*copartitionBalancer) IsCooperative() bool  { return false }

// JoinGroupMetadata writes the consumer protocol's metadata with the
// member's last assignment and generation in the sticky userdata format, so
// the leader can keep each member's partition numbers. kgo clears its
// record of the last assignment when an eager member revokes it before
// joining, and passes nothing: the balancer then claims the last
// assignment it parsed itself (one balancer per client: a new client
// claims nothing).
func (b *copartitionBalancer) JoinGroupMetadata(interests []string, current map[string][]int32, generation int32) []byte {
	meta := kmsg.NewConsumerMemberMetadata()
	meta.Version = 3
	meta.Topics = interests
	meta.Generation = generation
	sticky := kmsg.NewStickyMemberMetadata()
	sticky.Generation = generation
	if len(current) == 0 {
		b.mu.Lock()
		current = b.last
		b.mu.Unlock()
	}
	for topic, partitions := range current {
		a := kmsg.NewStickyMemberMetadataCurrentAssignment()
		a.Topic = topic
		a.Partitions = partitions
		sticky.CurrentAssignment = append(sticky.CurrentAssignment, a)
	}
	// Deterministic output: Kafka compares metadata to decide whether a
	// rejoin needs a rebalance.
	slices.SortFunc(sticky.CurrentAssignment, func(a, b kmsg.StickyMemberMetadataCurrentAssignment) int {
		return cmp.Compare(a.Topic, b.Topic)
	})
	meta.UserData = sticky.AppendTo(nil)
	if b.standby.Warm != nil {
		meta.UserData = appendWarm(appendSticky(nil, &sticky), b.standby.Warm())
	}
	return meta.AppendTo(nil)
}

// ParseSyncAssignment parses the consumer protocol's assignment and refuses
// one that is not co-partitioned: every topic must carry the same partition
// numbers, and the topics must be the configured set. The standby
// assignment in its userdata goes to StandbyOptions.Assigned.
func (b *copartitionBalancer) ParseSyncAssignment(assignment []byte) (map[string][]int32, error) {
	var a kmsg.ConsumerMemberAssignment
	if err := a.ReadFrom(assignment); err != nil {
		return nil, fmt.Errorf("stream: copartition balancer: sync assignment parse failed: %w", err)
	}
	m := make(map[string][]int32, len(a.Topics))
	for _, t := range a.Topics {
		m[t.Topic] = t.Partitions
	}
	if err := b.checkAssignment(m); err != nil {
		return nil, err
	}
	last := make(map[string][]int32, len(m))
	for t, ps := range m {
		last[t] = slices.Clone(ps)
	}
	b.mu.Lock()
	b.last = last
	b.mu.Unlock()
	if b.standby.Assigned != nil {
		var owned []int32
		for _, ps := range m {
			owned = ps
			break
		}
		sa := parseStandby(a.UserData, owned)
		sa.Owned = slices.Sorted(slices.Values(owned))
		b.standby.Assigned(sa)
	}
	return m, nil
}

func (b *copartitionBalancer) checkAssignment(m map[string][]int32) error {
	topics := slices.Sorted(maps.Keys(m))
	var want []int32
	for i, t := range topics {
		ps := slices.Sorted(slices.Values(m[t]))
		if i == 0 {
			want = ps
			continue
		}
		if !slices.Equal(ps, want) {
			return fmt.Errorf("stream: copartition balancer: assignment is %w: %s%v but %s%v", ErrNotCopartitioned, topics[0], want, t, ps)
		}
	}
	if len(b.topics) > 0 && len(topics) > 0 && !slices.Equal(topics, b.topics) {
		return fmt.Errorf("stream: copartition balancer: assignment is %w: it names topics %v, want %v", ErrNotCopartitioned, topics, b.topics)
	}
	return nil
}

// MemberBalancer parses every member's consumer metadata.
func (b *copartitionBalancer) MemberBalancer(members []kmsg.JoinGroupResponseMember) (kgo.GroupMemberBalancer, map[string]struct{}, error) {
	cb, err := kgo.NewConsumerBalancer(b, members)
	if err != nil {
		return nil, nil, fmt.Errorf("stream: copartition balancer: %w", err)
	}
	return cb, cb.MemberTopics(), nil
}

// Balance implements kgo.ConsumerBalancerBalance. On error it sets the
// error on cb and returns nil, so the group gets no assignment.
func (b *copartitionBalancer) Balance(cb *kgo.ConsumerBalancer, counts map[string]int32) kgo.IntoSyncAssignment {
	plan, err := b.balance(cb, counts)
	if err != nil {
		cb.SetError(err)
		return nil
	}
	return plan
}

func (b *copartitionBalancer) balance(cb *kgo.ConsumerBalancer, counts map[string]int32) (kgo.IntoSyncAssignment, error) {
	members := cb.Members()
	if len(members) == 0 {
		return cb.NewPlan(), nil
	}
	topics := b.topics
	if len(topics) == 0 {
		_, meta := cb.MemberAt(0)
		topics = meta.Topics
	}
	var mismatched []string
	cb.EachMember(func(m *kmsg.JoinGroupResponseMember, meta *kmsg.ConsumerMemberMetadata) {
		if !slices.Equal(meta.Topics, topics) { // both sorted
			mismatched = append(mismatched, fmt.Sprintf("member %s subscribes to %v", m.MemberID, meta.Topics))
		}
	})
	if len(mismatched) > 0 {
		return nil, fmt.Errorf("stream: copartition balancer: %w: the co-partitioned topics are %v, but %s (a member that has not loaded a topic's metadata subscribes without it)",
			ErrNotCopartitioned, topics, strings.Join(mismatched, "; "))
	}
	if len(topics) == 0 {
		return cb.NewPlan(), nil
	}

	n, err := copartitionCount(topics, counts)
	if err != nil {
		return nil, err
	}

	claims := make([]memberClaim, len(members))
	warm := make([]warmInput, len(members))
	for i := range members {
		_, meta := cb.MemberAt(i)
		claims[i], warm[i] = parseClaimWarm(meta.UserData, topics, n)
	}
	wp := assignWarm(claims, warm, n, b.standby.Replicas, b.standby.AcceptableLag, b.standby.MaxWarmups)

	plan := cb.NewPlan()
	for i := range members {
		if len(wp.numbers[i]) == 0 {
			continue
		}
		for _, t := range topics {
			plan.AddPartitions(&members[i], t, slices.Clone(wp.numbers[i]))
		}
	}
	if b.standby.Replicas <= 0 {
		return plan, nil
	}
	sp := &standbyPlan{plan: plan, userdata: map[string][]byte{}}
	// assignWarm gives each number min(Replicas, members−1) standbys.
	placed := min(b.standby.Replicas, len(members)-1)
	for i := range members {
		sp.userdata[members[i].MemberID] = encodeStandby(StandbyAssignment{Standby: wp.standby[i], Deferred: wp.deferred[i], Warmup: wp.warmup[i],
			Replicas: b.standby.Replicas, Placed: placed, Members: len(members)})
	}
	return sp, nil
}

// copartitionCount returns the partition count shared by topics, or a
// *CopartitionError.
func copartitionCount(topics []string, counts map[string]int32) (int32, error) {
	e := &CopartitionError{Topics: slices.Clone(topics), Partitions: make([]int32, len(topics))}
	ok := true
	for i, t := range topics {
		c := max(counts[t], 0)
		e.Partitions[i] = c
		if c == 0 || c != e.Partitions[0] {
			ok = false
		}
	}
	if !ok {
		return 0, e
	}
	return e.Partitions[0], nil
}

// memberClaim is what one member says it owned before this rebalance.
type memberClaim struct {
	numbers    []int32 // sorted, unique, each in [0, n)
	generation int32   // -1 when unknown
}

// parseClaimWarm reads a member's sticky userdata: the partition numbers it
// was last assigned of any co-partitioned topic, in range, and the warm
// copies it advertises after them (standby_balance.go). Unreadable userdata
// (another client, a corrupt join) is no history, never an error: it only
// costs stickiness.
func parseClaimWarm(userdata []byte, topics []string, n int32) (memberClaim, warmInput) {
	var sm kmsg.StickyMemberMetadata
	if len(userdata) == 0 || sm.ReadFrom(userdata) != nil {
		return memberClaim{generation: -1}, warmInput{}
	}
	c := memberClaim{generation: sm.Generation}
	for _, a := range sm.CurrentAssignment {
		if _, ok := slices.BinarySearch(topics, a.Topic); !ok {
			continue
		}
		for _, p := range a.Partitions {
			if p >= 0 && p < n { // claims are untrusted input
				c.numbers = append(c.numbers, p)
			}
		}
	}
	slices.Sort(c.numbers)
	c.numbers = slices.Compact(c.numbers)
	return c, warmInput{warm: parseWarm(userdata, &sm, n)}
}
