package stream

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/meterline/meterline/internal/clock"
	"github.com/meterline/meterline/internal/kafka"
	"github.com/meterline/meterline/internal/session"
	"github.com/meterline/meterline/internal/testenv"
)

func TestPlanRestore(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	day := 24 * time.Hour
	dated := func(off int64, age time.Duration) Checkpoint { return Checkpoint{Offset: off, At: now.Add(-age)} }
	cases := []struct {
		name string
		in   restoreInput
		full bool
		why  string
		fits bool
	}{
		{name: "no state", in: restoreInput{End: 100, Retention: day}, full: true, why: reasonNoState, fits: true},
		{name: "fresh checkpoint, short tail", in: restoreInput{HasState: true, Checkpoint: dated(90, time.Hour), End: 100, Retention: day},
			why: reasonWithinHorizon, fits: true},
		{name: "nothing past the checkpoint, however old", in: restoreInput{HasState: true, Checkpoint: dated(100, 30*day), End: 100, Retention: day},
			why: reasonCurrent, fits: true},
		{name: "nothing past an undated checkpoint", in: restoreInput{HasState: true, Checkpoint: Checkpoint{Offset: 100}, End: 100, Retention: day},
			why: reasonCurrent, fits: true},
		{name: "checkpoint older than the retention", in: restoreInput{HasState: true, Checkpoint: dated(90, 25*time.Hour), End: 100, Retention: day},
			full: true, why: reasonHorizon, fits: true},
		// 24h − 10% margin (2h24m) = 21h36m: 21h30m plus a tail of 10 min
		// at 1 record/s (600 records) crosses it; 21h20m does not.
		{name: "age + tail estimate + margin reach the retention", in: restoreInput{HasState: true, Checkpoint: dated(400, 21*time.Hour+30*time.Minute),
			End: 1000, Retention: day, Rate: 1}, full: true, why: reasonHorizon, fits: true},
		{name: "age + tail estimate + margin just inside", in: restoreInput{HasState: true, Checkpoint: dated(400, 21*time.Hour+20*time.Minute),
			End: 1000, Retention: day, Rate: 1}, why: reasonWithinHorizon, fits: true},
		{name: "a tail longer than the retention", in: restoreInput{HasState: true, Checkpoint: dated(0, 0),
			End: 1_000_000, Retention: time.Minute, Rate: 1000}, full: true, why: reasonHorizon},
		{name: "undated checkpoint with a tail", in: restoreInput{HasState: true, Checkpoint: Checkpoint{Offset: 50}, End: 100, Retention: day},
			full: true, why: reasonUndated, fits: true},
		{name: "retention unknown", in: restoreInput{HasState: true, Checkpoint: dated(90, time.Minute), End: 100},
			full: true, why: reasonRetentionUnknown},
		{name: "checkpoint below the log start", in: restoreInput{HasState: true, Checkpoint: dated(10, time.Minute), LogStart: 20, End: 100, Retention: day},
			full: true, why: reasonBelowLogStart, fits: true},
		{name: "checkpoint dated in the future beyond the margin", in: restoreInput{HasState: true, Checkpoint: dated(90, -3*time.Hour), End: 100, Retention: day},
			full: true, why: reasonFutureCheckpoint, fits: true},
		{name: "checkpoint dated slightly in the future", in: restoreInput{HasState: true, Checkpoint: dated(90, -time.Minute), End: 100, Retention: day},
			why: reasonWithinHorizon, fits: true},
		// Full restore: 100,000 records at 1,000/s = 100 s; half of 3 min is 90 s.
		{name: "full restore does not fit in half the retention", in: restoreInput{End: 100_000, Retention: 3 * time.Minute, Rate: 1000},
			full: true, why: reasonNoState},
		{name: "full restore fits in half the retention", in: restoreInput{End: 100_000, Retention: 4 * time.Minute, Rate: 1000},
			full: true, why: reasonNoState, fits: true},
		{name: "no measured rate: the default", in: restoreInput{End: defaultRestoreRate * 60, Retention: 2 * time.Minute},
			full: true, why: reasonNoState, fits: true},
		{name: "no measured rate, one record too many", in: restoreInput{End: defaultRestoreRate*60 + 1, Retention: 2 * time.Minute},
			full: true, why: reasonNoState},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			in := c.in
			in.Now = now
			pl := planRestore(in)
			if pl.Full != c.full || pl.Reason != c.why || pl.FullFits != c.fits {
				t.Errorf("planRestore = full %v reason %s fits %v, want full %v reason %s fits %v (%+v)",
					pl.Full, pl.Reason, pl.FullFits, c.full, c.why, c.fits, pl)
			}
		})
	}
}

func TestCheckpointEncoding(t *testing.T) {
	st, err := OpenStore("", vfs.NewMem(), zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if _, ok, err := st.Checkpoint(3); ok || err != nil {
		t.Fatalf("Checkpoint of a partition without state: ok %v, err %v", ok, err)
	}
	at := time.Date(2026, 12, 1, 12, 0, 0, 123_000_000, time.UTC)
	b := st.newBatch()
	b.checkpoint(3, Checkpoint{Offset: 1234, At: at})
	b.checkpoint(4, Checkpoint{Offset: 7})
	if err := b.commit(); err != nil {
		t.Fatal(err)
	}
	if cp, ok, err := st.Checkpoint(3); !ok || err != nil || cp.Offset != 1234 || !cp.At.Equal(at) {
		t.Errorf("Checkpoint(3) = %+v, %v, %v; want offset 1234 at %s", cp, ok, err, at)
	}
	if cp, ok, err := st.Checkpoint(4); !ok || err != nil || cp.Offset != 7 || !cp.At.IsZero() {
		t.Errorf("Checkpoint(4) = %+v, %v, %v; want offset 7, undated", cp, ok, err)
	}
	// A checkpoint of an older version: 8 bytes, no date.
	var v [8]byte
	binary.BigEndian.PutUint64(v[:], 99)
	if err := st.db.Set(partPrefix(prefixCheckpoint, 5), v[:], pebble.NoSync); err != nil {
		t.Fatal(err)
	}
	if cp, ok, err := st.Checkpoint(5); !ok || err != nil || cp.Offset != 99 || !cp.At.IsZero() {
		t.Errorf("legacy Checkpoint(5) = %+v, %v, %v; want offset 99, undated", cp, ok, err)
	}
	if err := st.db.Set(partPrefix(prefixCheckpoint, 6), v[:5], pebble.NoSync); err != nil {
		t.Fatal(err)
	}
	if _, _, err := st.Checkpoint(6); err == nil {
		t.Error("a 5-byte checkpoint was accepted")
	}
}

func TestRestoreRateEstimate(t *testing.T) {
	fs := vfs.NewMem()
	cfg := Config{Config: session.Config{Kafka: kafka.Config{Brokers: []string{"127.0.0.1:1"}}, Group: "g", InstanceID: "i"},
		InputTopic: "in", ChangelogTopic: "cl", FS: fs}
	rt, err := New(cfg, kvProc{})
	if err != nil {
		t.Fatal(err)
	}
	if r := rt.restoreRate(); r != defaultRestoreRate {
		t.Fatalf("rate before any measurement = %v, want the default %v", r, float64(defaultRestoreRate))
	}
	rt.observeRestore(minRateSample-1, time.Millisecond) // too small to measure
	if r := rt.restoreRate(); r != defaultRestoreRate {
		t.Errorf("a replay of %d records moved the rate to %v", minRateSample-1, r)
	}
	rt.observeRestore(20_000, 2*time.Second) // 10,000/s: slower, taken at once
	if r := rt.restoreRate(); r != 10_000 {
		t.Errorf("rate after a 10,000/s replay = %v, want 10000", r)
	}
	rt.observeRestore(110_000, time.Second) // faster: a quarter of the way
	if r := rt.restoreRate(); r != 35_000 {
		t.Errorf("rate after a 110,000/s replay = %v, want 35000", r)
	}
	if err := rt.store.Close(); err != nil {
		t.Fatal(err)
	}
	// Persisted: a new runtime on the same state starts from it.
	rt2, err := New(cfg, kvProc{})
	if err != nil {
		t.Fatal(err)
	}
	defer rt2.store.Close()
	if r := rt2.restoreRate(); r != 35_000 {
		t.Errorf("rate after a restart = %v, want the persisted 35000", r)
	}
}

// kvProc keeps the latest value of every input key; a record without a
// value deletes its key (a changelog tombstone).
type kvProc struct{}

func (kvProc) Open(int32, *PartitionState) (Partition, error) { return kvPart{}, nil }

type kvPart struct{}

func (kvPart) Process(tx *Tx, recs []*kgo.Record) error {
	for _, r := range recs {
		if r.Value == nil {
			tx.Delete(r.Key)
		} else {
			tx.Put(r.Key, r.Value)
		}
	}
	return nil
}
func (kvPart) Punctuate(*Tx) error { return nil }
func (kvPart) Close()              {}

// skewClock is the system clock moved by a settable offset: the runtime's
// timers run in real time while the restore horizon sees a later (or
// earlier) now.
type skewClock struct{ skew atomic.Int64 }

func (c *skewClock) Now() time.Time { return time.Now().Add(time.Duration(c.skew.Load())) }
func (c *skewClock) AfterFunc(d time.Duration, f func()) clock.Timer {
	return time.AfterFunc(d, f)
}

// kvWorld is one input partition and its changelog on kfake, and the
// instances that take turns owning it.
type kvWorld struct {
	t                       *testing.T
	cluster                 *kfake.Cluster
	brokers                 []string
	input, changelog, group string
	cl                      *kgo.Client
}

func newKVWorld(t *testing.T, changelogConfigs map[string]*string) *kvWorld {
	cluster, brokers := testenv.KFake(t)
	w := &kvWorld{t: t, cluster: cluster, brokers: brokers, input: testenv.Name(t, "in"), changelog: testenv.Name(t, "changelog"),
		group: testenv.Name(t, "group")}
	testenv.CreateTopic(t, brokers, w.input, 1, nil)
	testenv.CreateTopic(t, brokers, w.changelog, 1, changelogConfigs)
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(w.input))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	w.cl = cl
	return w
}

// send produces key=value records (a "" value is a delete).
func (w *kvWorld) send(kv ...string) {
	w.t.Helper()
	if err := w.cl.ProduceSync(context.Background(), kvRecords(kv...)...).FirstErr(); err != nil {
		w.t.Fatal(err)
	}
}

// kvRecords returns records of the pairs key, value (a "" value: a
// tombstone).
func kvRecords(kv ...string) []*kgo.Record {
	var recs []*kgo.Record
	for i := 0; i+1 < len(kv); i += 2 {
		r := &kgo.Record{Key: []byte(kv[i])}
		if kv[i+1] != "" {
			r.Value = []byte(kv[i+1])
		}
		recs = append(recs, r)
	}
	return recs
}

// run runs instance id on fs until it has processed the input, then stops
// it. It returns Run's error if Run ended by itself, and the instance's
// metrics.
func (w *kvWorld) run(id string, fs vfs.FS, clk clock.Clock) (*prometheus.Registry, error) {
	w.t.Helper()
	reg := prometheus.NewRegistry()
	return reg, w.runOn(id, fs, clk, reg)
}

// runOn is run, the instance's metrics in reg.
func (w *kvWorld) runOn(id string, fs vfs.FS, clk clock.Clock, reg *prometheus.Registry) error {
	w.t.Helper()
	return w.runWith(id, fs, clk, reg, nil)
}

// runWith is runOn, with hook (when not nil) called on the runtime before
// it runs.
func (w *kvWorld) runWith(id string, fs vfs.FS, clk clock.Clock, reg *prometheus.Registry, hook func(*Runtime)) error {
	w.t.Helper()
	rt, err := New(Config{Stage: "kv",
		Config:     session.Config{Kafka: kafka.Config{Brokers: w.brokers}, Group: w.group, InstanceID: id, SessionTimeout: 6 * time.Second},
		InputTopic: w.input, ChangelogTopic: w.changelog, FS: fs, Clock: clk,
		Logger: zaptest.NewLogger(w.t, zaptest.Level(zap.InfoLevel)).Named(id), Registerer: reg}, kvProc{})
	if err != nil {
		w.t.Fatal(err)
	}
	if hook != nil {
		hook(rt)
	}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	done := make(chan error, 1)
	go func() { done <- rt.Run(ctx) }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		select {
		case err := <-done:
			return err
		case <-time.After(20 * time.Millisecond):
		}
		if ok, err := testenv.CaughtUp(w.brokers, w.group, w.input); err == nil && ok {
			break
		}
		if time.Now().After(deadline) {
			w.t.Fatalf("instance %s did not process the input in 30 s", id)
		}
	}
	stop()
	if err := <-done; err != nil {
		w.t.Fatalf("instance %s: Run: %v", id, err)
	}
	return nil
}

// state returns the instance's local state of partition 0.
func (w *kvWorld) state(fs vfs.FS) map[string]string {
	w.t.Helper()
	st, err := OpenStore("", fs, zap.NewNop())
	if err != nil {
		w.t.Fatal(err)
	}
	defer st.Close()
	out := map[string]string{}
	if err := st.Scan(0, nil, nil, func(k, v []byte) error {
		if k[0] != 0xff { // the runtime's own keys
			out[string(k)] = string(v)
		}
		return nil
	}); err != nil {
		w.t.Fatal(err)
	}
	return out
}

// changelogKeys returns how many records of each key the changelog holds.
func (w *kvWorld) changelogKeys() map[string]int {
	out := map[string]int{}
	for _, r := range testenv.ReadAll(w.t, w.brokers, w.changelog) {
		out[string(r.Key)]++
	}
	return out
}

// restores returns meterline_stream_restores_total by "kind/reason".
func restores(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		switch mf.GetName() {
		case "meterline_stream_restores_total":
			for _, m := range mf.GetMetric() {
				var kind, reason string
				for _, l := range m.GetLabel() {
					switch l.GetName() {
					case "kind":
						kind = l.GetValue()
					case "reason":
						reason = l.GetValue()
					}
				}
				out[kind+"/"+reason] += m.GetCounter().GetValue()
			}
		case "meterline_stream_restore_horizon_exceeded_total":
			for _, m := range mf.GetMetric() {
				out["horizon_exceeded"] += m.GetCounter().GetValue()
			}
		}
	}
	return out
}

func expectRestores(t *testing.T, who string, reg *prometheus.Registry, want map[string]float64) {
	t.Helper()
	got := restores(t, reg)
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: restores %v, want %v", who, got, want)
			return
		}
	}
	for k, v := range got {
		if want[k] != v {
			t.Errorf("%s: restores %v, want %v", who, got, want)
			return
		}
	}
}

// TestStaleStateRestoredInFull is the stale-state rule (docs/design.md,
// Exactly-once, 4) on kfake, with the changelog really compacted: instance
// a keeps k, the partition moves to b, which deletes k; compaction then
// removes the tombstone (delete.retention.ms 1 s) and the partition returns
// to a. A replay of the tail from a's checkpoint would keep its stale k; a
// is past the horizon, so it wipes its state and replays the changelog from
// the start.
func TestStaleStateRestoredInFull(t *testing.T) {
	w := newKVWorld(t, map[string]*string{"cleanup.policy": ptr("compact"), "delete.retention.ms": ptr("1000")})
	fsA, fsB := vfs.NewMem(), vfs.NewMem()
	real := clock.Real{}

	w.send("k", "from-a", "x", "1")
	reg, err := w.run("a", fsA, real)
	if err != nil {
		t.Fatal(err)
	}
	expectRestores(t, "a, first", reg, map[string]float64{"full/no_state": 1})

	w.send("k", "from-b", "k", "") // b updates k, then deletes it
	if reg, err = w.run("b", fsB, real); err != nil {
		t.Fatal(err)
	}
	expectRestores(t, "b", reg, map[string]float64{"full/no_state": 1})
	// A later transaction, so the tombstone is not in the last batch
	// (kfake, like Kafka's active segment, never compacts that).
	w.send("y", "1")
	if reg, err = w.run("b", fsB, real); err != nil {
		t.Fatal(err)
	}
	expectRestores(t, "b, again", reg, map[string]float64{"tail/within_horizon": 1}) // its commit marker
	if n := w.changelogKeys()["k"]; n < 2 {
		t.Fatalf("changelog holds %d records of k before compaction, want a's and b's tombstone", n)
	}
	time.Sleep(1100 * time.Millisecond) // the tombstone is older than delete.retention.ms
	w.cluster.Compact()
	if n := w.changelogKeys()["k"]; n != 0 {
		t.Fatalf("changelog holds %d records of k after compaction, want none", n)
	}

	w.send("z", "1")
	if reg, err = w.run("a", fsA, real); err != nil {
		t.Fatal(err)
	}
	expectRestores(t, "a, back", reg, map[string]float64{"full/horizon": 1})
	got := w.state(fsA)
	if v, ok := got["k"]; ok {
		t.Errorf("a's state still holds k = %q, deleted by b: a tail replay missed the compacted tombstone", v)
	}
	if want := map[string]string{"x": "1", "y": "1", "z": "1"}; len(got) != len(want) || got["x"] != "1" || got["y"] != "1" || got["z"] != "1" {
		t.Errorf("a's state = %v, want %v", got, want)
	}
}

// TestRestoreHorizonDecisions drives the restore plan through the clock
// (a changelog with the default delete.retention.ms of 24 h): a recent
// checkpoint replays its tail; one aged past the horizon, one dated in the
// future and an undated one restore in full.
func TestRestoreHorizonDecisions(t *testing.T) {
	w := newKVWorld(t, map[string]*string{"cleanup.policy": ptr("compact")})
	fsA, fsB := vfs.NewMem(), vfs.NewMem()
	clk := &skewClock{}
	step := 0
	run := func(id string, fs vfs.FS, skew time.Duration, want string) {
		t.Helper()
		step++
		clk.skew.Store(int64(skew))
		w.send("k", fmt.Sprintf("%s-%d", id, step))
		reg, err := w.run(id, fs, clk)
		if err != nil {
			t.Fatal(err)
		}
		expectRestores(t, fmt.Sprintf("%s, step %d", id, step), reg, map[string]float64{want: 1})
	}
	day := 24 * time.Hour
	run("a", fsA, 0, "full/no_state")
	run("b", fsB, 0, "full/no_state")
	run("a", fsA, 0, "tail/within_horizon") // b's records past a's checkpoint
	// Past a's checkpoint: its own last commit marker. 30 days on, it may
	// as well be a tombstone compacted away.
	run("a", fsA, 30*day, "full/horizon")
	run("b", fsB, 29*day, "full/horizon")
	// a's checkpoint is dated 30 days on: 29 days on, it is a day in the
	// future.
	run("a", fsA, 29*day, "full/checkpoint_in_future")
	run("b", fsB, 29*day+time.Hour, "tail/within_horizon") // b's checkpoint: an hour old

	// An undated checkpoint of an older version, with a tail past it.
	st, err := OpenStore("", fsA, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	cp, ok, err := st.Checkpoint(0)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	var v [8]byte
	binary.BigEndian.PutUint64(v[:], uint64(cp.Offset))
	if err := st.db.Set(partPrefix(prefixCheckpoint, 0), v[:], pebble.NoSync); err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	run("a", fsA, 29*day+time.Hour, "full/undated_checkpoint")
	if got, want := w.state(fsA)["k"], fmt.Sprintf("a-%d", step); got != want {
		t.Errorf("a's k = %q after the last run, want %q", got, want)
	}
}

// TestFullRestoreBeyondHorizonRefused: a full restore expected to take
// more than half of delete.retention.ms is refused with ErrRestoreHorizon
// (and counted); a tail restore is not refused, only counted.
func TestFullRestoreBeyondHorizonRefused(t *testing.T) {
	w := newKVWorld(t, map[string]*string{"cleanup.policy": ptr("compact"), "delete.retention.ms": ptr("2000")})
	fsA, fsB := vfs.NewMem(), vfs.NewMem()
	for i := range 20 {
		w.send("k"+string(rune('a'+i)), "v")
	}
	if _, err := w.run("b", fsB, clock.Real{}); err != nil {
		t.Fatal(err)
	}
	// Measured rates of 10 records/s: a full restore of the changelog's 20+
	// offsets takes over 2 s, beyond half of 2 s.
	for _, fs := range []vfs.FS{fsA, fsB} {
		st, err := OpenStore("", fs, zap.NewNop())
		if err != nil {
			t.Fatal(err)
		}
		if err := st.SetRestoreRate(10); err != nil {
			t.Fatal(err)
		}
		if err := st.Close(); err != nil {
			t.Fatal(err)
		}
	}
	w.send("x", "1")
	reg, err := w.run("a", fsA, clock.Real{})
	if !errors.Is(err, ErrRestoreHorizon) {
		t.Fatalf("a (no state, full restore needed): Run = %v, want ErrRestoreHorizon", err)
	}
	expectRestores(t, "a", reg, map[string]float64{"full/no_state": 1, "horizon_exceeded": 1})
	// b's tail (its last commit marker) is short and recent: it runs, and
	// reports the risk.
	if reg, err = w.run("b", fsB, clock.Real{}); err != nil {
		t.Fatalf("b (a recent checkpoint): Run = %v", err)
	}
	expectRestores(t, "b", reg, map[string]float64{"tail/within_horizon": 1, "horizon_exceeded": 1})
}

func ptr(s string) *string { return &s }
