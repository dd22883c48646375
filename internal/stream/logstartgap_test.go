package stream

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/meterline/meterline/internal/kafka"
	"github.com/meterline/meterline/internal/session"
	"github.com/meterline/meterline/internal/testenv"
)

// TestRestoreTailPastMovedLogStart: a restore plans a tail replay from
// its checkpoint (2), within the log (start 0), and before its first fetch
// the changelog's log start moves past the checkpoint (retention of a
// compact,delete changelog, DeleteRecords): offsets 2 and 3, a tombstone
// of a and a value of c, are gone unread. The copy must not jump to the
// new log start and install a state that still holds a (deleted) and
// lacks c under a checkpoint at the end: the restore plans again, in full,
// and ends with what a fresh restore gives (d only).
func TestRestoreTailPastMovedLogStart(t *testing.T) {
	t.Parallel()
	w := newKVWorld(t, map[string]*string{"cleanup.policy": ptr("compact,delete"), "delete.retention.ms": ptr("60000")})
	recs := kvRecords("a", "1", "b", "1", "a", "", "c", "1", "d", "1")
	for _, r := range recs {
		r.Topic = w.changelog
	}
	if err := w.cl.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	id := w.changelogID()

	// The first fetch of the changelog waits until the log start moved.
	var once sync.Once
	fetching, moved := make(chan struct{}), make(chan struct{})
	w.cluster.ControlKey(kmsg.Fetch.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
		w.cluster.KeepControl()
		for _, tp := range req.(*kmsg.FetchRequest).Topics {
			if tp.TopicID == id || tp.Topic == w.changelog {
				once.Do(func() {
					close(fetching)
					w.cluster.SleepControl(func() { <-moved })
				})
			}
		}
		return nil, nil, false
	})

	rt := gapRuntime(t, w.brokers, w.input, w.changelog, w.group)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	type result struct {
		part Partition
		err  error
	}
	done := make(chan result, 1)
	go func() {
		part, _, _, err := rt.restorePartition(ctx, w.cl, rt.log, 0, 0, map[string]int64{w.input: -1}, nil)
		done <- result{part, err}
	}()
	select {
	case <-fetching:
	case r := <-done:
		t.Fatalf("the restore ended before it fetched the changelog: %v", r.err)
	case <-ctx.Done():
		t.Fatal("the restore did not fetch the changelog in 30 s")
	}
	deleteTo4(ctx, t, w.cl, w.changelog)
	close(moved)
	var r result
	select {
	case r = <-done:
	case <-ctx.Done():
		t.Fatal("the restore did not end in 30 s")
	}
	if r.err != nil {
		t.Fatalf("restore: %v", r.err)
	}
	r.part.Close()

	expectOnlyD(t, rt, w.input)
}

// TestRealReplayPastMovedLogStart: on the real broker, a replay planned
// from a checkpoint (2) that the log start has since passed (DeleteRecords
// to 4) fails with errCopyOutOfRange, writing nothing, rather than
// jumping to the log start; the restore then plans a full copy.
func TestRealReplayPastMovedLogStart(t *testing.T) {
	brokers := testenv.RealKafka(t)
	t.Parallel()
	changelog, input := testenv.Name(t, "changelog"), testenv.Name(t, "in")
	testenv.CreateTopic(t, brokers, input, 1, nil)
	testenv.CreateTopic(t, brokers, changelog, 1, map[string]*string{"cleanup.policy": ptr("compact,delete"), "delete.retention.ms": ptr("60000")})
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(changelog))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := cl.ProduceSync(ctx, kvRecords("a", "1", "b", "1", "a", "", "c", "1", "d", "1")...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	rt := gapRuntime(t, brokers, input, changelog, testenv.Name(t, "group"))
	cp, _, err := rt.store.Checkpoint(0)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := rt.planCopy(ctx, cl, rt.log, 0, "restore", cp, true)
	if err != nil {
		t.Fatal(err)
	}
	if cs.plan.Full || cs.from != 2 || cs.end != 5 {
		t.Fatalf("plan %+v from %d to %d; want a tail replay from 2 to 5", cs.plan, cs.from, cs.end)
	}
	deleteTo4(ctx, t, cl, changelog)
	_, _, err = rt.replay(ctx, 0, cs.from, cs.end, cs.lso, cs.at, cs.retention, nil)
	if !errors.Is(err, errCopyOutOfRange) {
		t.Fatalf("replay past the moved log start: %v; want errCopyOutOfRange", err)
	}
	if got, _, _ := rt.store.Checkpoint(0); got.Offset != 2 {
		t.Fatalf("checkpoint %d after the refused replay; want 2, nothing written", got.Offset)
	}
	part, _, _, err := rt.restorePartition(ctx, cl, rt.log, 0, 0, map[string]int64{input: -1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	part.Close()
	expectOnlyD(t, rt, input)
}

// expectOnlyD checks that partition 0's state is d=1 at checkpoint 5:
// what a fresh restore of the changelog from log start 4 gives.
func expectOnlyD(t *testing.T, rt *Runtime, input string) {
	t.Helper()
	got := map[string]string{}
	if err := rt.store.Scan(0, nil, nil, func(k, v []byte) error {
		if string(k) != rt.cfg.inputOffsetKey(input) {
			got[string(k)] = string(v)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	cp, _, err := rt.store.Checkpoint(0)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got["d"] != "1" || cp.Offset != 5 {
		t.Errorf("restored state %v at checkpoint %d; want map[d:1] at 5, as a fresh restore of the changelog (log start 4) gives", got, cp.Offset)
	}
}

// TestStandbyTailPastMovedLogStart: a standby tail that stops reading
// (its fetch held) while the owner deletes k and retention moves the log
// start past the tail's position (DeleteRecords) must not jump to the new
// log start, keeping k under a checkpoint at the end: it copies the
// partition again, in full, and ends with what a fresh copy gives.
func TestStandbyTailPastMovedLogStart(t *testing.T) {
	t.Parallel()
	w := newKVWorld(t, map[string]*string{"cleanup.policy": ptr("compact,delete"), "delete.retention.ms": ptr("60000")})
	rt, cl := w.standbyRuntime(&skewClock{}, zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel)), prometheus.NewRegistry())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	put := func(kv ...string) {
		t.Helper()
		if err := cl.ProduceSync(ctx, kvRecords(kv...)...).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	put("k", "v", "x", "1")
	g := gateFetches(w.cluster, nil)
	rt.sb.mu.Lock()
	rt.sb.start(0)
	rt.sb.mu.Unlock()
	awaitCheckpoint(t, w, rt, "the standby to copy the changelog", func(cp Checkpoint, end int64) bool { return cp.Offset >= end })

	g.gated.Store(true)
	put("dummy", "1") // answers a fetch already waiting; the next one is held
	g.waitHeld(t)
	put("k", "", "y", "1") // offsets 3 and 4
	deleteTo4(ctx, t, cl, w.changelog)
	g.open()
	awaitCheckpoint(t, w, rt, "the standby to catch up", func(cp Checkpoint, end int64) bool { return cp.Offset >= end })
	got := map[string]string{}
	if err := rt.store.Scan(0, nil, nil, func(k, v []byte) error {
		got[string(k)] = string(v)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got["y"] != "1" {
		t.Errorf("standby copy %v; want map[y:1], as a fresh copy of the changelog (log start 4) gives", got)
	}
}

// gapRuntime returns a runtime on brokers whose partition 0 state is as a
// replay of changelog offsets 0 and 1 (a=1, b=1) left it: checkpoint 2.
func gapRuntime(t *testing.T, brokers []string, input, changelog, group string) *Runtime {
	t.Helper()
	rt, err := New(Config{Stage: "kv",
		Config:     session.Config{Kafka: kafka.Config{Brokers: brokers}, Group: group, InstanceID: "r"},
		InputTopic: input, ChangelogTopic: changelog, FS: vfs.NewMem(), Clock: &skewClock{},
		Logger: zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel)), Registerer: prometheus.NewRegistry()}, kvProc{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rt.store.Close() })
	b := rt.store.newBatch()
	b.set(0, []byte("a"), []byte("1"))
	b.set(0, []byte("b"), []byte("1"))
	b.checkpoint(0, Checkpoint{Offset: 2, At: time.Now()})
	if err := b.commit(); err != nil {
		t.Fatal(err)
	}
	return rt
}

// deleteTo4 moves changelog partition 0's log start to 4 (DeleteRecords).
func deleteTo4(ctx context.Context, t *testing.T, cl *kgo.Client, changelog string) {
	t.Helper()
	deleted, err := kadm.NewClient(cl).DeleteRecords(ctx, kadm.Offsets{changelog: {0: {Topic: changelog, Partition: 0, At: 4}}})
	if err == nil {
		err = deleted.Error()
	}
	if err != nil {
		t.Fatal(err)
	}
}
