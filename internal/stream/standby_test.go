package stream

import (
	"context"
	"fmt"
	"maps"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"
)

// warmProc is countProc with warm state (Warmer): a copy of the partition's
// keys, kept by the standby's Apply. Open records whether it got one and
// whether it matched the restored state.
type warmProc struct {
	*countProc
	mu     sync.Mutex
	opened map[int32]openInfo
}

type openInfo struct {
	warm    bool
	matches bool // the warm copy equals the state's keys
	keys    int
}

type warmKeys struct{ m map[string]string }

func (w *warmKeys) Apply(k, v []byte) {
	if v == nil {
		delete(w.m, string(k))
		return
	}
	w.m[string(k)] = string(v)
}

func stateKeys(st *PartitionState) (map[string]string, error) {
	m := map[string]string{}
	err := st.Scan(nil, nil, func(k, v []byte) error { m[string(k)] = string(v); return nil })
	return m, err
}

func (w *warmProc) Warm(p int32, st *PartitionState) (WarmState, error) {
	m, err := stateKeys(st)
	return &warmKeys{m: m}, err
}

func (w *warmProc) Open(p int32, st *PartitionState) (Partition, error) {
	info := openInfo{}
	if wk, ok := st.Warm().(*warmKeys); ok {
		m, err := stateKeys(st)
		if err != nil {
			return nil, err
		}
		info = openInfo{warm: true, matches: maps.Equal(m, wk.m), keys: len(m)}
	}
	w.mu.Lock()
	w.opened[p] = info
	w.mu.Unlock()
	return w.countProc.Open(p, st)
}

// TestStandbyFailover: two instances with one standby replica each own one
// partition and keep the other's warm. The standby's copy follows the
// changelog: once it has read up to the changelog's end, it holds the
// changelog's state and a checkpoint at that end. When the owner leaves,
// the other takes its partition, restores only the changelog's records
// past its standby checkpoint (not those below it, as a restore from
// scratch would), hands the processor its warm state in step with the
// restored store, and counts every input exactly once. Nothing is timed:
// how many transactions the inputs make depends on the machine's load.
func TestStandbyFailover(t *testing.T) {
	t.Parallel()
	standbyFailover(t, false)
}

// TestStandbyFailoverTailStoppedFirst: as TestStandbyFailover, but the
// promoted standby's tail has stopped before the partition's restore
// starts (the restore waits for the group's offset fetch, which kfake holds
// here until the tail is done; on a loaded machine either may come first).
// The warm state is still handed over.
func TestStandbyFailoverTailStoppedFirst(t *testing.T) {
	t.Parallel()
	standbyFailover(t, true)
}

func standbyFailover(t *testing.T, tailStopsFirst bool) {
	s := newSuite(t, nil, nil)
	a, b, procB, fsB := startWarmPair(s, func(c *Config) { c.StandbyReplicas = 1 })
	// Transactions of a few inputs each: the changelog holds records of
	// many, however the owner's commits happened to group the inputs.
	for range 30 {
		s.send(10)
		time.Sleep(30 * time.Millisecond)
	}
	s.caughtUp()
	var aOwns int32 = -1
	a.rt.EachPartitionStatus(func(p int32, _ bool, _ int64, _, _ string) { aOwns = p })
	ends := s.changelogEnd()
	// The standby follows the changelog: its copy reaches the end listed
	// now (waitFor fails only on a hang), and then holds every record
	// below it, as the changelog does.
	s.waitFor("b's standby copy to catch up", func() bool {
		caught := false
		b.rt.EachStandbyStatus(func(p int32, off, lag int64) { caught = p == aOwns && off >= ends[p] })
		return caught
	})
	below := s.changelogRecords(aOwns, 0, ends[aOwns])
	if below == 0 {
		t.Fatalf("changelog partition %d holds no records below its end %d", aOwns, ends[aOwns])
	}
	if got := b.metric("meterline_stream_standby_records_total"); got < float64(below) {
		t.Fatalf("b's standby applied %v changelog records, want the %d of partition %d below %d", got, below, aOwns, ends[aOwns])
	}
	if got, want := s.storeState(b.rt.store, aOwns), s.changelogState()[aOwns]; !maps.Equal(got, want) {
		t.Fatalf("b's standby copy of partition %d: %q, want the changelog's %q", aOwns, got, want)
	}
	cp, ok, err := b.rt.store.Checkpoint(aOwns)
	if err != nil || !ok || cp.Offset < ends[aOwns] {
		t.Fatalf("b's standby checkpoint of partition %d: %+v (%v, %v), want at or past %d", aOwns, cp, ok, err, ends[aOwns])
	}
	restoredBefore := b.metric("meterline_stream_restore_records_total")
	fullBefore := b.metric("meterline_stream_restores_total", "kind", "full")

	var held atomic.Bool
	if tailStopsFirst {
		b.rt.sb.mu.Lock()
		tl := b.rt.sb.tails[aOwns]
		b.rt.sb.mu.Unlock()
		// The group's next offset fetch is b's, once the assignment that
		// promotes it has stopped its tail: it is answered once the tail
		// is done.
		s.cluster.ControlKey(kmsg.OffsetFetch.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
			r := req.(*kmsg.OffsetFetchRequest)
			ours := r.Group == s.group
			for _, g := range r.Groups {
				ours = ours || g.Group == s.group
			}
			if !ours {
				s.cluster.KeepControl()
				return nil, nil, false
			}
			s.cluster.SleepControl(func() {
				select {
				case <-tl.done:
					held.Store(true)
				case <-time.After(10 * time.Second):
				}
			})
			return nil, nil, false
		})
	}

	a.shutdown()
	s.waitFor("b to own both partitions", func() bool { return b.owned() == 2 })
	if tailStopsFirst && !held.Load() {
		t.Fatal("b's offset fetch was not held until its tail stopped")
	}
	// The promoted standby restores only what lies past its checkpoint:
	// not the records it applied, which a restore from scratch would
	// replay.
	replayed := b.metric("meterline_stream_restore_records_total") - restoredBefore
	remainder := s.changelogRecords(aOwns, cp.Offset, s.changelogEnd()[aOwns])
	t.Logf("b took partition %d: replayed %v changelog records; its standby applied the %d below its checkpoint %d, %d lie past it",
		aOwns, replayed, below, cp.Offset, remainder)
	if replayed > float64(remainder) {
		t.Fatalf("the promoted standby replayed %v changelog records, want only the %d past its checkpoint %d (%d lie below it)", replayed, remainder, cp.Offset, below)
	}
	if full := b.metric("meterline_stream_restores_total", "kind", "full") - fullBefore; full != 0 {
		t.Fatalf("b restored %v partitions in full on the failover", full)
	}
	procB.mu.Lock()
	info := procB.opened[aOwns]
	procB.mu.Unlock()
	if !info.warm || !info.matches || info.keys == 0 {
		t.Fatalf("Open of the promoted partition: %+v, want the standby's warm state, equal to the restored state", info)
	}
	if n := b.metric("meterline_stream_restores_total", "kind", "tail"); n < 1 {
		t.Fatalf("tail restores %v", n)
	}
	s.finish(b, fsB)
}

// startWarmPair starts instances a and b with warmProc processors and
// mod (standby replicas), and waits until each owns one partition and
// keeps the other's warm. It returns b's processor and store.
func startWarmPair(s *suite, mod func(*Config)) (a, b *instance, procB *warmProc, fsB vfs.FS) {
	s.t.Helper()
	fsB = vfs.NewMem()
	procB = &warmProc{countProc: &countProc{output: s.output}, opened: map[int32]openInfo{}}
	a = s.startProc("a", vfs.NewMem(), &warmProc{countProc: &countProc{output: s.output}, opened: map[int32]openInfo{}}, mod)
	b = s.startProc("b", fsB, procB, mod)
	s.waitFor("one partition each", func() bool { return a.owned() == 1 && b.owned() == 1 })
	s.waitFor("one standby each", func() bool {
		return a.metric("meterline_stream_standby_partitions") == 1 && b.metric("meterline_stream_standby_partitions") == 1
	})
	return a, b, procB, fsB
}

// TestStandbyJoinDefers: a cold instance joining a warm one with standbys
// takes nothing at first; it tails as a standby, asks for a rebalance when
// caught up, and then takes its share with a tail restore.
func TestStandbyJoinDefers(t *testing.T) {
	t.Parallel()
	s := newSuite(t, nil, nil)
	standby := func(c *Config) { c.StandbyReplicas = 1 }
	fsA, fsB := vfs.NewMem(), vfs.NewMem()
	a := s.startProc("a", fsA, &warmProc{countProc: &countProc{output: s.output}, opened: map[int32]openInfo{}}, standby)
	s.waitFor("a to own both partitions", func() bool { return a.owned() == 2 })
	for range 20 {
		s.send(10)
		time.Sleep(20 * time.Millisecond)
	}
	s.caughtUp()
	b := s.startProc("b", fsB, &warmProc{countProc: &countProc{output: s.output}, opened: map[int32]openInfo{}}, standby)
	s.waitFor("b to be a standby", func() bool { return b.metric("meterline_stream_standby_partitions") >= 1 })
	if b.owned() != 0 {
		t.Fatalf("the cold joiner owns %d partitions at once", b.owned())
	}
	s.waitFor("b to take its share", func() bool { return b.owned() == 1 && a.owned() == 1 })
	if full := b.metric("meterline_stream_restores_total", "kind", "full"); full != 0 {
		t.Fatalf("b restored %v partitions in full", full)
	}
	b.shutdown()
	s.finish(a, fsA)
}

// TestStandbyTakeKeepsPromotedTail: the handover of a promoted standby's
// warm state does not depend on whether its tail stops before the
// partition's restore takes it; a tail kept for a restore that never came
// is dropped by the next assignment that does not give the partition here;
// a restore whose context has ended (its partition was revoked) takes
// nothing and leaves the tail of a later standby assignment running.
func TestStandbyTakeKeepsPromotedTail(t *testing.T) {
	t.Parallel()
	rt := &Runtime{cfg: Config{StandbyReplicas: 1}, log: zap.NewNop(), parts: map[int32]*partState{}}
	sb := &standbys{rt: rt, tails: map[int32]*tail{}, stopping: map[int32]*tail{}, m: newStandbyMetrics(prometheus.NewRegistry(), "test")}
	rt.sb = sb
	// fake adds a running tail of p whose goroutine, once cancelled,
	// ends with warm when finish is called.
	type fakeTail struct {
		*tail
		cancelled atomic.Bool
		warm      WarmState
	}
	fake := func(p int32) *fakeTail {
		f := &fakeTail{warm: &warmKeys{m: map[string]string{"k": fmt.Sprint(p)}}}
		f.tail = &tail{p: p, done: make(chan struct{}), cancel: func() { f.cancelled.Store(true) }}
		sb.mu.Lock()
		sb.tails[p] = f.tail
		sb.mu.Unlock()
		return f
	}
	finish := func(f *fakeTail) {
		f.tail.warm, f.tail.err = f.warm, context.Canceled
		close(f.tail.done)
		sb.stopped(f.tail)
	}
	stopping := func(p int32) bool {
		sb.mu.Lock()
		defer sb.mu.Unlock()
		_, ok := sb.stopping[p]
		return ok
	}
	ctx := context.Background()

	// Promoted: the tail stops before the restore takes it.
	t1 := fake(1)
	sb.assigned(StandbyAssignment{Owned: []int32{1}})
	if !t1.cancelled.Load() {
		t.Fatal("the promotion did not stop the tail")
	}
	finish(t1)
	if got := sb.take(ctx, 1); got != t1.warm {
		t.Fatalf("take after the promoted tail stopped: %v, want its warm state", got)
	}
	if stopping(1) {
		t.Fatal("the taken tail is still held")
	}

	// Promoted: the restore takes the tail while it is still stopping.
	t2 := fake(2)
	sb.assigned(StandbyAssignment{Owned: []int32{2}})
	got := make(chan WarmState)
	go func() { got <- sb.take(ctx, 2) }()
	finish(t2)
	if w := <-got; w != t2.warm {
		t.Fatalf("take of the stopping tail: %v, want its warm state", w)
	}

	// Promoted, but the partition moves on before its restore takes the
	// tail: the next assignment drops it, whether it was done already or
	// ends later.
	t3, t4 := fake(3), fake(4)
	sb.assigned(StandbyAssignment{Owned: []int32{3, 4}})
	finish(t3)
	if !stopping(3) || !stopping(4) {
		t.Fatal("the promoted tails are not kept for their restores")
	}
	sb.assigned(StandbyAssignment{})
	if stopping(3) {
		t.Fatal("a kept tail of a partition no longer assigned here is still held after it stopped")
	}
	finish(t4)
	if stopping(4) {
		t.Fatal("a kept tail of a partition no longer assigned here is still held after it stopped")
	}

	// A revoked restore's take (its context ended) leaves a standby tail
	// of its partition running.
	t5 := fake(5)
	ended, cancel := context.WithCancel(ctx)
	cancel()
	go func() { got <- sb.take(ended, 5) }()
	select {
	case w := <-got:
		if w != nil {
			t.Fatalf("a revoked restore took %v", w)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a revoked restore's take waits for a standby tail of its partition")
	}
	sb.mu.Lock()
	running := sb.tails[5] == t5.tail
	sb.mu.Unlock()
	if !running || t5.cancelled.Load() {
		t.Fatal("a revoked restore's take stopped a standby tail of its partition")
	}
	finish(t5)
}
