package stream

import (
	"context"
	"maps"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/meterline/meterline/internal/clock"
	"github.com/meterline/meterline/internal/kafka"
	"github.com/meterline/meterline/internal/session"
)

// startOwner runs instance id of w on fs until the returned stop (or the
// test's end), looking for idle partitions to re-date every 20 ms.
func (w *kvWorld) startOwner(id string, fs vfs.FS, clk clock.Clock, log *zap.Logger) (*Runtime, func()) {
	t := w.t
	t.Helper()
	rt, err := New(Config{Stage: "kv",
		Config:     session.Config{Kafka: kafka.Config{Brokers: w.brokers}, Group: w.group, InstanceID: id, SessionTimeout: 6 * time.Second},
		InputTopic: w.input, ChangelogTopic: w.changelog, FS: fs, Clock: clk, Logger: log}, kvProc{})
	if err != nil {
		t.Fatal(err)
	}
	rt.redatePoll = 20 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- rt.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("instance %s: Run: %v", id, err)
			}
		})
	}
	t.Cleanup(stop)
	return rt, stop
}

// observed returns a logger to the test's log (info and above) and to
// logs, from level.
func observed(t *testing.T, level zapcore.Level) (*zap.Logger, *observer.ObservedLogs) {
	obs, logs := observer.New(level)
	return zap.New(zapcore.NewTee(zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel)).Core(), obs)), logs
}

// Log lines of redate.go.
const (
	logRedated    = "re-dated the checkpoints of idle owned partitions"
	logNotRedated = "not re-dating the checkpoint of an owned partition: its changelog moved past it (a transaction of this member's aborted there, or another member writes the partition and this one was fenced)"
)

// TestIdleOwnerStaysWarm: an owned partition whose input stops keeps a
// checkpoint dated by the commit that wrote it; its copy, current all
// along, must not age out of the restore horizon with it. The owner
// re-dates it while its changelog does not move: started again two
// minutes later (two retentions), the member still tells the group's
// balancer of its copy, and its restore replays the tail (its last commit
// marker) rather than starting over from the changelog's start.
func TestIdleOwnerStaysWarm(t *testing.T) {
	t.Parallel()
	w := newKVWorld(t, map[string]*string{"cleanup.policy": ptr("compact"), "delete.retention.ms": ptr("60000")})
	w.send("k", "v")
	clk := &skewClock{}
	fs := vfs.NewMem()
	rt, stop := w.startOwner("a", fs, clk, zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel)))
	awaitCheckpoint(t, w, rt, "the owner to commit its input", func(cp Checkpoint, end int64) bool { return end > 0 && cp.Offset == end-1 })
	cp0, _, err := rt.store.Checkpoint(0)
	if err != nil {
		t.Fatal(err)
	}

	clk.skew.Store(int64(2 * time.Minute)) // no input meanwhile
	moved := clk.Now().Truncate(time.Millisecond)
	awaitCheckpoint(t, w, rt, "the owner to re-date its idle partition's checkpoint", func(cp Checkpoint, _ int64) bool { return !cp.At.Before(moved) })
	stop()
	st, err := OpenStore("", fs, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	cp, _, err := st.Checkpoint(0)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	if cp.Offset != cp0.Offset {
		t.Fatalf("re-dated checkpoint at offset %d, was %d", cp.Offset, cp0.Offset)
	}

	// Started again: it joins with its copy advertised, and restores the
	// tail.
	rt2, err := New(Config{Stage: "kv",
		Config:     session.Config{Kafka: kafka.Config{Brokers: w.brokers}, Group: w.group, InstanceID: "a"},
		InputTopic: w.input, ChangelogTopic: w.changelog, FS: fs, Clock: clk, Logger: zap.NewNop()}, kvProc{})
	if err != nil {
		t.Fatal(err)
	}
	if got := rt2.sb.warmCopies(); !maps.Equal(got, map[int32]int64{0: cp0.Offset}) {
		t.Errorf("restarted two retentions after its last input, the owner advertises %v, want {0: %d}", got, cp0.Offset)
	}
	if err := rt2.store.Close(); err != nil {
		t.Fatal(err)
	}
	// Input for it: run returns once it is processed, so after the
	// restore (with nothing new, the group's offsets are caught up before
	// the member has even joined).
	w.send("k", "v2")
	reg, err := w.run("a", fs, clk)
	if err != nil {
		t.Fatal(err)
	}
	expectRestores(t, "a, restarted", reg, map[string]float64{"tail/within_horizon": 1})
}

// TestFencedOwnerNotRedated: an owner that was fenced (another member owns
// the partition and writes its changelog, and this one has not heard yet)
// holds a copy that is not current: it must never date it anew. Its
// listing shows the changelog past its checkpoint, by a committed
// transaction (end = checkpoint + 3: its own commit marker, a record, the
// other's marker) or by a transaction still open at the end (end =
// checkpoint + 1 after a restore: one record, not its own marker). A
// record written outside a transaction (end = checkpoint + 1 after a
// restore, no transaction open) is not taken for its own marker either.
// Nor is the stale end of the changelog's former leader, paused and just
// resumed, which still lists the owner's own commit as the end (the
// listing is fenced by the leader epoch).
//
// Before the other member writes, the owner's copy is current, and it
// re-dates it once the date is a tenth of delete.retention.ms (6 s) old;
// the restored checkpoint keeps the date of the first run's commit, so on
// a loaded machine that can happen before the other writes. What must not
// happen is a date taken after the other's write returned: a listing
// started then sees it.
func TestFencedOwnerNotRedated(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name    string
		restart bool // restored: the checkpoint is the end; the other's transaction stays open
		plain   bool // the other writes without a transaction (restart)
		stale   bool // the former leader lists the end of the owner's own commit
	}{
		{name: "committed past its own commit"},
		{name: "committed past its own commit, listed by a stale leader", stale: true},
		{name: "open past its restore", restart: true},
		{name: "plain record past its restore", restart: true, plain: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			w := newKVWorld(t, map[string]*string{"cleanup.policy": ptr("compact"), "delete.retention.ms": ptr("60000")})
			w.send("k", "v")
			clk := &skewClock{}
			fs := vfs.NewMem()
			if c.restart {
				if _, err := w.run("a", fs, clk); err != nil {
					t.Fatal(err)
				}
			}
			log, logs := observed(t, zap.DebugLevel)
			rt, _ := w.startOwner("a", fs, clk, log)
			awaitCheckpoint(t, w, rt, "the owner's checkpoint", func(cp Checkpoint, end int64) bool {
				return end > 0 && (cp.Offset == end-1 && !c.restart || cp.Offset == end && c.restart)
			})
			cp0, _, err := rt.store.Checkpoint(0)
			if err != nil {
				t.Fatal(err)
			}

			opts := []kgo.Opt{kgo.SeedBrokers(w.brokers...), kgo.DefaultProduceTopic(w.changelog), kgo.RecordPartitioner(kgo.ManualPartitioner())}
			if !c.plain {
				opts = append(opts, kgo.TransactionalID(w.group+"-other"))
			}
			other, err := kgo.NewClient(opts...)
			if err != nil {
				t.Fatal(err)
			}
			defer other.Close()
			if !c.plain {
				if err := other.BeginTransaction(); err != nil {
					t.Fatal(err)
				}
			}
			if err := other.ProduceSync(context.Background(), &kgo.Record{Key: []byte("k"), Value: []byte("from-other")}).FirstErr(); err != nil {
				t.Fatal(err)
			}
			written := clk.Now().Round(0)
			if !c.restart {
				if err := other.EndTransaction(context.Background(), kgo.TryCommit); err != nil {
					t.Fatal(err)
				}
			}
			want := cp0.Offset + 3
			if c.restart {
				want = cp0.Offset + 1
			}
			if end := w.changelogEnd(); end != want {
				t.Fatalf("changelog end %d after the other member wrote, checkpoint %d", end, cp0.Offset)
			}
			if c.stale {
				staleLeader(w, cp0.Offset+1, 2, false)
			}

			clk.skew.Store(int64(2 * time.Minute))
			awaitFencedLook(t, logs, written)
			time.Sleep(200 * time.Millisecond) // several more looks
			if cp, _, err := rt.store.Checkpoint(0); err != nil || cp.Offset != cp0.Offset || cp.At.After(written) {
				t.Errorf("a fenced owner's checkpoint went from %+v to %+v, the other member wrote at %s (%v)", cp0, cp, written, err)
			}
			if late := redatedAfter(t, logs, written); len(late) != 0 {
				t.Errorf("a fenced owner re-dated its checkpoint at %v, after the other member wrote at %s", late, written)
			}
			if got := rt.sb.warmCopies(); len(got) != 0 {
				t.Errorf("a fenced owner advertises %v two retentions after its last commit, want nothing", got)
			}
		})
	}
}

// redatedAfter returns the dates of the re-dates logged in logs that are
// later than t0.
func redatedAfter(t *testing.T, logs *observer.ObservedLogs, t0 time.Time) []time.Time {
	t.Helper()
	var late []time.Time
	for _, e := range logs.FilterMessage(logRedated).All() {
		at, ok := e.ContextMap()["at"].(time.Time)
		if !ok {
			t.Fatalf("%q without its date: %v", logRedated, e.ContextMap())
		}
		if at.After(t0) {
			late = append(late, at)
		}
	}
	return late
}

// awaitFencedLook waits up to 20 s for the owner to look at its changelog
// after another member wrote it at written: it declines to re-date its
// checkpoint, or (failing the test) re-dates it later than written.
func awaitFencedLook(t *testing.T, logs *observer.ObservedLogs, written time.Time) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for logs.FilterMessage(logNotRedated).Len() == 0 {
		if late := redatedAfter(t, logs, written); len(late) != 0 {
			t.Fatalf("a fenced owner re-dated its checkpoint at %v, after the other member wrote at %s", late, written)
		}
		if time.Now().After(deadline) {
			t.Fatalf("no look at the changelog in 20 s after the other member wrote at %s", written)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestOwnerRedateAtMostOncePerTenth: an idle owned partition is re-dated
// once its date is a tenth of delete.retention.ms old (6 s of 60 s), not at
// every look (every 20 ms here), while the clock moves a second every
// 100 ms.
func TestOwnerRedateAtMostOncePerTenth(t *testing.T) {
	t.Parallel()
	w := newKVWorld(t, map[string]*string{"cleanup.policy": ptr("compact"), "delete.retention.ms": ptr("60000")})
	w.send("k", "v")
	clk := &skewClock{}
	log, logs := observed(t, zap.DebugLevel)
	rt, stop := w.startOwner("a", vfs.NewMem(), clk, log)
	awaitCheckpoint(t, w, rt, "the owner to commit its input", func(cp Checkpoint, end int64) bool { return end > 0 && cp.Offset == end-1 })
	cp0, _, err := rt.store.Checkpoint(0)
	if err != nil {
		t.Fatal(err)
	}
	for range 40 {
		time.Sleep(100 * time.Millisecond)
		clk.skew.Add(int64(time.Second))
	}
	stop()
	last := cp0.At
	n := 0
	for _, e := range logs.FilterMessage(logRedated).All() {
		at, ok := e.ContextMap()["at"].(time.Time)
		if !ok {
			t.Fatalf("%q without its date: %v", logRedated, e.ContextMap())
		}
		if d := at.Sub(last); d < 6*time.Second {
			t.Errorf("re-dated at %s, %s after the previous date: less than a tenth of delete.retention.ms", at, d)
		}
		last = at
		n++
	}
	// 40 s of clock: about one every 6 s.
	if n < 3 || n > 7 {
		t.Errorf("%d re-dates in 40 s of an idle partition with delete.retention.ms 60 s, want about 6", n)
	}
}

// TestIdleSince: what a listing of the changelog must show for an owned
// checkpoint to be re-dated.
func TestIdleSince(t *testing.T) {
	cp := Checkpoint{Offset: 10}
	for _, c := range []struct {
		name     string
		marker   int64
		lso, end int64
		idle     bool
	}{
		{name: "restored to the end", marker: -1, lso: 10, end: 10, idle: true},
		{name: "its own commit marker past it", marker: 10, lso: 11, end: 11, idle: true},
		{name: "one offset past a restored checkpoint: another's record", marker: -1, lso: 11, end: 11},
		{name: "one offset past a checkpoint of an earlier epoch's commit", marker: 7, lso: 11, end: 11},
		{name: "its marker and another's transaction", marker: 10, lso: 13, end: 13},
		{name: "a transaction open below the end", marker: -1, lso: 9, end: 10},
		{name: "its marker not written yet", marker: 10, lso: 10, end: 11},
		{name: "an end listed after a later commit", marker: 10, lso: 11, end: 14},
	} {
		if got := idleSince(cp, c.marker, c.lso, c.end); got != c.idle {
			t.Errorf("%s: idleSince(checkpoint 10, marker %d, lso %d, end %d) = %v, want %v", c.name, c.marker, c.lso, c.end, got, c.idle)
		}
	}
}
