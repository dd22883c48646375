package stream

import (
	"context"
	"slices"
	"sync"
	"time"

	"go.uber.org/zap"
)

// Warm state kept through a rebalance (docs/operations.md, Rebalances
// that give a partition back).
//
// The group's balancer is eager: every rebalance revokes every partition,
// and a partition this instance gets straight back is restored again, on
// the local state it left: the restore replays the changelog from the
// checkpoint, which holds whatever another member wrote while the
// partition was away. A Partition that is a Keeper hands its warm
// structures (those a Warmer's standby keeps) over when it is revoked;
// the next restore of the partition here takes them as a promoted
// standby's, replays the changelog's tail through them (WarmState.Apply),
// and Open receives them (PartitionState.Warm).
//
// They are in step with the state only if nothing else wrote it in
// between: every write to a partition's state other than its own
// committed transactions and a restore that took the kept structures
// goes through invalidate (a standby tail starting, the state cleanup's
// deletion), and structures kept from a revoke that another writer
// followed are refused (the generation the revoke saw is gone). A full
// restore (the state wiped) does not use warm state at all (restoreState).
// Structures of partitions the next assignment does not give back are
// dropped at that assignment, so at most those of the partitions an
// instance owns are kept.

// The warm state a restored partition's Open is handed
// (meterline_stream_partition_opens_total).
const (
	warmStandby = "standby" // a promoted standby's
	warmKept    = "kept"    // kept by the revoked instance here
	warmNone    = "none"    // none: Open builds from the state
)

// noteKept exports how many partitions' warm structures are kept.
func (rt *Runtime) noteKept() {
	if rt.m != nil {
		rt.m.keptWarm.Set(float64(rt.kept.count()))
	}
}

// Keeper is implemented by a Partition of a Warmer whose warm structures
// can outlive it.
type Keeper interface {
	// Keep is called on the run loop when the partition is revoked, just
	// before Close: its last transaction was applied to the state, or
	// will not be (aborted, or committed but left to the next restore's
	// replay, which goes through what Keep returns). It returns warm
	// structures that hold at least everything of the state applied
	// (extra keys of a transaction that did not commit may be there; a
	// Bloom filter that keeps them stays correct), or nil. The Partition
	// never touches what it returns again.
	Keep() WarmState
}

// keptWarm holds the warm structures revoked partitions kept, until the
// partition's next restore here takes them.
type keptWarm struct {
	mu   sync.Mutex
	gen  map[int32]uint64    // bumped by every other writer of the state
	warm map[int32]WarmState // kept at a revoke, for the next restore
	// owned: the partitions the last assignment gave this instance to
	// own; only theirs are kept.
	owned []int32
}

// generation returns partition p's current generation.
func (k *keptWarm) generation(p int32) uint64 {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.gen[p]
}

// put keeps w for partition p when nothing else wrote p's state since the
// revoke that saw generation gen; it reports whether it did.
func (k *keptWarm) put(p int32, gen uint64, w WarmState) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	if w == nil || k.gen[p] != gen || !slices.Contains(k.owned, p) {
		return false
	}
	if k.warm == nil {
		k.warm = map[int32]WarmState{}
	}
	k.warm[p] = w
	return true
}

// take returns partition p's kept structures and forgets them (nil:
// none).
func (k *keptWarm) take(p int32) WarmState {
	k.mu.Lock()
	defer k.mu.Unlock()
	w := k.warm[p]
	delete(k.warm, p)
	return w
}

// invalidate drops partition p's kept structures and refuses those a
// revoke before now would keep: p's state is written by something that
// does not go through them.
func (k *keptWarm) invalidate(p int32) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.invalidateLocked(p)
}

func (k *keptWarm) invalidateLocked(p int32) {
	if k.gen == nil {
		k.gen = map[int32]uint64{}
	}
	k.gen[p]++
	delete(k.warm, p)
}

// retain records a new assignment: the kept structures of every
// partition but owned are dropped, and those of the others refused
// (put; their revoke's close may still be queued in the run loop).
func (k *keptWarm) retain(owned []int32) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.owned = slices.Clone(owned)
	for p := range k.warm {
		if !slices.Contains(owned, p) {
			k.invalidateLocked(p)
		}
	}
}

// clear drops every kept structure, and keeps none until the next
// assignment (the session ends: its partitions are closed without
// keeping anything).
func (k *keptWarm) clear() {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.owned = nil
	for p := range k.warm {
		k.invalidateLocked(p)
	}
}

// count returns how many partitions' structures are kept.
func (k *keptWarm) count() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.warm)
}

// keptWait bounds how long a restore waits for the run loop to close the
// partition's revoked instance (takeKept). The run loop handles the
// revoke at its next poll, which the revoke wakes; it is later only while
// it is busy in a partition's call (a long punctuation or chunk of work)
// or a commit. Past the wait, the restore goes on without the kept
// structures: the processor builds them from the state, as before.
var keptWait = 5 * time.Second

// takeKept waits until the revoked instance of partition p, if any, is
// closed by the run loop (it hands its warm structures over then), at
// most keptWait, and returns what it kept (nil: nothing, the wait ran
// out, or ctx ended). A wait that runs out refuses what the instance
// keeps later: the restore writes the state without it.
func (rt *Runtime) takeKept(ctx context.Context, p int32) WarmState {
	rt.mu.Lock()
	closing := rt.closing[p]
	rt.mu.Unlock()
	if closing != nil {
		wait := time.NewTimer(keptWait)
		defer wait.Stop()
		select {
		case <-closing:
		case <-ctx.Done():
			return nil
		case <-wait.C:
			rt.kept.invalidate(p)
			rt.noteKept()
			rt.log.Info("the revoked instance of the partition was not closed in time (the run loop is busy): the restore does not wait for its warm state",
				zap.Int32("partition", p), zap.Duration("waited", keptWait))
			return nil
		}
	}
	if ctx.Err() != nil {
		return nil
	}
	return rt.kept.take(p)
}

// queueRevoke queues the close of partition p's instance in the run loop
// (rt.mu is held), with the generation of p's state now: the instance
// keeps its warm structures only if nothing else writes the state before
// the run loop closes it.
func (rt *Runtime) queueRevoke(p int32, epoch uint64) {
	ch := make(chan struct{})
	if rt.closing == nil {
		rt.closing = map[int32]chan struct{}{}
	}
	rt.closing[p] = ch
	rt.events = append(rt.events, event{kind: evRevoked, p: p, epoch: epoch, gen: rt.kept.generation(p), closed: ch})
}

// closedRevoked signals that ev's close is done (rt.mu is not held).
func (rt *Runtime) closedRevoked(ev event) {
	if ev.closed == nil {
		return
	}
	rt.mu.Lock()
	if rt.closing[ev.p] == ev.closed {
		delete(rt.closing, ev.p)
	}
	rt.mu.Unlock()
	close(ev.closed)
}

// closeRevoked closes a revoked partition's instance, keeping its warm
// structures (Keeper) for the partition's next restore here.
func (rt *Runtime) closeRevoked(p int32, part Partition, gen uint64) {
	if k, ok := part.(Keeper); ok {
		if w := k.Keep(); w != nil && rt.kept.put(p, gen, w) {
			rt.noteKept()
			rt.log.Info("partition revoked, warm state kept for its next restore here", zap.Int32("partition", p))
			part.Close()
			return
		}
	}
	part.Close()
	rt.log.Info("partition revoked", zap.Int32("partition", p))
}
