package testenv

import (
	"testing"
	"time"
)

// The wall clock of InOneMonth; its test replaces both.
var (
	wallNow   = time.Now
	wallSleep = time.Sleep
)

// InOneMonth keeps a test whose broker times are the wall clock (the real
// brokers' LogAppendTime, or records and ticks stamped with time.Now) inside
// one UTC calendar month, the default billing period (docs/design.md,
// Time): such a test cannot move its input to another month, and one that
// straddles a month's end counts its events, caps and balances in two.
// When the month ends within before of now, or began less than after ago,
// it waits until after has passed since the start of the next (or the
// current) month, and says so; it returns the wall clock it leaves at. A
// test that then runs for less than before, with broker times no more than
// after before its start, sees a single month.
func InOneMonth(t testing.TB, before, after time.Duration) time.Time {
	t.Helper()
	now := wallNow().UTC()
	if wait := monthEdgeWait(now, before, after); wait > 0 {
		t.Logf("%s is within %s of a month's end or %s of its start: waiting %s, so that the test runs inside one month",
			now.Format(time.RFC3339Nano), before, after, wait.Round(time.Millisecond))
		wallSleep(wait)
		now = wallNow().UTC()
	}
	return now
}

// monthEdgeWait is how long InOneMonth waits at now (UTC).
func monthEdgeWait(now time.Time, before, after time.Duration) time.Duration {
	start := time.Date(now.Year(), now.Month(), 1, 0, 0, 0, 0, time.UTC)
	next := start.AddDate(0, 1, 0)
	switch {
	case next.Sub(now) <= before:
		return next.Add(after).Sub(now)
	case now.Sub(start) < after:
		return start.Add(after).Sub(now)
	}
	return 0
}
