package stream

import (
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
)

// State of partitions held elsewhere (docs/operations.md).
//
// The store keeps the state of every partition this instance ever held:
// revoked ones, standby copies moved to another instance, warm-up copies
// dropped, and, at start, whatever the first assignment does not give it.
// A copy within the restore horizon is worth keeping for a while: the
// group's balancer prefers its member for the partition (warmCopies), and
// a partition given back restores only its changelog's tail. One past the
// horizon would be restored in full anyway. So the run loop sweeps the
// store every stateCleanupPoll, and at its next turn after an assignment
// or a revoke, and deletes the state and checkpoint of every partition
// that is not held here (neither owned nor assigned to own, nor a standby
// or warm-up copy, nor written by a restore or a tail still stopping,
// nor kept for a promotion's restore) when its checkpoint is beyond the
// restore horizon under the changelog's known delete.retention.ms, it has
// rows but no checkpoint (a restore would wipe them), or it has not been
// held for Config.StateCleanupDelay. Until the session's first assignment
// nothing is known to be held elsewhere, and nothing is deleted.
//
// The sweep holds the standbys' mu, then the runtime's mu (the only place
// that takes both, in that order): every writer of a partition's state
// is registered under one of them (rt.parts, rt.writers, sb.tails,
// sb.stopping) before it writes, so no write of a partition races its
// deletion, and a partition assigned after the sweep finds no state and
// restores it in full.

// stateCleanupPoll is how often the run loop sweeps the store.
const stateCleanupPoll = 30 * time.Second

// Reasons a partition's state is deleted, as
// meterline_stream_state_cleaned_partitions_total and the log name them.
const (
	cleanDelay        = "delay"         // not held for Config.StateCleanupDelay
	cleanHorizon      = "horizon"       // a restore from it would be a full one
	cleanNoCheckpoint = "no_checkpoint" // rows without a checkpoint: a restore wipes them
)

var cleanReasons = []string{cleanDelay, cleanHorizon, cleanNoCheckpoint}

// stateCleanup is the run loop's state of the sweep.
type stateCleanup struct {
	// due asks for a sweep at the run loop's next turn (an assignment, a
	// revoke).
	due atomic.Bool
	// Run-loop-only: the time of the next periodic sweep, and since when
	// each partition with state has been seen not held here.
	next  time.Time
	since map[int32]time.Time
}

// cleanState is the run loop's step of the state cleanup.
func (rt *Runtime) cleanState() {
	if rt.cfg.StateCleanupDelay < 0 {
		return
	}
	now := rt.cfg.Clock.Now()
	if !rt.cleanup.due.Swap(false) && now.Before(rt.cleanup.next) {
		return
	}
	rt.cleanup.next = now.Add(stateCleanupPoll)
	if err := rt.sweepState(now); err != nil {
		rt.log.Warn("cannot clean up the local state of partitions held elsewhere", zap.Error(err))
	}
}

// cleaned is a partition whose state a sweep deleted.
type cleaned struct {
	p      int32
	reason string
	unheld time.Duration
	cp     Checkpoint
	hasCP  bool
	bytes  uint64
}

// sweepState deletes the state of the partitions not held here that
// qualify (see above), logs and counts each, and exports the partitions
// and bytes of state left that are not held here.
func (rt *Runtime) sweepState(now time.Time) error {
	ps, err := rt.store.partitions()
	if err != nil {
		return err
	}
	retention := rt.knownRetention()
	sb := rt.sb
	sb.mu.Lock()
	rt.mu.Lock()
	if !sb.heldKnown {
		rt.mu.Unlock()
		sb.mu.Unlock()
		return nil
	}
	if rt.cleanup.since == nil {
		rt.cleanup.since = map[int32]time.Time{}
	}
	for p := range rt.cleanup.since {
		if !slices.Contains(ps, p) {
			delete(rt.cleanup.since, p) // deleted by another path
		}
	}
	var out []cleaned
	var kept []int32
	b := rt.store.newBatch()
	for _, p := range ps {
		if rt.heldHere(p) {
			delete(rt.cleanup.since, p)
			continue
		}
		since, ok := rt.cleanup.since[p]
		if !ok {
			since = now
			rt.cleanup.since[p] = now
		}
		cp, has, err := rt.store.Checkpoint(p)
		if err != nil {
			kept = append(kept, p) // a corrupt checkpoint: left for a restore to report
			continue
		}
		c := cleaned{p: p, unheld: now.Sub(since), cp: cp, hasCP: has}
		switch {
		case !has:
			c.reason = cleanNoCheckpoint
		case retention > 0 && !withinHorizon(cp, now, retention):
			c.reason = cleanHorizon
		case c.unheld >= rt.cfg.StateCleanupDelay:
			c.reason = cleanDelay
		default:
			kept = append(kept, p)
			continue
		}
		c.bytes, _ = rt.store.DiskUsage(p)
		b.dropPartition(p)
		out = append(out, c)
	}
	err = nil
	if len(out) > 0 {
		err = b.commit()
	} else {
		_ = b.b.Close()
	}
	if err == nil {
		for _, c := range out {
			delete(rt.cleanup.since, c.p)
			rt.kept.invalidate(c.p) // none is kept for it: it is not held
		}
		rt.noteKept()
	}
	rt.mu.Unlock()
	sb.mu.Unlock()
	if err != nil {
		return fmt.Errorf("stream: delete the state of partitions held elsewhere: %w", err)
	}
	rt.noteCleaned(out, kept, retention)
	return nil
}

// heldHere reports whether partition p's state is held here: owned or
// assigned to own, a standby or warm-up copy, written by a restore or a
// stopping tail, kept for a promotion's restore, or open in the run loop.
// rt.sb.mu and rt.mu are held.
func (rt *Runtime) heldHere(p int32) bool {
	_, owned := rt.parts[p]
	_, active := rt.active[p]
	_, tailing := rt.sb.tails[p]
	_, stopping := rt.sb.stopping[p]
	return owned || active || tailing || stopping || rt.writers[p] > 0 || slices.Contains(rt.sb.held, p)
}

// noteCleaned logs and counts the partitions a sweep deleted, and
// exports the state left that is not held here (kept).
func (rt *Runtime) noteCleaned(out []cleaned, kept []int32, retention time.Duration) {
	for _, c := range out {
		rt.m.cleaned.WithLabelValues(c.reason).Inc()
		fields := []zap.Field{zap.Int32("partition", c.p), zap.String("reason", c.reason),
			zap.Duration("unheld_for", c.unheld), zap.Uint64("bytes", c.bytes)}
		if c.hasCP {
			fields = append(fields, zap.Int64("checkpoint", c.cp.Offset), zap.Time("checkpoint_date", c.cp.At),
				zap.Duration("delete_retention", retention))
		}
		rt.log.Info("deleted the local state of a partition this instance neither owns nor keeps as a standby", fields...)
	}
	var bytes uint64
	for _, p := range kept {
		n, _ := rt.store.DiskUsage(p)
		bytes += n
	}
	rt.m.unheldPartitions.Set(float64(len(kept)))
	rt.m.unheldBytes.Set(float64(bytes))
}

// noteHeld records the partitions an assignment gives this instance to
// own or copy (held by the sweep until the next assignment) and asks for
// a sweep. It runs on kgo's group goroutine.
func (sb *standbys) noteHeld(a StandbyAssignment) {
	sb.mu.Lock()
	sb.held = slices.Concat(a.Owned, a.Standby)
	sb.heldKnown = true
	sb.mu.Unlock()
	sb.rt.cleanup.due.Store(true)
}

// forgetHeld forgets the last session's assignment: a new session
// deletes nothing until its first assignment.
func (sb *standbys) forgetHeld() {
	sb.mu.Lock()
	sb.held, sb.heldKnown = nil, false
	sb.mu.Unlock()
}

// addWriter and doneWriter count, under rt.mu, the restore goroutines of
// partition p that may still write its state.
func (rt *Runtime) addWriter(p int32) {
	if rt.writers == nil {
		rt.writers = map[int32]int{}
	}
	rt.writers[p]++
}

func (rt *Runtime) doneWriter(p int32) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if rt.writers[p]--; rt.writers[p] <= 0 {
		delete(rt.writers, p)
	}
}
