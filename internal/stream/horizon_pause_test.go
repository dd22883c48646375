package stream

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/meterline/meterline/internal/clock"
	"github.com/meterline/meterline/internal/kafka"
	"github.com/meterline/meterline/internal/session"
)

// TestStandbyPausedPastHorizonStartsOver: a standby tail that stops
// reading for longer than the changelog's delete.retention.ms (its
// process paused, its host cut off from the brokers) may find, when it
// reads on, that compaction removed a tombstone it had not read yet. Once
// it catches up it must not date its checkpoint as fresh over that state:
// a promotion would then replay only the tail and keep the deleted key
// (the aggregator would finalize it again). It starts over with a full
// copy instead.
func TestStandbyPausedPastHorizonStartsOver(t *testing.T) {
	t.Parallel()
	w := newKVWorld(t, map[string]*string{"cleanup.policy": ptr("compact"), "delete.retention.ms": ptr("60000")})
	clk := &skewClock{}
	rt, cl := w.standbyRuntime(clk, zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel)), prometheus.NewRegistry())
	adm := kadm.NewClient(cl)
	// The owner's changelog, written here directly (plain records are
	// committed for read_committed readers).
	put := func(kv ...string) {
		t.Helper()
		if err := cl.ProduceSync(context.Background(), kvRecords(kv...)...).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	end := func() int64 {
		t.Helper()
		offs, err := adm.ListEndOffsets(context.Background(), w.changelog)
		if err != nil {
			t.Fatal(err)
		}
		o, _ := offs.Lookup(w.changelog, 0)
		return o.Offset
	}
	checkpoint := func() Checkpoint {
		t.Helper()
		cp, _, err := rt.store.Checkpoint(0)
		if err != nil {
			t.Fatal(err)
		}
		return cp
	}

	waitFor := func(what string, cond func() bool) {
		t.Helper()
		awaitCheckpoint(t, w, rt, what, func(Checkpoint, int64) bool { return cond() })
	}
	put("k", "v", "x", "1")
	// The standby's fetches are held while gated: it stops reading, as a
	// paused process would.
	g := gateFetches(w.cluster, nil)

	rt.sb.mu.Lock()
	rt.sb.start(0)
	rt.sb.mu.Unlock()
	e := end()
	waitFor("the standby to copy the changelog", func() bool { return checkpoint().Offset >= e })

	g.gated.Store(true)
	put("dummy", "1") // answers a fetch already waiting; the next one is held
	g.waitHeld(t)
	// While the standby reads nothing, the owner deletes k, and after
	// delete.retention.ms compaction removes the tombstone with k's value
	// (the later record keeps the tombstone out of the last batch, which
	// is never compacted).
	put("k", "")
	put("y", "1")
	compactTombstones(t, w)
	clk.skew.Store(int64(2 * time.Minute)) // the pause lasted two retentions
	resumed := clk.Now()
	g.open()

	e = end()
	waitFor("the standby to catch up", func() bool { return checkpoint().Offset >= e })
	// Its next listing of the changelog's end, and a record past it to
	// commit a checkpoint with the date that listing gives.
	time.Sleep(1500 * time.Millisecond)
	put("z", "1")
	e = end()
	waitFor("the standby to date its copy", func() bool {
		cp := checkpoint()
		return cp.Offset >= e && !cp.At.Before(resumed)
	})
	if n := w.changelogKeys()["k"]; n != 0 {
		t.Fatalf("the changelog holds %d records of k after compaction, want none", n)
	}
	if v, ok, err := rt.store.Get(0, []byte("k")); err != nil || ok {
		t.Fatalf("the standby's copy, dated %s (fresh: a promotion replays only its tail), holds k = %q (err %v): the owner deleted k, and compaction removed the tombstone while the standby was paused",
			checkpoint().At.Format(time.RFC3339Nano), v, err)
	}
	for _, k := range []string{"x", "dummy", "y", "z"} {
		if _, ok, err := rt.store.Get(0, []byte(k)); err != nil || !ok {
			t.Fatalf("the standby's copy lacks %s (err %v)", k, err)
		}
	}
}

// setDeleteRetention sets delete.retention.ms of w's changelog to ms.
func (w *kvWorld) setDeleteRetention(ms string) {
	w.t.Helper()
	rs, err := kadm.NewClient(w.cl).AlterTopicConfigs(context.Background(), []kadm.AlterConfig{{Name: "delete.retention.ms", Value: ptr(ms)}}, w.changelog)
	if err == nil {
		_, err = rs.On(w.changelog, nil)
	}
	if err != nil {
		w.t.Fatal(err)
	}
}

// standbyRuntime returns a runtime of instance "s" on w, with one standby
// replica, whose tails the test starts, and a client that produces to w's
// changelog as its owner would (plain records are committed for
// read_committed readers).
func (w *kvWorld) standbyRuntime(clk clock.Clock, log *zap.Logger, reg prometheus.Registerer) (*Runtime, *kgo.Client) {
	t := w.t
	t.Helper()
	rt, err := New(Config{Stage: "kv",
		Config:     session.Config{Kafka: kafka.Config{Brokers: w.brokers}, Group: w.group, InstanceID: "s"},
		InputTopic: w.input, ChangelogTopic: w.changelog, FS: vfs.NewMem(), Clock: clk, StandbyReplicas: 1,
		Logger: log, Registerer: reg}, kvProc{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		rt.sb.stopAll()
		rt.restores.Wait()
		_ = rt.store.Close()
	})
	cl, err := kgo.NewClient(kgo.SeedBrokers(w.brokers...), kgo.DefaultProduceTopic(w.changelog))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return rt, cl
}

// fetchGate holds Fetch requests while gated (SleepControl: the cluster
// serves other requests meanwhile), all of them or those naming topic ID
// id, until open.
type fetchGate struct {
	gated   atomic.Bool
	held    chan struct{}
	release chan struct{}
}

func gateFetches(cluster *kfake.Cluster, id *[16]byte) *fetchGate {
	g := &fetchGate{held: make(chan struct{}, 1), release: make(chan struct{})}
	cluster.ControlKey(kmsg.Fetch.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
		cluster.KeepControl()
		if !g.gated.Load() {
			return nil, nil, false
		}
		if id != nil {
			ours := false
			for _, t := range req.(*kmsg.FetchRequest).Topics {
				ours = ours || t.TopicID == *id
			}
			if !ours {
				return nil, nil, false
			}
		}
		select {
		case g.held <- struct{}{}:
		default:
		}
		cluster.SleepControl(func() { <-g.release })
		return nil, nil, false
	})
	return g
}

func (g *fetchGate) waitHeld(t *testing.T) {
	t.Helper()
	select {
	case <-g.held:
	case <-time.After(20 * time.Second):
		t.Fatal("no fetch was held")
	}
}

func (g *fetchGate) open() {
	g.gated.Store(false)
	close(g.release)
}

// gateChangelog holds the fetches of w's changelog from now on, until
// open.
func gateChangelog(t *testing.T, w *kvWorld) *fetchGate {
	t.Helper()
	id := w.changelogID()
	g := gateFetches(w.cluster, &id)
	g.gated.Store(true)
	return g
}

// changelogID returns the topic ID of w's changelog.
func (w *kvWorld) changelogID() [16]byte {
	w.t.Helper()
	topics, err := kadm.NewClient(w.cl).ListTopics(context.Background(), w.changelog)
	if err != nil {
		w.t.Fatal(err)
	}
	return [16]byte(topics[w.changelog].ID)
}

// compactTombstones compacts the changelog as Kafka does once its
// tombstones are older than delete.retention.ms: it sets that to 0 for
// kfake's compaction, then back to 60 s, which is what the runtime reads.
func compactTombstones(t *testing.T, w *kvWorld) {
	t.Helper()
	w.setDeleteRetention("0")
	time.Sleep(10 * time.Millisecond)
	w.cluster.Compact()
	w.setDeleteRetention("60000")
}

// TestRestorePausedPastHorizonRestoresInFull: a restore that plans a tail
// replay within the horizon of its checkpoint's date, then stops reading
// for longer than delete.retention.ms (paused, or its fetches stalled),
// may find that compaction removed a tombstone it had not read yet. It
// must not install that state (the partition's next commit dates its
// checkpoint now, and the deleted key would live on); it restores in full
// instead.
func TestRestorePausedPastHorizonRestoresInFull(t *testing.T) {
	t.Parallel()
	w := newKVWorld(t, map[string]*string{"cleanup.policy": ptr("compact"), "delete.retention.ms": ptr("60000")})
	fsA, fsB := vfs.NewMem(), vfs.NewMem()
	clk := &skewClock{}

	w.send("k", "from-a", "x", "1")
	if _, err := w.run("a", fsA, clk); err != nil {
		t.Fatal(err)
	}
	w.send("k", "from-b", "k", "") // b updates k, then deletes it
	if _, err := w.run("b", fsB, clk); err != nil {
		t.Fatal(err)
	}
	// A later transaction, so the tombstone is not in the last batch.
	w.send("y", "1")
	if _, err := w.run("b", fsB, clk); err != nil {
		t.Fatal(err)
	}

	g := gateChangelog(t, w)
	go func() {
		// a's restore plans a tail replay (its checkpoint is recent), and
		// its first fetch of the changelog is held: meanwhile compaction
		// removes b's tombstone of k, and two retentions pass.
		g.waitHeld(t)
		compactTombstones(t, w)
		clk.skew.Store(int64(2 * time.Minute))
		g.open()
	}()
	w.send("z", "1")
	reg, err := w.run("a", fsA, clk)
	if err != nil {
		t.Fatal(err)
	}
	if n := w.changelogKeys()["k"]; n != 0 {
		t.Fatalf("the changelog holds %d records of k after compaction, want none", n)
	}
	got := w.state(fsA)
	if v, ok := got["k"]; ok {
		t.Errorf("a's state holds k = %q, deleted by b: its tail replay read past the horizon and missed the compacted tombstone", v)
	}
	if want := map[string]string{"x": "1", "y": "1", "z": "1"}; len(got) != len(want) || got["x"] != "1" || got["y"] != "1" || got["z"] != "1" {
		t.Errorf("a's state = %v, want %v", got, want)
	}
	expectRestores(t, "a, back", reg, map[string]float64{"tail/within_horizon": 1, "full/horizon": 1})
}

// TestFullRestorePausedPastHorizonStartsOver: a full restore whose reads
// stall for longer than the changelog's delete.retention.ms (a previous
// owner's open transaction holds the read at its LSO, the process is
// paused) may have missed a tombstone compacted away meanwhile. It writes
// nothing more under its date and starts over; the stage does not stop,
// and the copy that reads in time is installed.
func TestFullRestorePausedPastHorizonStartsOver(t *testing.T) {
	t.Parallel()
	w := newKVWorld(t, map[string]*string{"cleanup.policy": ptr("compact"), "delete.retention.ms": ptr("60000")})
	clk := &skewClock{}
	w.send("k", "v", "x", "1")
	if _, err := w.run("a", vfs.NewMem(), clk); err != nil {
		t.Fatal(err)
	}
	g := gateChangelog(t, w)
	go func() {
		// b has no state: its restore is a full one, and its first fetch
		// of the changelog is held while two retentions pass.
		g.waitHeld(t)
		clk.skew.Store(int64(2 * time.Minute))
		g.open()
	}()
	w.send("z", "1")
	fsB := vfs.NewMem()
	reg, err := w.run("b", fsB, clk)
	if err != nil {
		t.Fatalf("b stopped: %v", err)
	}
	if got := w.state(fsB); len(got) != 3 || got["k"] != "v" || got["x"] != "1" || got["z"] != "1" {
		t.Errorf("b's state = %v, want k=v x=1 z=1", got)
	}
	expectRestores(t, "b", reg, map[string]float64{"full/no_state": 2})
}
