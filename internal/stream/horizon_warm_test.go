package stream

import (
	"context"
	"maps"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/meterline/meterline/internal/kafka"
	"github.com/meterline/meterline/internal/session"
)

// TestWarmCopiesWithinHorizon: a member tells the group's balancer only of
// the local copies a restore would replay the tail of, those whose
// checkpoint's date is within the restore horizon (54 s of a 60 s
// delete.retention.ms). A copy left on disk by an instance stopped for
// longer, or undated, restores in full like no copy: advertised, it made
// the balancer hand this member an orphaned partition to restore from
// scratch, ahead of a member that could do better. The horizon is judged
// with delete.retention.ms as last read, kept across restarts, since a
// member joins before it reads it again; never read, no copy is warm.
func TestWarmCopiesWithinHorizon(t *testing.T) {
	t.Parallel()
	w := newKVWorld(t, map[string]*string{"cleanup.policy": ptr("compact"), "delete.retention.ms": ptr("60000")})
	clk := &skewClock{}
	fs := vfs.NewMem()
	start := func() *Runtime {
		t.Helper()
		rt, err := New(Config{Stage: "kv",
			Config:     session.Config{Kafka: kafka.Config{Brokers: w.brokers}, Group: w.group, InstanceID: "s"},
			InputTopic: w.input, ChangelogTopic: w.changelog, FS: fs, Clock: clk, StandbyReplicas: 1,
			Logger: zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel))}, kvProc{})
		if err != nil {
			t.Fatal(err)
		}
		return rt
	}
	expect := func(what string, rt *Runtime, want map[int32]int64) {
		t.Helper()
		if got := rt.sb.warmCopies(); !maps.Equal(got, want) {
			t.Errorf("%s: warm copies advertised %v, want %v", what, got, want)
		}
	}

	rt := start()
	now := clk.Now()
	b := rt.store.newBatch()
	b.checkpoint(0, Checkpoint{Offset: 10, At: now.Add(-10 * time.Second)}) // well within the horizon
	b.checkpoint(1, Checkpoint{Offset: 20, At: now.Add(-2 * time.Minute)})  // an instance stopped for 2 min
	b.checkpoint(2, Checkpoint{Offset: 30, At: now.Add(-55 * time.Second)}) // a second past the horizon
	b.checkpoint(3, Checkpoint{Offset: 40})                                 // undated
	if err := b.commit(); err != nil {
		t.Fatal(err)
	}
	expect("delete.retention.ms never read", rt, map[int32]int64{})
	if d := rt.deleteRetention(context.Background(), kadm.NewClient(w.cl), rt.log); d != time.Minute {
		t.Fatalf("delete.retention.ms read as %s, want 1m", d)
	}
	expect("delete.retention.ms read", rt, map[int32]int64{0: 10})
	if err := rt.store.Close(); err != nil {
		t.Fatal(err)
	}

	// Started again, it joins before any restore or standby reads
	// delete.retention.ms: the value last read decides.
	rt = start()
	defer rt.store.Close()
	expect("started again", rt, map[int32]int64{0: 10})
	clk.skew.Add(int64(time.Minute))
	expect("started again a minute later", rt, map[int32]int64{})
}

// TestIdleStandbyStaysWarm: a standby tail of a changelog nobody writes
// to is as current as a copy can be, and it dates its copy at every
// listing of the changelog's end. That date must reach the store, whose
// checkpoints warmCopies advertises: kept in memory only, a standby of an
// idle partition fell out of the group's warm copies once the partition
// had been idle for most of delete.retention.ms, and a failover restored
// the partition in full elsewhere instead of promoting the standby.
func TestIdleStandbyStaysWarm(t *testing.T) {
	t.Parallel()
	w := newKVWorld(t, map[string]*string{"cleanup.policy": ptr("compact"), "delete.retention.ms": ptr("60000")})
	clk := &skewClock{}
	obs, logs := observer.New(zap.WarnLevel)
	rt, cl := w.standbyRuntime(clk, zap.New(zapcore.NewTee(zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel)).Core(), obs)),
		prometheus.NewRegistry())
	if err := cl.ProduceSync(context.Background(), kvRecords("k", "v", "x", "1")...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	rt.sb.mu.Lock()
	rt.sb.start(0)
	rt.sb.mu.Unlock()
	awaitCheckpoint(t, w, rt, "the standby to copy the changelog", func(cp Checkpoint, end int64) bool { return cp.Offset >= end })
	end := w.changelogEnd()
	if got := rt.sb.warmCopies(); !maps.Equal(got, map[int32]int64{0: end}) {
		t.Fatalf("a standby that just copied the changelog advertises %v, want {0: %d}", got, end)
	}
	// Nothing is written for two retentions: the standby, current all
	// along, lists the end every second and dates its copy by it. (It
	// lists the end once first, so that the records it read are dated
	// before the clock moves: a jump of the clock over unlisted reads is a
	// pause, TestStandbyPausedPastHorizonStartsOver.)
	awaitTailDated(t, rt, 0)
	clk.skew.Store(int64(2 * time.Minute))
	moved := clk.Now()
	awaitCheckpoint(t, w, rt, "the standby to write the date of its idle copy", func(cp Checkpoint, _ int64) bool { return !cp.At.Before(moved) })
	if got := rt.sb.warmCopies(); !maps.Equal(got, map[int32]int64{0: end}) {
		t.Errorf("a current standby of a partition idle for two retentions advertises %v, want {0: %d}", got, end)
	}
	// A copy started over is dated at the moved clock too: the date must
	// be the first copy's.
	if n := logs.FilterField(zap.Int("copies", 1)).Len(); n != 0 {
		t.Errorf("the standby of an idle partition started over: %s", logs.FilterField(zap.Int("copies", 1)).All()[0].Message)
	}
}

// TestWarmCopiesFollowLoweredRetention: a running member judges the copies
// it advertises with delete.retention.ms as the broker has it now, not as
// it was when its last restore read it. An instance that owns its
// partitions and tails none reads it no other way: lowered on the broker,
// the old value kept copies past the new horizon advertised at every
// later join (and persisted, at the next start too), and the group's
// balancer handed this member partitions it can only restore in full.
func TestWarmCopiesFollowLoweredRetention(t *testing.T) {
	t.Parallel()
	w := newKVWorld(t, map[string]*string{"cleanup.policy": ptr("compact"), "delete.retention.ms": ptr("60000")})
	w.send("k", "v")
	clk := &skewClock{}
	rt, err := New(Config{Stage: "kv",
		Config:     session.Config{Kafka: kafka.Config{Brokers: w.brokers}, Group: w.group, InstanceID: "a", SessionTimeout: 6 * time.Second},
		InputTopic: w.input, ChangelogTopic: w.changelog, FS: vfs.NewMem(), Clock: clk,
		Logger: zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel))}, kvProc{})
	if err != nil {
		t.Fatal(err)
	}
	// The copy must stay dated before the clock moves: the run loop's
	// re-date of an idle owned partition (redate.go, TestIdleOwnerStaysWarm)
	// would date it at the moved clock, current again, and advertised
	// rightly under either retention, whenever its look came before
	// watchRetention's read of the new value (both every 5 s).
	rt.redatePoll = time.Hour
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- rt.Run(ctx) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, ok := rt.sb.warmCopies()[0]; ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the instance did not process its input and advertise its copy of partition 0 in 30 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The operator lowers delete.retention.ms to 20 s; the copy, idle, is
	// then 31 s old: within the old horizon (54 s), past the new (18 s).
	w.setDeleteRetention("20000")
	clk.skew.Add(int64(retentionTTL + time.Second))
	deadline = time.Now().Add(3 * standbyRetentionPoll)
	for {
		cps := rt.sb.warmCopies()
		if _, ok := cps[0]; !ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s after delete.retention.ms was lowered to 20 s, a copy dated %s ago is still advertised: %v",
				3*standbyRetentionPoll, retentionTTL+time.Second, cps)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if d, ok, err := rt.store.Retention(); err != nil || !ok || d != 20*time.Second {
		t.Errorf("persisted delete.retention.ms %s (%v, %v), want 20s", d, ok, err)
	}
}
