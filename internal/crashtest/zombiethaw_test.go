package crashtest

import (
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// TestRealDedupZombieThawedInsideItsTransaction freezes an instance with
// SIGSTOP while a transaction of its is open on the changelog (its records
// on the broker, past the last stable offset), for longer than the session
// timeout but well inside its transaction timeout, so another instance,
// with another transactional ID, takes its partitions over and restores up
// to a high watermark that includes the open transaction. The new owner
// must wait for that transaction's outcome; the zombie is then thawed and
// tries to commit: only the group generation (KIP-447) can refuse it, as
// the broker has not aborted it. Its commit must be refused, the new
// owner's restore must end only then (not at the transaction timeout), and
// exactly-once must hold.
func TestRealDedupZombieThawedInsideItsTransaction(t *testing.T) {
	s := newSuite(t)
	rng := newRand(t)
	const txnTimeout = 45 * time.Second
	s.send(seq(0, 200))
	next := 200
	f := s.feed(20*time.Millisecond, growingFeed(rng, &next, 10000, 4, 6))
	z := s.start("z", filepath.Join(s.Dir, "state-z"), opts{transactionTimeout: txnTimeout})
	time.Sleep(4 * time.Second)
	if _, restores := z.Replayed(); restores < partitions {
		t.Fatalf("%s owns %d partitions after 4s, want %d", z.Name(), restores, partitions)
	}
	// Freeze z until a transaction of its is open on the changelog.
	var open map[int32]inFlight
	for try := 0; try < 50 && len(open) == 0; try++ {
		z.Signal(t, syscall.SIGSTOP)
		time.Sleep(300 * time.Millisecond)
		if open = s.inFlight(s.Names.DedupChangelogTopic()); len(open) == 0 {
			z.Signal(t, syscall.SIGCONT)
			time.Sleep(time.Duration(rng.IntN(60)) * time.Millisecond)
		}
	}
	if len(open) == 0 {
		t.Fatal("never froze z with a transaction open on the changelog")
	}
	frozen := time.Now()
	t.Logf("z frozen with its transaction open on changelog partitions %v", open)
	f.Stop()

	y := s.start("y", filepath.Join(s.Dir, "state-y"), opts{})
	// y restores up to the open transaction and waits at its last stable
	// offset; or, when z froze between its offset commit and its EndTxn,
	// y's offset fetch waits for the group's offsets to be stable
	// (KIP-447) and y restores nothing yet. Either way it must not have
	// restored a partition of the open transaction before the thaw.
	time.Sleep(sessionTimeout + 8*time.Second)
	restoring := map[int32]bool{}
	for _, l := range y.Lines(msgRestoring) {
		restoring[int32(l.Int("partition"))] = true
	}
	still := s.inFlight(s.Names.DedupChangelogTopic())
	for p, o := range open {
		if st, ok := still[p]; !ok || st.lso != o.lso {
			t.Fatalf("partition %d: z's transaction no longer open before the thaw (%v, was %v)", p, still[p], o)
		}
		for _, l := range y.Lines(msgRestored) {
			if int32(l.Int("partition")) == p {
				t.Errorf("partition %d: y's restore ended while z's transaction was open", p)
			}
		}
	}
	t.Logf("before the thaw y restores partitions %v (none: its offset fetch waited for z's uncommitted offsets)", restoring)
	z.Signal(t, syscall.SIGCONT)
	thawed := time.Now()
	t.Logf("z was frozen for %s", thawed.Sub(frozen).Round(time.Millisecond))

	if len(restoring) > 0 {
		// y waits at the last stable offset of z's transaction: z's
		// commit is refused at once, not aborted at its timeout.
		waitFor(t, "y's restores to end", txnTimeout, func() bool {
			ended := map[int32]bool{}
			for _, l := range y.Lines(msgRestored) {
				ended[int32(l.Int("partition"))] = true
			}
			for p := range restoring {
				if !ended[p] {
					return false
				}
			}
			return true
		})
		if took := time.Since(thawed); took > txnTimeout/3 {
			t.Errorf("y's restores ended %s after the thaw: z's transaction was not refused at its commit", took.Round(time.Millisecond))
		}
	}
	s.send(seq(0, next))
	s.waitCaughtUp(y, z)
	s.checkExactlyOnce()
	refused := 0
	for _, l := range z.LogLines() {
		if l.TS.After(thawed.Add(-time.Second)) && (l.Msg == msgFenced || l.Msg == msgUnknown || l.Msg == msgRecordFailed) {
			refused++
		}
	}
	t.Logf("z refused %d commits after the thaw", refused)
	if len(restoring) > 0 && refused == 0 {
		// y listed the group's offsets before z's offset commit: z's
		// commit, with its stale generation, must have been refused.
		t.Errorf("z logged no refused commit after the thaw, though y restored before it")
	}
}

func waitFor(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(d); !cond(); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
	}
}
