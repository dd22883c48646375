package stream

import (
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/meterline/meterline/internal/fault"
	"github.com/meterline/meterline/internal/testenv"
)

// TestStandbyPromotedAfterOwnerCrash: the owner of a partition dies
// in-process (no transaction ended, nothing applied after the point) at
// each point of a transaction; its standby takes the partition over, with
// its warm state in step with the restored store, and every input is
// counted exactly once: the transaction committed before the crash once,
// one left open or unfinished not at all until it is processed again.
func TestStandbyPromotedAfterOwnerCrash(t *testing.T) {
	promotedAfterOwnerCrash(t, nil)
}

// TestRealStandbyPromotedAfterOwnerCrash is
// TestStandbyPromotedAfterOwnerCrash on the real broker of
// METERLINE_TEST_KAFKA: the dead owner's open transaction holds the
// standby's tail and the promoted restore at the last stable offset until
// the broker aborts it.
func TestRealStandbyPromotedAfterOwnerCrash(t *testing.T) {
	promotedAfterOwnerCrash(t, testenv.RealKafka(t))
}

func promotedAfterOwnerCrash(t *testing.T, brokers []string) {
	for _, point := range []string{fault.BeforeCommit, fault.AfterCommit, fault.DuringApply, fault.AfterApply} {
		t.Run(point, func(t *testing.T) {
			t.Parallel()
			s := newSuite(t, brokers, nil)
			a, b, procB, fsB := startWarmPair(s, func(c *Config) { c.StandbyReplicas = 1; c.TransactionTimeout = 2 * time.Second })
			for range 10 {
				s.send(10)
				time.Sleep(20 * time.Millisecond)
			}
			s.caughtUp()
			var aOwns int32 = -1
			a.rt.EachPartitionStatus(func(p int32, _ bool, _ int64, _, _ string) { aOwns = p })
			a.rt.CrashAt(point)
			for range 5 {
				s.send(10)
				time.Sleep(20 * time.Millisecond)
			}
			a.crashed(point)
			s.waitFor("b to own both partitions", func() bool { return b.owned() == 2 })
			procB.mu.Lock()
			info := procB.opened[aOwns]
			procB.mu.Unlock()
			if info.warm && !info.matches {
				t.Fatalf("Open of the promoted partition %d: %+v: its warm state differs from the restored state", aOwns, info)
			}
			t.Logf("promoted partition %d opened with %+v", aOwns, info)
			s.finish(b, fsB)
		})
	}
}

// TestStandbyTwoCopiesOwnerCrash: three instances, two standby copies per
// partition (every instance holds both partitions, as owner or copy). An
// owner dies in-process after a transaction committed, before it reached
// Pebble, while input keeps arriving; one of the two standbys takes its
// partition, the other keeps copying (its tail goes on, or starts again
// under the new owner), and every input is counted exactly once through
// a second failover onto the last instance.
func TestStandbyTwoCopiesOwnerCrash(t *testing.T) {
	t.Parallel()
	s := newSuite(t, nil, nil)
	standby := func(c *Config) { c.StandbyReplicas = 2; c.TransactionTimeout = 2 * time.Second }
	newProc := func() *warmProc {
		return &warmProc{countProc: &countProc{output: s.output}, opened: map[int32]openInfo{}}
	}
	fsA, fsB, fsC := vfs.NewMem(), vfs.NewMem(), vfs.NewMem()
	procs := map[string]*warmProc{"a": newProc(), "b": newProc(), "c": newProc()}
	a := s.startProc("a", fsA, procs["a"], standby)
	b := s.startProc("b", fsB, procs["b"], standby)
	c := s.startProc("c", fsC, procs["c"], standby)
	all := []*instance{a, b, c}
	held := func(in *instance) int { return in.owned() + int(in.metric("meterline_stream_standby_partitions")) }
	s.waitFor("every instance to hold both partitions", func() bool {
		return held(a) == 2 && held(b) == 2 && held(c) == 2 && a.owned()+b.owned()+c.owned() == 2
	})
	for range 10 {
		s.send(10)
		time.Sleep(20 * time.Millisecond)
	}
	s.caughtUp()
	var owner *instance
	for _, in := range all {
		if in.owned() > 0 {
			owner = in
			break
		}
	}
	owner.rt.CrashAt(fault.AfterCommit)
	for range 5 {
		s.send(10)
		time.Sleep(20 * time.Millisecond)
	}
	owner.crashed(fault.AfterCommit)
	var rest []*instance
	for _, in := range all {
		if in != owner {
			rest = append(rest, in)
		}
	}
	s.waitFor("the other two to own both partitions", func() bool { return rest[0].owned()+rest[1].owned() == 2 })
	for range 5 {
		s.send(10)
		time.Sleep(20 * time.Millisecond)
	}
	s.caughtUp()
	for id, p := range procs {
		p.mu.Lock()
		for part, info := range p.opened {
			if info.warm && !info.matches {
				t.Errorf("%s opened partition %d with warm state that differs from its store: %+v", id, part, info)
			}
		}
		p.mu.Unlock()
	}
	last := map[*instance]vfs.FS{a: fsA, b: fsB, c: fsC}
	s.finish(rest[1], last[rest[1]], rest[0])
}
