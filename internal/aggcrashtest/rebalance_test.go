package aggcrashtest

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/meterline/meterline/internal/testenv/oracle"
)

// TestRebalanceMidPeriod: three `meterline aggregate` instances join and
// leave the group — cleanly (SIGTERM), by SIGKILL, and on wiped state —
// while the input flows and periods are open and being finalized. Every
// partition moves several times; the totals stay exact: one FINAL per key
// with the model's value, one adjustment per late event.
func TestRebalanceMidPeriod(t *testing.T) {
	s := newSuite(t)
	st := genStream(7, 4, 10, 8, partitions)
	dir := func(id string) string { return filepath.Join(s.Dir, "state-"+id) }

	feedDone := make(chan error, 1)
	go func() {
		defer close(feedDone)
		for _, b := range st.batches {
			if err := s.trySend(b); err != nil {
				feedDone <- err
				return
			}
			time.Sleep(150 * time.Millisecond)
		}
	}()
	pause := func(d time.Duration) {
		select {
		case err, ok := <-feedDone:
			if ok && err != nil {
				t.Fatal(err)
			}
			time.Sleep(d)
		case <-time.After(d):
		}
	}

	a := s.startAgg("a", dir("a"), aggOpts{})
	pause(2 * time.Second)
	b := s.startAgg("b", dir("b"), aggOpts{})
	pause(2 * time.Second)
	c := s.startAgg("c", dir("c"), aggOpts{})
	pause(2 * time.Second)
	b.Stop(t) // leaves cleanly: its partitions move at once
	pause(1500 * time.Millisecond)
	c.Kill(t) // dies mid-transaction: its partitions move after the session timeout
	pause(time.Second)
	c = s.startAgg("c", dir("c"), aggOpts{}) // back on its kept state; fences its zombie
	pause(2 * time.Second)
	a.Stop(t)
	pause(time.Second)
	b = s.startAgg("b", dir("b-wiped"), aggOpts{}) // a new machine: full restore
	pause(2 * time.Second)
	a = s.startAgg("a", dir("a"), aggOpts{}) // old state, behind the changelog
	if err, ok := <-feedDone; ok && err != nil {
		t.Fatal(err)
	}
	s.send(st.final)
	s.waitCaughtUp(a, b, c)

	s.checkRestores()
	s.check(oracle.Day, graceMs)
}
