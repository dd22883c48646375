package stream

import (
	"context"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"

	"github.com/meterline/meterline/internal/clock"
)

// cleanupWorld is a runtime without Kafka, on an in-memory store and a
// fake clock, for the state cleanup's sweep (cleanup.go).
type cleanupWorld struct {
	t   *testing.T
	rt  *Runtime
	clk *clock.Fake
}

const cleanupRetention = 24 * time.Hour

func newCleanupWorld(t *testing.T, delay time.Duration) *cleanupWorld {
	t.Helper()
	st, err := OpenStore("", vfs.NewMem(), zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	clk := clock.NewFake(time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC))
	reg := prometheus.NewRegistry()
	rt := &Runtime{cfg: Config{InputTopic: "in", StandbyReplicas: 1, StateCleanupDelay: delay, Clock: clk},
		log: zap.NewNop(), store: st, m: newMetrics(reg, "test"), parts: map[int32]*partState{}}
	rt.sb = &standbys{rt: rt, tails: map[int32]*tail{}, stopping: map[int32]*tail{}, m: newStandbyMetrics(reg, "test")}
	rt.horizon.known.Store(int64(cleanupRetention))
	return &cleanupWorld{t: t, rt: rt, clk: clk}
}

// put writes partition p's state: a row and, with at not zero, a
// checkpoint dated at.
func (w *cleanupWorld) put(p int32, at time.Time) {
	w.t.Helper()
	b := w.rt.store.newBatch()
	b.set(p, []byte("k"), []byte("v"))
	if !at.IsZero() {
		b.checkpoint(p, Checkpoint{Offset: 10, At: at})
	}
	if err := b.commit(); err != nil {
		w.t.Fatal(err)
	}
}

// has reports whether the store holds any state (rows, checkpoint) of p.
func (w *cleanupWorld) has(p int32) bool {
	w.t.Helper()
	ps, err := w.rt.store.partitions()
	if err != nil {
		w.t.Fatal(err)
	}
	for _, q := range ps {
		if q == p {
			return true
		}
	}
	return false
}

func (w *cleanupWorld) sweep() {
	w.t.Helper()
	if err := w.rt.sweepState(w.clk.Now()); err != nil {
		w.t.Fatal(err)
	}
}

// own makes p owned, as an assignment and its restore's start do.
func (w *cleanupWorld) own(owned ...int32) {
	w.rt.sb.noteHeld(StandbyAssignment{Owned: owned})
	w.rt.mu.Lock()
	for _, p := range owned {
		if _, ok := w.rt.parts[p]; !ok {
			w.rt.parts[p] = &partState{epoch: epochSeq.Add(1)}
		}
	}
	w.rt.mu.Unlock()
}

// revoke revokes p.
func (w *cleanupWorld) revoke(p int32) {
	w.rt.onRevoked(context.Background(), nil, map[string][]int32{"in": {p}})
}

// after moves the clock on by d, sweeps, and checks whether the store
// holds state of p.
func (w *cleanupWorld) after(d time.Duration, what string, p int32, held bool) {
	w.t.Helper()
	w.clk.Advance(d)
	w.sweep()
	w.want(what, p, held)
}

func (w *cleanupWorld) want(what string, p int32, held bool) {
	w.t.Helper()
	if got := w.has(p); got != held {
		w.t.Fatalf("%s: the store holds state of partition %d: %v, want %v", what, p, got, held)
	}
}

// TestStateCleanupRevoked: a revoked partition's state stays for the
// delay, then goes (rows and checkpoint); the owned one's stays.
func TestStateCleanupRevoked(t *testing.T) {
	t.Parallel()
	w := newCleanupWorld(t, 10*time.Minute)
	w.put(1, w.clk.Now())
	w.put(2, w.clk.Now())
	w.own(1, 2)
	w.sweep()
	w.own(2)
	w.revoke(1)
	w.sweep()
	w.want("just revoked", 1, true)
	if n := testutil.ToFloat64(w.rt.m.unheldPartitions); n != 1 {
		t.Fatalf("unheld partitions %v, want 1", n)
	}
	w.after(10*time.Minute-time.Second, "revoked for less than the delay", 1, true)
	w.after(time.Second, "revoked for the delay", 1, false)
	if _, ok, _ := w.rt.store.Checkpoint(1); ok {
		t.Fatal("the revoked partition's checkpoint is left")
	}
	w.want("owned", 2, true)
	if n := testutil.ToFloat64(w.rt.m.cleaned.WithLabelValues(cleanDelay)); n != 1 {
		t.Fatalf("cleaned{delay} %v, want 1", n)
	}
	if n := testutil.ToFloat64(w.rt.m.unheldPartitions); n != 0 {
		t.Fatalf("unheld partitions %v, want 0", n)
	}
}

// TestStateCleanupReassignedBeforeDelay: a partition given back before the
// delay keeps its copy, which a restore replays only the tail of; revoked
// again, it is kept for a whole delay from then.
func TestStateCleanupReassignedBeforeDelay(t *testing.T) {
	t.Parallel()
	w := newCleanupWorld(t, 10*time.Minute)
	w.put(1, w.clk.Now())
	w.own(1)
	w.revoke(1)
	w.own()
	w.sweep()
	w.clk.Advance(6 * time.Minute)
	w.own(1)
	w.sweep()
	cp, ok, err := w.rt.store.Checkpoint(1)
	if err != nil || !ok {
		t.Fatalf("checkpoint of the partition given back: %v, %v", ok, err)
	}
	if pl := planRestore(restoreInput{Now: w.clk.Now(), Checkpoint: cp, HasState: true, End: cp.Offset + 100, Retention: cleanupRetention}); pl.Full {
		t.Fatalf("the copy given back plans a full restore (%s)", pl.Reason)
	}
	w.revoke(1)
	w.own()
	w.sweep()
	w.after(6*time.Minute, "revoked again for 6 minutes, 12 since the first revoke", 1, true)
	w.after(4*time.Minute, "revoked again for the delay", 1, false)
}

// TestStateCleanupStandbyReleased: a standby copy moved elsewhere stays
// while its tail still writes, then for the delay, then goes.
func TestStateCleanupStandbyReleased(t *testing.T) {
	t.Parallel()
	w := newCleanupWorld(t, time.Minute)
	w.put(3, w.clk.Now())
	tl := &tail{p: 3, done: make(chan struct{}), cancel: func() {}}
	w.rt.sb.tails[3] = tl
	w.rt.sb.assigned(StandbyAssignment{Standby: []int32{3}})
	w.sweep()
	w.rt.sb.assigned(StandbyAssignment{}) // released: the tail stops
	w.sweep()
	w.after(2*time.Minute, "released, its tail still writing", 3, true)
	close(tl.done)
	w.rt.sb.stopped(tl)
	w.sweep()
	w.want("released, its tail stopped just now", 3, true)
	w.after(time.Minute, "released for the delay", 3, false)
}

// TestStateCleanupNeverHeld: nothing that is held is deleted, even past
// the delay and beyond the horizon: a tail kept for a promotion's
// restore, a partition assigned whose restore has not started, a
// revoked partition's restore still running.
func TestStateCleanupNeverHeld(t *testing.T) {
	t.Parallel()
	w := newCleanupWorld(t, time.Minute)
	old := w.clk.Now().Add(-2 * cleanupRetention) // beyond the horizon
	for p := int32(0); p < 3; p++ {
		w.put(p, old)
	}
	// 0: its standby is promoted; the restore has not taken the tail.
	tl := &tail{p: 0, done: make(chan struct{}), cancel: func() {}}
	w.rt.sb.tails[0] = tl
	w.rt.sb.assigned(StandbyAssignment{Owned: []int32{0, 1}})
	close(tl.done)
	w.rt.sb.stopped(tl)
	// 2: revoked, its restore still running.
	w.rt.mu.Lock()
	w.rt.addWriter(2)
	w.rt.mu.Unlock()
	w.clk.Advance(time.Hour)
	w.sweep()
	for p := int32(0); p < 3; p++ {
		w.want("held", p, true)
	}
	if got := w.rt.sb.take(context.Background(), 0); got != nil {
		t.Fatalf("take: %v", got)
	}
	w.rt.doneWriter(2)
	w.sweep()
	w.want("assigned, restore not started", 1, true)
	w.want("its restore done", 2, false)
	if n := testutil.ToFloat64(w.rt.m.cleaned.WithLabelValues(cleanHorizon)); n != 1 {
		t.Fatalf("cleaned{horizon} %v, want 1", n)
	}
}

// TestStateCleanupStart: at start nothing goes before the first
// assignment; then a copy beyond the horizon and rows without a
// checkpoint go at once, a current copy not given after the delay.
func TestStateCleanupStart(t *testing.T) {
	t.Parallel()
	w := newCleanupWorld(t, 10*time.Minute)
	w.put(0, w.clk.Now())
	w.put(1, w.clk.Now())
	w.put(2, w.clk.Now().Add(-2*cleanupRetention))
	w.put(3, time.Time{})
	w.clk.Advance(time.Hour)
	w.sweep()
	for p := int32(0); p < 4; p++ {
		w.want("before the first assignment", p, true)
	}
	w.own(0)
	w.sweep()
	w.want("owned", 0, true)
	w.want("not given, current", 1, true)
	w.want("not given, beyond the horizon", 2, false)
	w.want("not given, no checkpoint", 3, false)
	w.after(10*time.Minute, "not given for the delay", 1, false)
	w.want("owned", 0, true)
}

// TestStateCleanupUnknownRetention: with delete.retention.ms never read,
// no copy is judged beyond the horizon; the delay still applies.
func TestStateCleanupUnknownRetention(t *testing.T) {
	t.Parallel()
	w := newCleanupWorld(t, 10*time.Minute)
	w.rt.horizon.known.Store(0)
	w.put(1, w.clk.Now().Add(-2*cleanupRetention))
	w.own()
	w.sweep()
	w.want("retention unknown", 1, true)
	w.after(10*time.Minute, "retention unknown, after the delay", 1, false)
}

// TestStateCleanupOff: a negative delay keeps every copy.
func TestStateCleanupOff(t *testing.T) {
	t.Parallel()
	w := newCleanupWorld(t, -1)
	w.put(1, w.clk.Now().Add(-2*cleanupRetention))
	w.own()
	w.rt.cleanup.due.Store(true)
	w.rt.cleanState()
	w.want("cleanup off", 1, true)
	w.rt.cfg.StateCleanupDelay = time.Minute
	w.rt.cleanState()
	w.want("cleanup on", 1, false)
}

// TestStateCleanupRunLoop: on kfake, an instance that owned both
// partitions keeps the state of the one a joining instance took for the
// delay (its clock moved on), then its run loop deletes it; given back,
// the partition is restored in full and counts on.
func TestStateCleanupRunLoop(t *testing.T) {
	if pl := handBack(t, DefaultStateCleanupDelay+stateCleanupPoll); !pl.Full || pl.Reason != reasonNoState {
		t.Fatalf("a restored the partition given back %s (%s), want in full from no state", pl.Kind(), pl.Reason)
	}
}

// TestStateCleanupRunLoopBeforeDelay: given back before the delay, the
// partition's copy is there, and its restore replays only the tail.
func TestStateCleanupRunLoopBeforeDelay(t *testing.T) {
	if pl := handBack(t, DefaultStateCleanupDelay/2); pl.Full {
		t.Fatalf("a restored the partition given back %s (%s), want from its tail", pl.Kind(), pl.Reason)
	}
}

// handBack runs instance a alone, then with b, which takes one partition;
// a's clock moves on by skew, and a with a delay of skew or more deletes
// the state of that partition. Then b stops and a takes the partition
// back and counts on (suite.finish). It returns the plan of a's restore
// of the partition given back.
func handBack(t *testing.T, skew time.Duration) restorePlan {
	s := newSuite(t, nil, nil)
	clk := &skewClock{}
	fsA, fsB := vfs.NewMem(), vfs.NewMem()
	a := s.start("a", fsA, func(c *Config, _ *countProc) { c.Clock = clk })
	s.waitFor("a to own both partitions", func() bool { return a.owned() == 2 })
	s.send(20)
	s.caughtUp()
	b := s.start("b", fsB)
	s.waitFor("one partition each", func() bool { return a.owned() == 1 && b.owned() == 1 })
	var taken int32 = -1
	b.rt.EachPartitionStatus(func(p int32, _ bool, _ int64, _, _ string) { taken = p })
	if _, ok, err := a.rt.store.Checkpoint(taken); err != nil || !ok {
		t.Fatalf("a's checkpoint of partition %d, just revoked: %v, %v", taken, ok, err)
	}
	s.send(10)
	s.caughtUp()
	clk.skew.Store(int64(skew))
	deleted := skew >= DefaultStateCleanupDelay
	if deleted {
		s.waitFor("a to delete the state of the partition b took", func() bool {
			_, ok, err := a.rt.store.Checkpoint(taken)
			return err == nil && !ok
		})
	} else {
		time.Sleep(2 * time.Second) // a few turns of a's run loop
	}
	if _, ok, err := a.rt.store.Checkpoint(taken); err != nil || ok == deleted {
		t.Fatalf("a's checkpoint of partition %d, revoked %s ago: %v, %v", taken, skew, ok, err)
	}
	if n, want := a.metric("meterline_stream_state_cleaned_partitions_total", "reason", "delay"), map[bool]float64{true: 1}[deleted]; n != want {
		t.Fatalf("a's cleaned partitions (delay): %v, want %v", n, want)
	}
	if _, ok, err := a.rt.store.Checkpoint(1 - taken); err != nil || !ok {
		t.Fatalf("a's checkpoint of its own partition %d: %v, %v", 1-taken, ok, err)
	}
	s.finish(a, fsA, b)
	pl, ok := a.rt.lastRestore(taken)
	if !ok {
		t.Fatalf("a did not restore partition %d", taken)
	}
	return pl
}
