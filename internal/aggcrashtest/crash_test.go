package aggcrashtest

import (
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/meterline/meterline/internal/fault"
	"github.com/meterline/meterline/internal/testenv/oracle"
)

// TestCrashWindows kills `meterline aggregate` (SIGKILL, from inside, via
// METERLINE_FAULT) in each crash window (docs/design.md, Exactly-once,
// "Crash windows") — including the aggregator's own: between deciding FINAL
// and committing it, and between two chunks of a period's FINAL revisions —
// restarts it and lets it finish the stream: every key has exactly one
// FINAL, with the exact value, and every late event exactly one adjustment.
func TestCrashWindows(t *testing.T) {
	for _, c := range []struct {
		point string
		hit   int
		extra []string // more flags of every run
	}{
		{fault.BeforeCommit, 3, nil},
		{fault.AfterCommit, 3, nil},
		{fault.DuringApply, 3, nil},
		{fault.AfterApply, 3, nil},
		// The 2nd (partition, period) decided final in the live run.
		{fault.FinalDecided, 2, nil},
		// A period's dozen aggregates per partition go out 2 per
		// transaction: killed after the 3rd chunk committed.
		{fault.BetweenChunks, 3, []string{"--final-chunk", "2"}},
		{fault.DuringRestore, 1, nil},
	} {
		t.Run(c.point, func(t *testing.T) {
			t.Parallel()
			s := newSuite(t)
			st := genStream(int64(len(c.point)), 3, 8, 12, partitions)
			stateDir := filepath.Join(s.Dir, "state")
			spec := c.point + "@" + strconv.Itoa(c.hit)
			// State first, FINALs of the first day(s) included, committed
			// by a clean run.
			a := s.startAgg("a", stateDir, aggOpts{extra: c.extra})
			next := 0
			for ; next < len(st.batches)/3; next++ {
				s.send(st.batches[next])
			}
			s.waitCaughtUp(a)
			a.Stop(t)
			if c.point == fault.DuringRestore {
				// Restore that state into a wiped state directory and die
				// during the restore; go on from the partly restored state.
				stateDir = filepath.Join(s.Dir, "state-wiped")
				a = s.startAgg("a", stateDir, aggOpts{fault: spec, extra: c.extra})
				a.ExpectFaultKill(t, c.point, exitTimeout)
				a = s.startAgg("a", stateDir, aggOpts{extra: c.extra})
			} else {
				// The rest of the stream goes on, live, into the armed run.
				a = s.startAgg("a", stateDir, aggOpts{fault: spec, extra: c.extra})
			}
			crashed := c.point == fault.DuringRestore
			for ; next < len(st.batches); next++ {
				s.send(st.batches[next])
				time.Sleep(30 * time.Millisecond) // several transactions
				if !crashed && a.Exited() {
					a.ExpectFaultKill(t, c.point, 0)
					crashed = true
					a = s.startAgg("a", stateDir, aggOpts{extra: c.extra})
				}
			}
			if !crashed {
				if !a.Wait(30 * time.Second) {
					t.Fatalf("%s: %s not hit with the whole stream sent\n%s", a.Name(), spec, a.Tail(30))
				}
				a.ExpectFaultKill(t, c.point, 0)
				a = s.startAgg("a", stateDir, aggOpts{extra: c.extra})
			}
			s.send(st.final)
			s.waitCaughtUp(a)
			if c.point == fault.AfterCommit || c.point == fault.DuringApply {
				// Pebble was behind the changelog: the restart replayed
				// the tail.
				if n, _ := a.Replayed(); n == 0 {
					t.Errorf("%s restored no changelog record after a crash at %s", a.Name(), c.point)
				}
			}
			res := s.check(oracle.Day, graceMs)
			if res.Finals == 0 || res.Adjustments == 0 {
				t.Fatalf("the stream decided %d FINALs and %d adjustments; it must exercise both", res.Finals, res.Adjustments)
			}
		})
	}
}
