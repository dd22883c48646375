package stream

import (
	"maps"
	"sync/atomic"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// TestAbandonedRestoreWritesNothing: a restore of a partition that is
// assigned anew (here as kgo does for a partition assigned again without
// its revoke; a revoke followed by an assignment does the same) is
// abandoned, and a new restore of the partition begins. The abandoned
// restore may be anywhere in its copy when that happens: here it has read
// the changelog and is about to write its batch (a goroutine descheduled
// on a loaded machine, a write that stalls). It must write nothing from
// then on: the new restore, and the partition's transactions after it,
// have written the partition's state past that batch, which holds older
// values and an older checkpoint. The local state stays the changelog's,
// key for key, and the counts go on from it after a restart.
func TestAbandonedRestoreWritesNothing(t *testing.T) {
	t.Parallel()
	s := newSuite(t, nil, nil)
	a := s.start("a", vfs.NewMem())
	s.waitFor("a to own both partitions", func() bool { return a.owned() == int(s.parts) })
	s.send(40)
	s.caughtUp()
	a.shutdown()

	// x starts on empty state: it restores both partitions in full. Its
	// first restore of partition 0 holds before it writes its batch.
	const p = 0
	held, release := make(chan struct{}), make(chan struct{})
	defer func() {
		select {
		case <-release:
		default:
			close(release)
		}
	}()
	var first atomic.Bool
	hook := func(what string, q int32) {
		if what != "restore" || q != p || !first.CompareAndSwap(false, true) {
			return
		}
		close(held)
		<-release
	}
	fsX := vfs.NewMem()
	x := s.startRuntime("x", fsX, &countProc{output: s.output}, func(*Config) {}, func(rt *Runtime) { rt.copyHook.Store(&hook) })
	<-held

	// Assigned anew: the held restore is abandoned, a new one restores
	// the partition, and x counts more input on it.
	s.assignAnew(x, p)
	s.send(30)
	s.caughtUp()

	// The abandoned restore goes on, and ends.
	close(release)
	s.waitFor("the abandoned restore to end", func() bool {
		x.rt.mu.Lock()
		defer x.rt.mu.Unlock()
		return x.rt.writers[p] == 0
	})
	// One more transaction on the partition, in a bucket of its own: it
	// moves the checkpoint to the changelog's end.
	s.sendTo(p, "b9", "late")
	s.caughtUp()

	if local, log := s.storeState(x.rt.store, p), s.changelogState()[p]; !maps.Equal(local, log) {
		for k, v := range log {
			if local[k] != v {
				t.Errorf("partition %d: key %q is %q in x's local state, %q in the changelog", p, k, local[k], v)
			}
		}
		for k, v := range local {
			if _, ok := log[k]; !ok {
				t.Errorf("partition %d: key %q is %q in x's local state, not in the changelog", p, k, v)
			}
		}
	}

	// Restarted on its state, x restores the changelog's tail past its
	// checkpoint, and counts on from what its state holds.
	x.shutdown()
	x = s.start("x", fsX)
	s.finish(x, fsX)
}
