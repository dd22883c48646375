package crashtest

import (
	"path/filepath"
	"testing"
	"time"

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

	seen := map[int64]bool{}
	for _, l := range a2.Lines(msgRestoring) {
		p := l.Int("partition")
		if seen[p] {
			continue
		}
		seen[p] = true
		t.Logf("partition %d: %s restore (%s) from %d to %d, had state %v", p, l.Fields["kind"], l.Fields["reason"],
			l.Int("from"), l.Int("to"), l.Fields["had_state"])
		if l.Fields["kind"] != "tail" || l.Fields["had_state"] != true {
			t.Errorf("partition %d: the restart after a SIGKILL made a %s restore (reason %s, had state %v), want a tail restore from the checkpoint",
				p, l.Fields["kind"], l.Fields["reason"], l.Fields["had_state"])
		}
	}
	if len(seen) < crash.Partitions {
		t.Errorf("restart logged %q for %d partitions, want %d", msgRestoring, len(seen), crash.Partitions)
	}
}
