package stream

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"
)

// slowCopies makes every fetch of w's changelog from an offset below end
// take skew on clk, the runtime's clock: a copy of the changelog's first
// end offsets (a full copy) takes that long, as on a slow disk or with a
// big changelog; reading past them (a tail) does not. It returns how many
// fetches it slowed.
func slowCopies(t *testing.T, w *kvWorld, clk *skewClock, end int64, skew time.Duration) *atomic.Int64 {
	t.Helper()
	id := w.changelogID()
	var n atomic.Int64
	w.cluster.ControlKey(kmsg.Fetch.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
		w.cluster.KeepControl()
		for _, tp := range req.(*kmsg.FetchRequest).Topics {
			if tp.TopicID != id && tp.Topic != w.changelog {
				continue
			}
			for _, pt := range tp.Partitions {
				if pt.FetchOffset < end {
					clk.skew.Add(int64(skew))
					n.Add(1)
					return nil, nil, false
				}
			}
		}
		return nil, nil, false
	})
	return &n
}

// changelogEnd lists w's changelog's end offset.
func (w *kvWorld) changelogEnd() int64 {
	w.t.Helper()
	offs, err := kadm.NewClient(w.cl).ListEndOffsets(context.Background(), w.changelog)
	if err != nil {
		w.t.Fatal(err)
	}
	o, _ := offs.Lookup(w.changelog, 0)
	return o.Offset
}

// gaugeValue returns the value of gauge name with label partition="0"
// in reg, and whether it is there.
func gaugeValue(t *testing.T, reg *prometheus.Registry, name string) (float64, bool) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "partition" && l.GetValue() == "0" {
					return m.GetGauge().GetValue(), true
				}
			}
		}
	}
	return 0, false
}

// TestStandbyCopyOutlastingHorizonGivesUp: a standby whose full copy of
// the changelog always takes longer than the restore horizon (here each
// copy's one fetch takes 100 s of a 54 s horizon) never dates a copy, and
// used to start over every second for ever. After maxHorizonAttempts
// copies in a row it stops copying, wipes its copy (no warm copy for the
// group's balancer), says so (the attempts gauge, the
// horizon-exceeded counter, a log line naming the delete.retention.ms a
// copy at the measured pace needs), and copies again once the changelog's
// delete.retention.ms is raised: to the value it named, the copy fits.
func TestStandbyCopyOutlastingHorizonGivesUp(t *testing.T) {
	t.Parallel()
	w := newKVWorld(t, map[string]*string{"cleanup.policy": ptr("compact"), "delete.retention.ms": ptr("60000")})
	clk := &skewClock{}
	obs, logs := observer.New(zap.WarnLevel)
	reg := prometheus.NewRegistry()
	rt, cl := w.standbyRuntime(clk, zap.New(zapcore.NewTee(zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel)).Core(), obs)), reg)
	if err := cl.ProduceSync(context.Background(), kvRecords("k", "v", "x", "1")...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	e0 := w.changelogEnd()
	slow := slowCopies(t, w, clk, e0, 100*time.Second)

	rt.sb.mu.Lock()
	rt.sb.start(0)
	rt.sb.mu.Unlock()

	gaveUp := func() []observer.LoggedEntry {
		return logs.FilterField(zap.Int("copies", maxHorizonAttempts)).FilterLevelExact(zap.ErrorLevel).All()
	}
	deadline := time.Now().Add(20 * time.Second)
	for len(gaveUp()) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the standby did not give up in 20 s: it started its copy %d times, each outlasting the horizon (%d restarts logged)",
				slow.Load(), logs.FilterMessageSnippet("copying the partition again").Len())
		}
		time.Sleep(20 * time.Millisecond)
	}
	n := slow.Load()
	time.Sleep(3 * time.Second)
	if m := slow.Load(); m != n || n != maxHorizonAttempts {
		t.Fatalf("the standby made %d slow copies by the time it gave up, %d three seconds later; want %d, and no more", n, m, maxHorizonAttempts)
	}
	// Not copying, its copy is not caught up: neither the status page nor
	// the lag gauge says so, and a deferred partition is not taken for it
	// (maybeForce would make this member own it, to restore it in full).
	rt.EachStandbyStatus(func(p int32, off, lag int64) {
		if lag >= 0 {
			t.Errorf("the standby that gave up reports partition %d at offset %d, %d behind; want the lag not known", p, off, lag)
		}
	})
	if v, ok := gaugeValue(t, reg, "meterline_stream_standby_lag_records"); ok {
		t.Errorf("meterline_stream_standby_lag_records{partition=0} = %v after the standby gave up; want it not exported", v)
	}
	rt.sb.mu.Lock()
	rt.sb.deferred = []int32{0}
	rt.sb.mu.Unlock()
	rt.sb.client.Store(cl)
	rt.sb.maybeForce()
	rt.sb.mu.Lock()
	forced := rt.sb.deferred == nil
	rt.sb.deferred = nil
	rt.sb.mu.Unlock()
	if forced {
		t.Error("the standby that gave up counts as caught up: a rebalance was forced to take its partition")
	}
	// Nor is its copy warm for the group's balancer: a member it told of
	// a checkpoint (even one at the log start) would rank above a member
	// without one, and take the partition to restore it in full at the
	// pace that just failed.
	if off, ok := rt.sb.warmCopies()[0]; ok {
		t.Errorf("the standby that gave up advertises a warm copy of partition 0 at offset %d; want none", off)
	}
	if _, ok, err := rt.store.Checkpoint(0); err != nil || ok {
		t.Errorf("the standby that gave up keeps a checkpoint of partition 0 (err %v); want none", err)
	}
	if v, ok := gaugeValue(t, reg, "meterline_stream_horizon_attempts"); !ok || v != maxHorizonAttempts {
		t.Errorf("meterline_stream_horizon_attempts{partition=0} = %v (exported: %v), want %d", v, ok, maxHorizonAttempts)
	}
	if got := restores(t, reg)["horizon_exceeded"]; got != 1 {
		t.Errorf("meterline_stream_restore_horizon_exceeded_total = %v, want 1", got)
	}
	e := gaveUp()[0]
	needed, ok := e.ContextMap()["delete_retention_needed"].(time.Duration)
	// Each copy took 100 s (and a little): twice that, and the margin.
	if !ok || needed < 200*time.Second || needed > 220*time.Second {
		t.Fatalf("the give-up log line names delete_retention_needed %v (%v); want about 2 × 100 s + 6 s: %s %v", needed, ok, e.Message, e.ContextMap())
	}
	if !strings.Contains(e.Message, "raise delete.retention.ms") {
		t.Errorf("the give-up log line does not say what to change: %s", e.Message)
	}

	// The operator raises delete.retention.ms to the value named; once the
	// cached value is stale the standby copies again, and that copy fits.
	w.setDeleteRetention(fmt.Sprint(needed.Milliseconds()))
	clk.skew.Add(int64(retentionTTL))
	resumed := clk.Now()
	deadline = time.Now().Add(20 * time.Second)
	for {
		cp, _, err := rt.store.Checkpoint(0)
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := gaugeValue(t, reg, "meterline_stream_horizon_attempts"); cp.Offset >= e0 && cp.At.After(resumed) && !ok {
			break
		}
		if time.Now().After(deadline) {
			v, ok := gaugeValue(t, reg, "meterline_stream_horizon_attempts")
			t.Fatalf("the standby did not date a copy in 20 s after delete.retention.ms was raised to %s (checkpoint %+v, resumed at %s, %d slow copies, attempts gauge %v exported %v)",
				needed, cp, resumed, slow.Load(), v, ok)
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, k := range []string{"k", "x"} {
		if _, ok, err := rt.store.Get(0, []byte(k)); err != nil || !ok {
			t.Fatalf("the standby's copy lacks %s (err %v)", k, err)
		}
	}
}

// TestFullRestoreOutlastingHorizonIsRefused: a full restore whose copy
// always takes longer than the restore horizon (each copy takes 100 s of a
// 54 s horizon) used to start over for ever, back to back, its partition
// never processed. After maxHorizonAttempts copies in a row it is refused
// as one expected not to fit (ErrRestoreHorizon), with the
// delete.retention.ms to set; the copies' pace becomes the restore rate
// estimate, so the stage started again refuses at once.
func TestFullRestoreOutlastingHorizonIsRefused(t *testing.T) {
	t.Parallel()
	w, clk := rateSampleWorld(t)
	slow := slowCopies(t, w, clk, w.changelogEnd(), 100*time.Second)
	w.send("z", "1")
	fsB := vfs.NewMem()
	reg, err := w.run("b", fsB, clk)
	if !errors.Is(err, ErrRestoreHorizon) || !strings.Contains(err.Error(), "raise delete.retention.ms") {
		t.Fatalf("b's Run: %v; want ErrRestoreHorizon naming the delete.retention.ms to set", err)
	}
	if n := slow.Load(); n < maxHorizonAttempts {
		t.Errorf("b made %d slow fetches, want at least one a copy (%d)", n, maxHorizonAttempts)
	}
	expectRestores(t, "b", reg, map[string]float64{"full/no_state": maxHorizonAttempts, "horizon_exceeded": 1})

	// Started again, b expects a full restore at that pace to take about
	// 100 s, more than half of delete.retention.ms: it refuses before
	// copying.
	n := slow.Load()
	reg, err = w.run("b", fsB, clk)
	if !errors.Is(err, ErrRestoreHorizon) || !strings.Contains(err.Error(), "expected to take") {
		t.Fatalf("b's Run, again: %v; want ErrRestoreHorizon for a full restore expected not to fit", err)
	}
	if m := slow.Load(); m != n {
		t.Errorf("b, started again, made %d slow fetches; want none", m-n)
	}
	expectRestores(t, "b, again", reg, map[string]float64{"full/no_state": 1, "horizon_exceeded": 1})
}

// rateSampleWorld returns a kvWorld whose changelog (delete.retention.ms
// 60 s) instance "a" wrote minRateSample records to, enough for a copy to
// measure the restore rate, and the skewable clock a ran on.
func rateSampleWorld(t *testing.T) (*kvWorld, *skewClock) {
	t.Helper()
	w := newKVWorld(t, map[string]*string{"cleanup.policy": ptr("compact"), "delete.retention.ms": ptr("60000")})
	clk := &skewClock{}
	kv := make([]string, 0, 2*minRateSample)
	for i := range minRateSample {
		kv = append(kv, fmt.Sprint("k", i), "v")
	}
	w.send(kv...)
	if _, err := w.run("a", vfs.NewMem(), clk); err != nil {
		t.Fatal(err)
	}
	return w, clk
}

// TestHorizonAdvice: what a copy refused for the horizon tells the
// operator, from its pace. A copy that read a third of the changelog in
// the horizon needs three times as long; one chasing a growing changelog
// needs the time to close the gap at what it gains on the end; one that
// does not gain, or reads nothing, is not helped by any
// delete.retention.ms.
func TestHorizonAdvice(t *testing.T) {
	rt := &Runtime{cfg: Config{ChangelogTopic: "c"}}
	const r = time.Minute
	for _, tc := range []struct {
		name   string
		pace   copyPace
		needed time.Duration
		says   string
	}{
		// 3 min for the copy: 6 min + 6 s + 1 s.
		{"restore", copyPace{Read: 1000, Left: 2000, Elapsed: r}, 6*r + 7*time.Second, "the copy takes 3m0s to the end; raise delete.retention.ms of c to at least 6m7s"},
		// Reads 3000 offsets/min, the end moves 1000/min: it gains 2000
		// a minute on the 3000 left, 2.5 min in all.
		{"moving target", copyPace{Read: 3000, Left: 3000, Grown: 1000, Elapsed: r}, 5*r + 7*time.Second, "the copy takes 2m30s to the end"},
		{"no gain", copyPace{Read: 1000, Left: 5000, Grown: 1000, Elapsed: r}, 0, "the changelog grows faster than the copy reads it"},
		{"stalled", copyPace{Read: 0, Left: 5000, Elapsed: r}, 0, "its reads stall"},
		// The "restore" copy, after waiting 2 min at an open
		// transaction's LSO: its pace is that of its minute of reading.
		{"slow and stalled", copyPace{Read: 1000, Left: 2000, Elapsed: 3 * r, Stalled: 2 * r}, 6*r + 7*time.Second, "the copy takes 3m0s to the end; raise delete.retention.ms of c to at least 6m7s"},
		// Growth is per second of Elapsed (the end moves while the copy
		// waits): it reads 3000 offsets per minute of reading, the end
		// moves 1000 per minute of the two; it gains 2000 a minute on the
		// 4000 between its start and the end then, 2 min in all.
		{"moving target, stalled", copyPace{Read: 3000, Left: 3000, Grown: 2000, Elapsed: 2 * r, Stalled: r}, 4*r + 7*time.Second, "the copy takes 2m0s to the end"},
		// A copy that read everything in a second and waited the rest
		// (an open transaction, an outage): the wait, not
		// delete.retention.ms, made it outlast the horizon.
		{"fast, stalled", copyPace{Read: 1000, Elapsed: r, Stalled: r - time.Second}, 0, "without the wait the copy takes 1s to the end, which delete.retention.ms fits, and a copy fits once the wait ends (a previous owner's open transaction"},
		{"only stalled", copyPace{Read: 1000, Elapsed: r, Stalled: r}, 0, "it spent the time waiting"},
	} {
		msg, needed := rt.horizonAdvice(0, 2, &horizonError{retention: r, pace: tc.pace})
		if needed != tc.needed || !strings.Contains(msg, tc.says) || !strings.Contains(msg, "2 copies in a row") {
			t.Errorf("%s: needed %s, %q; want %s, saying %q", tc.name, needed, msg, tc.needed, tc.says)
		}
	}
}

// TestStandbyPauseAdviceFromItsDate: a standby tail that kept up with the
// changelog for ten days and was then paused for two minutes (past the 54 s
// horizon) starts over, and says what a copy at its pace needs. Its pace
// is that of the records read since its last date, over the time since:
// the two minutes, about 4 min of delete.retention.ms, not ten days of
// following the changelog (which made it name 20 days).
func TestStandbyPauseAdviceFromItsDate(t *testing.T) {
	t.Parallel()
	w := newKVWorld(t, map[string]*string{"cleanup.policy": ptr("compact"), "delete.retention.ms": ptr("60000")})
	clk := &skewClock{}
	obs, logs := observer.New(zap.WarnLevel)
	rt, cl := w.standbyRuntime(clk, zap.New(zapcore.NewTee(zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel)).Core(), obs)),
		prometheus.NewRegistry())
	put := func(kv ...string) {
		t.Helper()
		if err := cl.ProduceSync(context.Background(), kvRecords(kv...)...).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	waitDated := func(what string, after time.Time) {
		t.Helper()
		awaitCheckpoint(t, w, rt, what, func(cp Checkpoint, end int64) bool { return cp.Offset >= end && !cp.At.Before(after) })
	}
	put("k", "v", "x", "1")
	g := gateFetches(w.cluster, nil)
	_, listings := countListings(w.cluster, w.changelog)
	rt.sb.mu.Lock()
	rt.sb.start(0)
	rt.sb.mu.Unlock()
	waitDated("the standby to copy the changelog", time.Time{})
	awaitTailDated(t, rt, 0) // a listing of the end dates the copy

	// Ten days of keeping up: its listings date it as they go.
	clk.skew.Add(int64(10 * 24 * time.Hour))
	followed := clk.Now()
	// A listing of the end dates it now, and the copy, idle, writes
	// that date, over a horizon margin newer than the one stored.
	waitDated("the standby to date its idle copy ten days on", followed)
	put("a", "1")
	waitDated("the standby to date its copy ten days on", followed)
	awaitListings(t, listings, 3) // a listing, at the position read

	// Then paused for two minutes.
	g.gated.Store(true)
	put("dummy", "1")
	g.waitHeld(t)
	put("y", "1")
	clk.skew.Add(int64(2 * time.Minute))
	g.open()

	deadline := time.Now().Add(20 * time.Second)
	for logs.FilterField(zap.Int("copies", 1)).Len() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the standby paused past its horizon did not start over in 20 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	e := logs.FilterField(zap.Int("copies", 1)).All()[0]
	needed, ok := e.ContextMap()["delete_retention_needed"].(time.Duration)
	// About 2 × 2 min, and the margin.
	if !ok || needed < 4*time.Minute || needed > 5*time.Minute {
		t.Fatalf("a standby paused for 2 min names delete_retention_needed %v (%v); want about 4 min: %s", needed, ok, e.Message)
	}
}

// awaitTailDated waits up to 20 s until rt's standby tail of partition
// p has dated its copy at a listing of the changelog's end it had read up
// to: the records it read are dated, and a jump of the clock is no pause.
func awaitTailDated(t *testing.T, rt *Runtime, p int32) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		rt.sb.mu.Lock()
		tl := rt.sb.tails[p]
		rt.sb.mu.Unlock()
		if tl != nil && tl.dated.Load() {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the standby of partition %d took no date from a listing of the changelog's end in 20 s", p)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// awaitListings waits up to 20 s until n more ListOffsets requests of
// the changelog (counted by countListings in listings) reach the cluster.
// The standbys list one partition in one round at a time, a round once
// the last ended: with n = 3, the second round began after the call, its
// listing dated and of an end read after it, and was handed to the tail
// before the third began.
func awaitListings(t *testing.T, listings *atomic.Int64, n int64) {
	t.Helper()
	want := listings.Load() + n
	deadline := time.Now().Add(20 * time.Second)
	for listings.Load() < want {
		if time.Now().After(deadline) {
			t.Fatalf("%d ListOffsets requests of the changelog in 20 s, want %d", listings.Load()-want+n, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// awaitCheckpoint waits up to 20 s until ok holds for rt's checkpoint of
// partition 0 and w's changelog end.
func awaitCheckpoint(t *testing.T, w *kvWorld, rt *Runtime, what string, ok func(cp Checkpoint, end int64) bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		cp, _, err := rt.store.Checkpoint(0)
		if err != nil {
			t.Fatal(err)
		}
		e := w.changelogEnd()
		if ok(cp, e) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s (checkpoint %+v, end %d)", what, cp, e)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
