package stream

import (
	"slices"
	"testing"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// FuzzStandbyBalance feeds arbitrary join userdata (any member of the
// group writes its own: untrusted input) of three members to the leader's
// side of CopartitionStandbyBalancer. Whatever the bytes: claims and warm
// copies are in range, a canonical re-encoding of what was read parses
// back to the same, and the plan keeps the balancer's rules (every number
// owned once; balanced without standbys; min(replicas, m−1) standbys per
// number and at most one more warming up, never its owner; deferred and
// warm-up ⊆ standby), and every member's standby
// assignment survives its assignment userdata. Any assignment userdata (as
// from another leader) reads as a clean standby assignment.
func FuzzStandbyBalance(f *testing.F) {
	ud := func(gen int32, owned []int32, warm map[int32]int64) []byte {
		sm := kmsg.NewStickyMemberMetadata()
		sm.Generation = gen
		for _, tp := range []string{"a", "b"} {
			a := kmsg.NewStickyMemberMetadataCurrentAssignment()
			a.Topic, a.Partitions = tp, owned
			sm.CurrentAssignment = append(sm.CurrentAssignment, a)
		}
		return appendWarm(appendSticky(nil, &sm), warm)
	}
	f.Add(uint8(6), uint8(1), ud(3, []int32{0, 1, 2}, map[int32]int64{0: 10, 1: 20, 2: 30, 4: 5}),
		ud(3, []int32{3, 4, 5}, map[int32]int64{3: 1, 4: 2, 5: 3, 0: 9}), []byte{})
	f.Add(uint8(7), uint8(2), ud(-1, nil, map[int32]int64{1: 50_000, 6: 0}), ud(2, []int32{1, 6, 9}, nil),
		ud(1, []int32{0, 1, 2, 3, 4, 5, 6}, map[int32]int64{0: 1 << 40}))
	f.Add(uint8(3), uint8(0), []byte("mlw1"), []byte{0, 0, 0, 1}, []byte{0xff, 0xff, 0xff, 0xff})
	f.Add(uint8(4), uint8(1), encodeStandby(StandbyAssignment{Standby: []int32{3, 1, 1, -2}, Deferred: []int32{1, 9}}), []byte{}, []byte{})
	topics := []string{"a", "b"}
	f.Fuzz(func(t *testing.T, nb, rb uint8, ud0, ud1, ud2 []byte) {
		n, replicas := int32(nb%40)+1, int(rb%4)
		uds := [][]byte{ud0, ud1, ud2}
		claims := make([]memberClaim, len(uds))
		warm := make([]warmInput, len(uds))
		for i, b := range uds {
			claims[i], warm[i] = parseClaimWarm(b, topics, n)
			c, w := claims[i], warm[i].warm
			if !slices.IsSorted(c.numbers) || len(slices.Compact(slices.Clone(c.numbers))) != len(c.numbers) {
				t.Fatalf("member %d: claim %v is not sorted and unique", i, c.numbers)
			}
			for _, p := range c.numbers {
				if p < 0 || p >= n {
					t.Fatalf("member %d: claims %d, outside [0, %d)", i, p, n)
				}
			}
			for p, off := range w {
				if p < 0 || p >= n || off < 0 {
					t.Fatalf("member %d: warm copy %d@%d outside [0, %d) or negative", i, p, off, n)
				}
			}
			// What was read, written again as a member writes it, reads
			// back the same.
			var sm kmsg.StickyMemberMetadata
			if len(b) == 0 || sm.ReadFrom(b) != nil {
				continue
			}
			again := appendWarm(appendSticky(nil, &sm), w)
			c2, w2 := parseClaimWarm(again, topics, n)
			if c2.generation != c.generation || !slices.Equal(c2.numbers, c.numbers) || len(w2.warm) != len(w) {
				t.Fatalf("member %d: %x read as %+v %v, written back as %x read as %+v %v", i, b, c, w, again, c2, w2.warm)
			}
			for p, off := range w {
				if w2.warm[p] != off {
					t.Fatalf("member %d: warm copy %d@%d read back as %d", i, p, off, w2.warm[p])
				}
			}
		}
		// A member reads any assignment userdata (another leader's) as a
		// clean standby assignment.
		if a := parseStandby(ud0, claims[1].numbers); !slices.IsSorted(a.Standby) || len(slices.Compact(slices.Clone(a.Standby))) != len(a.Standby) {
			t.Fatalf("standby %v from %x is not sorted and unique", a.Standby, ud0)
		} else {
			for _, p := range a.Standby {
				if p < 0 || slices.Contains(claims[1].numbers, p) {
					t.Fatalf("standby %d from %x: negative or owned (%v)", p, ud0, claims[1].numbers)
				}
			}
			for _, p := range slices.Concat(a.Deferred, a.Warmup) {
				if !slices.Contains(a.Standby, p) {
					t.Fatalf("deferred or warm-up %d from %x is not among the standbys %v", p, ud0, a.Standby)
				}
			}
		}
		wp := assignWarm(claims, warm, n, replicas, DefaultAcceptableLag, DefaultMaxWarmups)
		m := len(uds)
		owner := make([]int, n)
		for p := range owner {
			owner[p] = -1
		}
		anyDeferred := false
		for i := range m {
			anyDeferred = anyDeferred || len(wp.deferred[i]) > 0
			for _, p := range wp.numbers[i] {
				if p < 0 || p >= n || owner[p] >= 0 {
					t.Fatalf("number %d owned by member %d and %d (plan %v)", p, owner[max(min(p, n-1), 0)], i, wp.numbers)
				}
				owner[p] = i
			}
		}
		for p, o := range owner {
			if o < 0 {
				t.Fatalf("number %d has no owner (plan %v)", p, wp.numbers)
			}
		}
		if !anyDeferred {
			lo, hi := int(n)/m, (int(n)+m-1)/m
			for i := range m {
				if c := len(wp.numbers[i]); c < lo || c > hi {
					t.Fatalf("member %d owns %d numbers, want %d..%d (plan %v)", i, c, lo, hi, wp.numbers)
				}
			}
		}
		per, warmups := make([]int, n), make([]int, n)
		for i := range m {
			for _, p := range wp.standby[i] {
				if owner[p] == i {
					t.Fatalf("member %d is standby of %d, which it owns", i, p)
				}
				per[p]++
			}
			for _, p := range wp.deferred[i] {
				if !slices.Contains(wp.standby[i], p) {
					t.Fatalf("member %d: deferred %d is not among its standbys %v", i, p, wp.standby[i])
				}
			}
			for _, p := range wp.warmup[i] {
				if !slices.Contains(wp.standby[i], p) {
					t.Fatalf("member %d: warm-up %d is not among its standbys %v", i, p, wp.standby[i])
				}
				warmups[p]++
			}
			a := parseStandby(encodeStandby(StandbyAssignment{Standby: wp.standby[i], Deferred: wp.deferred[i], Warmup: wp.warmup[i]}), wp.numbers[i])
			if !slices.Equal(a.Standby, wp.standby[i]) || !slices.Equal(a.Deferred, wp.deferred[i]) || !slices.Equal(a.Warmup, wp.warmup[i]) {
				t.Fatalf("member %d: standby %v deferred %v warm-up %v read back as %+v", i, wp.standby[i], wp.deferred[i], wp.warmup[i], a)
			}
		}
		want := 0
		if replicas > 0 {
			want = min(replicas, m-1)
		}
		for p, c := range per {
			if c-warmups[p] != want || warmups[p] > 1 {
				t.Fatalf("number %d has %d standbys (%d warming up), want %d and at most one more", p, c, warmups[p], want)
			}
		}
	})
}
