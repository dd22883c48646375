package stream

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/internal/testenv"
)

// TestRestoreFollowsChangelogLeaderMoves: the leadership of changelog
// partition 0 moves to another broker in the middle of a restore's copy
// (after its first batch, which here holds
// every committed record), and again while the copy waits at the last
// stable offset of a previous owner's open transaction. The copy follows
// the leader without skipping or re-reading a record: once the
// transaction aborts, the state holds every committed record and none of
// the aborted one's, and each input is counted once.
func TestRestoreFollowsChangelogLeaderMoves(t *testing.T) {
	t.Parallel()
	cluster, brokers := testenv.KFake(t, kfake.NumBrokers(3), kfake.GroupMinSessionTimeout(500*time.Millisecond))
	s := newSuiteOn(t, cluster, brokers, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const n = 3*restoreBatch + 7
	work, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.TransactionalID(s.group+"-work"),
		kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer work.Close()
	if err := work.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		work.Produce(ctx, &kgo.Record{Topic: s.changelog, Partition: 0, Key: fmt.Appendf(nil, "k%05d", i), Value: []byte("v")}, nil)
	}
	if err := work.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if err := work.EndTransaction(ctx, kgo.TryCommit); err != nil {
		t.Fatal(err)
	}
	prev := s.openGhost(ctx, 1)
	s.send(20)

	move := func() {
		t.Helper()
		to := (cluster.LeaderFor(s.changelog, 0) + 1) % 3
		if err := cluster.MoveTopicPartition(s.changelog, 0, to); err != nil {
			t.Error(err)
		}
	}
	var batches atomic.Int32
	hook := func(what string, p int32) {
		if what == "restore" && p == 0 && batches.Add(1) == 1 {
			move()
		}
	}
	fsB := vfs.NewMem()
	b := s.startRuntime("b", fsB, &countProc{output: s.output}, func(*Config) {}, func(rt *Runtime) { rt.copyHook.Store(&hook) })
	s.waitFor("b's restore of partition 0 to wait at the open transaction", func() bool {
		waiting := false
		b.rt.EachPartitionStatus(func(p int32, restoring bool, remaining int64, _, _ string) {
			waiting = waiting || p == 0 && restoring && remaining == 1
		})
		return batches.Load() >= 1 && waiting
	})
	move()
	time.Sleep(500 * time.Millisecond)
	if err := prev.EndTransaction(ctx, kgo.TryAbort); err != nil {
		t.Fatal(err)
	}
	s.waitFor("b's restore to end once the transaction aborted", func() bool { return b.rt.Ready() == nil && b.owned() == 2 })
	for _, k := range []string{"k00000", fmt.Sprintf("k%05d", restoreBatch), fmt.Sprintf("k%05d", n-1)} {
		if _, ok, err := b.rt.Store().Get(0, []byte(k)); err != nil || !ok {
			t.Errorf("b's state of partition 0 lacks committed key %s (%v)", k, err)
		}
	}
	s.caughtUp()
	s.finish(b, fsB)
}
