package crashtest

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/internal/testenv/crash"
)

// TestKillRestoresTail: a SIGKILL from outside (a process crash, not an OS
// crash) of `meterline dedup` that ran at low traffic, with no fault point
// and no clean stop, must cost a restart only the changelog tail past its
// checkpoints (docs/design.md, Exactly-once, 2: the store syncs its WAL
// at most once a second): every partition restarts with state, none with
// reason no_state.
func TestKillRestoresTail(t *testing.T) {
	s := newSuite(t)
	stateDir := filepath.Join(s.Dir, "state")

	// Few events, a little at a time: far less than a 32 KiB WAL block.
	a := s.start("a", stateDir, opts{})
	s.send(seq(0, 40))
	s.waitCaughtUp(a)
	for i := 40; i < 60; i++ {
		s.send([]int{i})
		time.Sleep(100 * time.Millisecond)
	}
	s.waitCaughtUp(a)
	// Longer than the store's sync interval, with the stage's ticks still
	// committing transactions.
	time.Sleep(3 * time.Second)
	a.Kill(t)

	a2 := s.start("a", stateDir, opts{})
	s.send(seq(60, 80))
	s.waitCaughtUp(a2)
	s.checkExactlyOnce()

	for _, l := range firstRestores(t, a2) {
		p := l.Int("partition")
		t.Logf("partition %d: %s restore (%s) from %d to %d, had state %v", p, l.Fields["kind"], l.Fields["reason"],
			l.Int("from"), l.Int("to"), l.Fields["had_state"])
		if l.Fields["kind"] != "tail" || l.Fields["had_state"] != true {
			t.Errorf("partition %d: the restart after a SIGKILL made a %s restore (reason %s, had state %v), want a tail restore from the checkpoint",
				p, l.Fields["kind"], l.Fields["reason"], l.Fields["had_state"])
		}
	}
}

// TestKillWhenIdleLosesNoCommit: `meterline dedup` SIGKILLed seconds after
// its last commit, which followed a synced commit within the second and
// had no commit after it (no input, no ticks), restarts with that commit
// in its state (docs/design.md, Exactly-once, 2: the store's flusher syncs
// a batch no later commit syncs): every partition's restore starts at the
// last transaction's checkpoint, with nothing past it in the changelog but
// that transaction's commit marker.
func TestKillWhenIdleLosesNoCommit(t *testing.T) {
	s := newSuite(t)
	stateDir := filepath.Join(s.Dir, "state")
	// No ticks: with them the stage commits every tick interval, and its
	// last commit is never seconds old.
	idle := opts{args: []string{"--tick-interval", "1h"}}

	a := s.start("a", stateDir, idle)
	s.send(seq(0, 40))
	s.waitCaughtUp(a)
	// A commit more than a second after the last sync, which syncs; then,
	// within the second after it, the last one, which does not.
	time.Sleep(1500 * time.Millisecond)
	s.send(seq(40, 50))
	s.waitCaughtUp(a)
	s.send(seq(50, 60))
	s.waitCaughtUp(a)
	time.Sleep(3 * time.Second)
	a.Kill(t)

	a2 := s.start("a", stateDir, idle)
	s.send(seq(60, 80))
	s.waitCaughtUp(a2)
	s.checkExactlyOnce()

	for _, l := range firstRestores(t, a2) {
		p, cp, to := l.Int("partition"), l.Int("checkpoint"), l.Int("to")
		t.Logf("partition %d: %s restore (%s), checkpoint %d, changelog end %d, had state %v", p, l.Fields["kind"], l.Fields["reason"],
			cp, to, l.Fields["had_state"])
		// The checkpoint of a transaction's apply is the offset of its
		// commit marker: the end is one past it.
		if l.Fields["kind"] != "tail" || l.Fields["had_state"] != true || to-cp > 1 {
			t.Errorf("partition %d: the restart after a SIGKILL seconds after the last commit restores from checkpoint %d to %d (%s restore, had state %v): "+
				"the state lost committed batches, want at most the last commit marker past the checkpoint", p, cp, to, l.Fields["kind"], l.Fields["had_state"])
		}
	}
}

// firstRestores returns the first line of p's log that starts a restore of
// each partition, failing the test when some partition has none.
func firstRestores(t *testing.T, p *testenv.Process) []testenv.LogLine {
	t.Helper()
	seen := map[int64]bool{}
	var out []testenv.LogLine
	for _, l := range p.Lines(msgRestoring) {
		if n := l.Int("partition"); !seen[n] {
			seen[n] = true
			out = append(out, l)
		}
	}
	if len(out) < crash.Partitions {
		t.Errorf("%s logged %q for %d partitions, want %d", p.Name(), msgRestoring, len(out), crash.Partitions)
	}
	return out
}
