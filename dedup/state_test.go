package dedup

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/internal/stream"
	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/schemas"
)

// tick builds a tick record of partition p at arrival, signed with the
// harness's key as a dedup instance signs its own.
func (h *harness) tick(p int32, arrival int64) *kgo.Record {
	v := schemas.MustEncode(&schemas.Tick{InstanceID: "test"})
	return &kgo.Record{Topic: h.names.EventsTopic(), Partition: p, Value: v, Timestamp: time.UnixMilli(arrival),
		Headers: newKeyring(h.keys).tickHeaders(h.names.EventsTopic(), p, v)}
}

// TestWatermarkForwarding: each tick forwards the partition watermark — the
// largest arrival seen, event or tick — to every usage.deduped partition,
// stating dedup's W, B and S.
func TestWatermarkForwarding(t *testing.T) {
	h := newHarness(t, nil, 2)
	cfg := h.config("a", vfs.NewMem())
	cfg.TickInterval = time.Hour                     // only the test's ticks
	cfg.Bucket, cfg.Skew = 12*time.Hour, 3*time.Hour // not the defaults, which the aggregator assumes
	cfg.WatermarkEvery = time.Millisecond
	h.start(cfg)
	e := h.event("acme", "api_calls", "w1", 1, t0-hour, t0+5000)
	h.produce(e, h.tick(e.Partition, t0+1000)) // tick older than the event
	h.produce(h.tick(1-e.Partition, t0+7000))  // the other partition
	h.produce(h.tick(e.Partition, t0+9000))    // newer tick
	h.caughtUp()

	// Each record states dedup's W, B and S, for the aggregator to check
	// its own.
	wc := cfg
	wc.EnsureDefaults()
	wantW := wc.Window
	// Per deduped partition, in order: the watermarks of each source.
	got := map[[2]int32][]int64{} // (deduped partition, source partition) -> watermarks
	for _, r := range readTopic(t, h, h.names.DedupedTopic()) {
		var w schemas.Watermark
		if k, _ := schemas.PeekKind(r.Value); k != schemas.KindWatermark {
			continue
		}
		if err := schemas.DecodeInto(r.Value, &w); err != nil {
			t.Fatal(err)
		}
		if w.SourcePartitions != 2 {
			t.Errorf("source_partitions %d, want 2", w.SourcePartitions)
		}
		if w.WindowMs != wantW.Milliseconds() {
			t.Errorf("window_ms %d, want dedup's W %s", w.WindowMs, wantW)
		}
		if w.BucketMs != cfg.Bucket.Milliseconds() || w.SkewMs != cfg.Skew.Milliseconds() {
			t.Errorf("bucket_ms %d, skew_ms %d; want dedup's B %s and S %s", w.BucketMs, w.SkewMs, cfg.Bucket, cfg.Skew)
		}
		k := [2]int32{r.Partition, w.SourcePartition}
		got[k] = append(got[k], w.Watermark)
	}
	for target := int32(0); target < 2; target++ {
		// The first tick of e's partition already sees the event's later
		// arrival: the watermark is the largest arrival, event or tick.
		if s := got[[2]int32{target, e.Partition}]; len(s) != 2 || s[0] != t0+5000 || s[1] != t0+9000 {
			t.Errorf("deduped %d, source %d: %v, want [%d %d]", target, e.Partition, s, t0+5000, t0+9000)
		}
		if s := got[[2]int32{target, 1 - e.Partition}]; len(s) != 1 || s[0] != t0+7000 {
			t.Errorf("deduped %d, source %d: %v, want [%d]", target, 1-e.Partition, s, t0+7000)
		}
	}
}

func identityKeys(t *testing.T, st *Stage, p int32) int {
	n := 0
	if err := st.rt.Store().Scan(p, []byte{prefixIdentity}, []byte{prefixIdentity + 1}, func(_, _ []byte) error {
		n++
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestExpiry: a key is forgotten once the watermark passes its bucket's end
// plus W + S; before that a copy is still recognised. Expiry is a range
// delete of whole arrival buckets, never a scan.
func TestExpiry(t *testing.T) {
	h := newHarness(t, nil, 1)
	cfg := h.config("a", vfs.NewMem())
	cfg.Window, cfg.Skew, cfg.Bucket = 2*time.Hour, time.Minute, time.Minute
	cfg.TickInterval = time.Hour
	st := h.start(cfg)
	W, S, B := 2*hour, int64(60_000), int64(60_000)
	arr := t0 + 30_000 // inside bucket [t0, t0+B)
	h.produce(h.event("acme", "api_calls", "x1", 1, arr-1000, arr))
	h.caughtUp()
	if n := identityKeys(t, st.stage, 0); n != 1 {
		t.Fatalf("%d keys after the first copy, want 1", n)
	}
	// A copy just inside the window is still a duplicate.
	h.produce(h.event("acme", "api_calls", "x1", 1, arr-1000, arr-1000+W-1))
	// The watermark reaches the bucket's end + W + S minus 1 ms: kept.
	h.produce(h.tick(0, t0+B+W+S-1))
	h.caughtUp()
	if n := identityKeys(t, st.stage, 0); n != 1 {
		t.Fatalf("%d keys just before expiry, want 1", n)
	}
	h.produce(h.tick(0, t0+B+W+S))
	h.caughtUp()
	deadline := time.Now().Add(10 * time.Second)
	for identityKeys(t, st.stage, 0) != 0 {
		if time.Now().After(deadline) {
			t.Fatal("key not expired after the watermark passed first arrival + W + S (+ bucket)")
		}
		time.Sleep(50 * time.Millisecond)
	}
	o := h.outputs()
	if len(o.deduped) != 1 || len(o.duplicates) != 1 {
		t.Fatalf("deduped %d duplicates %d, want 1 and 1", len(o.deduped), len(o.duplicates))
	}
}

// TestRestartAndWipedState: a restart with the same state replays only the
// changelog tail; a restart with the state directory wiped restores
// everything from the changelog. Either way every later copy is a
// duplicate.
func TestRestartAndWipedState(t *testing.T) {
	h := newHarness(t, nil, 4)
	fs := vfs.NewMem()
	arr := t0 + 10*day
	batch := func(arrival int64) []*kgo.Record {
		var rs []*kgo.Record
		for i := 0; i < 40; i++ {
			rs = append(rs, h.event("cust", "api_calls", "r"+strings.Repeat("x", i%5)+string(rune('A'+i)), 1, arr-hour, arrival))
		}
		return rs
	}
	a := h.start(h.config("a", fs))
	h.produce(batch(arr)...)
	h.caughtUp()
	if err := a.stop(); err != nil {
		t.Fatal(err)
	}

	b := h.start(h.config("a", fs)) // same state
	h.produce(batch(arr + hour)...)
	h.caughtUp()
	if err := b.stop(); err != nil {
		t.Fatal(err)
	}

	c := h.start(h.config("a", vfs.NewMem())) // wiped
	h.produce(batch(arr + 2*hour)...)
	h.caughtUp()
	o := h.outputs()
	if len(o.deduped) != 40 || len(o.duplicates) != 80 {
		t.Fatalf("deduped %d duplicates %d, want 40 and 80", len(o.deduped), len(o.duplicates))
	}
	for id, n := range o.byID() {
		if n != 1 {
			t.Errorf("%s forwarded %d times", id, n)
		}
	}
	_ = c
}

// TestOffsetMismatchStops: if the group's committed offset and the state's
// input offset disagree (someone reset the group), the stage stops with a
// clear error instead of re-counting.
func TestOffsetMismatchStops(t *testing.T) {
	h := newHarness(t, nil, 1)
	fs := vfs.NewMem()
	a := h.start(h.config("a", fs))
	arr := t0 + 10*day
	h.produce(h.event("c", "m", "o1", 1, arr-hour, arr), h.event("c", "m", "o2", 1, arr-hour, arr))
	h.caughtUp()
	if err := a.stop(); err != nil {
		t.Fatal(err)
	}
	adm := testenv.Admin(t, h.brokers)
	var offs kadm.Offsets
	offs.AddOffset(h.names.EventsTopic(), 0, 0, -1)
	if _, err := adm.CommitOffsets(context.Background(), h.group, offs); err != nil {
		t.Fatal(err)
	}
	b := h.start(h.config("a", fs))
	err, ok := b.wait(30 * time.Second)
	if !ok {
		t.Fatal("stage kept running with a reset group offset")
	}
	if !errors.Is(err, stream.ErrOffsetMismatch) {
		t.Fatalf("Run = %v, want ErrOffsetMismatch", err)
	}
	t.Log(err)
}

// TestRenamedGroupStops: a group with another name on the state and
// changelog of the first one has committed nothing; the stage stops and
// says so, instead of counting the input again from its start.
func TestRenamedGroupStops(t *testing.T) {
	h := newHarness(t, nil, 1)
	fs := vfs.NewMem()
	a := h.start(h.config("a", fs))
	arr := t0 + 10*day
	h.produce(h.event("c", "m", "o1", 1, arr-hour, arr))
	h.caughtUp()
	if err := a.stop(); err != nil {
		t.Fatal(err)
	}
	cfg := h.config("a", fs)
	cfg.Stream.Group = h.group + "-renamed"
	b := h.start(cfg)
	err, ok := b.wait(30 * time.Second)
	if !ok {
		t.Fatal("stage kept running under a renamed group")
	}
	if !errors.Is(err, stream.ErrOffsetMismatch) || !strings.Contains(err.Error(), "a new or renamed group") {
		t.Fatalf("Run = %v, want ErrOffsetMismatch naming a new or renamed group", err)
	}
}

// TestPartitionCountChangeStops: dedup records the events topic's partition
// count and refuses to run when it changed.
func TestPartitionCountChangeStops(t *testing.T) {
	h := newHarness(t, nil, 2)
	fs := vfs.NewMem()
	a := h.start(h.config("a", fs))
	arr := t0 + 10*day
	h.produce(h.event("c", "m", "p1", 1, arr-hour, arr), h.tick(0, arr), h.tick(1, arr))
	h.caughtUp()
	if err := a.stop(); err != nil {
		t.Fatal(err)
	}
	adm := testenv.Admin(t, h.brokers)
	if _, err := adm.CreatePartitions(context.Background(), 1, h.names.EventsTopic(), h.names.DedupChangelogTopic()); err != nil {
		t.Fatal(err)
	}
	b := h.start(h.config("a", fs))
	err, ok := b.wait(30 * time.Second)
	if !ok {
		t.Fatal("stage kept running after the partition count changed")
	}
	if !errors.Is(err, ErrPartitionCountChanged) {
		t.Fatalf("Run = %v, want ErrPartitionCountChanged", err)
	}
	t.Log(err)
}

// TestBucketChangeStops: identity keys are stored under the arrival bucket
// of their first copy, a number of Config.Bucket intervals; with another
// bucket those numbers mean other times (a shorter bucket expired every key
// at once, and each copy was forwarded again; a longer one never expired
// them). The state records the bucket, and dedup refuses to run on another,
// whether the state is local or restored from the changelog.
func TestBucketChangeStops(t *testing.T) {
	localOrRestored(t, func(t *testing.T, keep bool) {
		h := newHarness(t, nil, 1)
		fs := vfs.NewMem()
		a := h.start(h.config("a", fs))
		arr := t0 + 10*day
		h.produce(h.event("c", "m", "b1", 1, arr-hour, arr))
		h.caughtUp()
		if err := a.stop(); err != nil {
			t.Fatal(err)
		}
		if !keep {
			fs = vfs.NewMem()
		}
		cfg := h.config("a", fs)
		cfg.Bucket = time.Hour // the default is 24 h
		b := h.start(cfg)
		h.produce(h.event("c", "m", "b1", 1, arr-hour, arr+1000))
		err, ok := b.wait(30 * time.Second)
		if !ok {
			h.caughtUp()
			t.Fatalf("dedup runs on a state built with another bucket: b1 forwarded %d times", h.outputs().byID()["b1"])
		}
		if !errors.Is(err, ErrBucketChanged) || !strings.Contains(err.Error(), "24h0m0s") {
			t.Fatalf("Run = %v, want ErrBucketChanged naming the state's bucket", err)
		}
		if n := h.outputs().byID()["b1"]; n != 1 {
			t.Errorf("b1 forwarded %d times, want 1", n)
		}
	})
}

// localOrRestored runs fn twice, as subtests: restarting the stage on the
// same local state (keep), and on an empty one restored from the
// changelog.
func localOrRestored(t *testing.T, fn func(t *testing.T, keep bool)) {
	t.Run("local state", func(t *testing.T) { fn(t, true) })
	t.Run("restored", func(t *testing.T) { fn(t, false) })
}
