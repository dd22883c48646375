package aggcrashtest

import (
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/internal/testenv/crash"
)

// TestEntitlementsRebalanceAndZombie is TestRebalanceMidPeriod's crash
// windows with entitlements (docs/design.md, Exactly-once, "Crash windows":
// partition moved to another instance, previous owner's transaction in
// flight, zombie after a rebalance): three `meterline aggregate
// --entitlements` instances join and leave the group while the stream of
// TestEntitlementsCrashWindows flows — one leaves cleanly, one is killed
// (SIGKILL) mid-transaction and comes back on its kept state, one is frozen
// (SIGSTOP) for longer than the session and transaction timeouts while the
// others take its partitions over, then thawed (a zombie whose commits must
// be refused), and one comes back on wiped state. Then every check of the
// crash windows' holds: the reference's bill, rejections and last balances,
// the exact decisions per customer, and each dripped grant's draws.
func TestEntitlementsRebalanceAndZombie(t *testing.T) {
	t.Parallel()
	s := newEntSuite(t)
	const seed = 107
	st := genStream(seed, 3, 8, 12, partitions)
	start := time.Date(2026, 4, 1, 0, 0, 0, 0, time.UTC).UnixMilli() + seed*hourMs // genStream's
	sched := entSchedule(start)
	dir := func(id string) string { return filepath.Join(s.Dir, "state-"+id) }
	agg := func(id, state string) *testenv.Process {
		return s.startAgg(id, dir(state), aggOpts{extra: entArgs})
	}
	next := 0
	feed := func(n int, pause time.Duration) {
		for end := min(next+n, len(st.batches)); next < end; next++ {
			s.sendEnt(st.batches[next], &sched)
			time.Sleep(pause)
		}
	}
	a := agg("a", "a")
	b := agg("b", "b")
	feed(5, 150*time.Millisecond)
	c := agg("c", "c")
	feed(5, 150*time.Millisecond)
	b.Stop(t) // leaves cleanly: its partitions move at once
	feed(3, 150*time.Millisecond)
	c.Kill(t) // dies mid-transaction: its partitions move after the session timeout
	feed(2, 150*time.Millisecond)
	c = agg("c", "c") // back on its kept state; fences its zombie
	feed(3, 150*time.Millisecond)
	// a frozen past the session and transaction timeouts: b (new, on
	// wiped state) and c take its partitions over; the input goes on.
	a.Signal(t, syscall.SIGSTOP)
	frozenAt := time.Now()
	b = agg("b", "b-wiped")
	feed(10, 300*time.Millisecond)
	time.Sleep(time.Until(frozenAt.Add(crash.SessionTimeout + crash.TransactionTimeout + 2*time.Second)))
	a.Signal(t, syscall.SIGCONT) // a zombie: its next commit is refused
	feed(len(st.batches), 100*time.Millisecond)
	s.sendEnt(st.final, &sched)
	s.waitCaughtUp(a, b, c)

	s.checkRestores()
	// The zombie's commits after the thaw are refused (fenced by the
	// group generation, or its transaction aborted by the broker), and it
	// goes on (waitCaughtUp fails if it exits).
	if m, err := a.Metrics(); err != nil {
		t.Errorf("scraping %s: %v", a.Name(), err)
	} else if refused := m.Sum("meterline_stream_commits_refused_total"); refused == 0 {
		t.Errorf("the zombie %s had no commit refused after the thaw", a.Name())
	} else {
		t.Logf("the zombie %s: %v commits refused", a.Name(), refused)
	}
	// The exact checks run once checkEnt has waited for the outputs, and
	// even when it failed.
	defer func() { checkEntExact(t, s, "", start, 0, nil) }()
	rep := s.checkEnt()
	if rep.Rejected["over_limit"] == 0 || rep.Rejected["no_credit"] == 0 {
		t.Errorf("the stream rejected %v; it must exercise over_limit and no_credit", rep.Rejected)
	}
}
