package stream

import (
	"context"
	"maps"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/twmb/franz-go/pkg/kadm"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

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
