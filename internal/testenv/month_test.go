package testenv

import (
	"testing"
	"time"
)

// TestInOneMonth: started near the end of a month (of a December, of a
// February, at its last nanosecond), at the start of one, or inside one,
// InOneMonth leaves at an instant from which the test's look-back (after)
// and run (before) lie in one UTC month, sleeping just as long as it must.
func TestInOneMonth(t *testing.T) {
	const before, after = 2 * time.Minute, 5 * time.Second
	month := func(at time.Time) time.Time {
		at = at.UTC()
		return time.Date(at.Year(), at.Month(), 1, 0, 0, 0, 0, time.UTC)
	}
	for _, c := range []struct {
		start string
		sleep time.Duration
	}{
		{"2025-12-31T23:59:30Z", 35 * time.Second},
		{"2025-12-31T23:58:00Z", 2*time.Minute + 5*time.Second},
		{"2026-02-28T23:59:59.999999999Z", 5*time.Second + time.Nanosecond},
		{"2026-01-31T23:58:30+01:00", 0}, // 22:58:30 UTC
		{"2026-03-01T00:00:00Z", 5 * time.Second},
		{"2026-03-01T00:00:04.999Z", time.Millisecond},
		{"2026-04-30T23:57:59Z", 0},
		{"2026-06-15T12:00:00Z", 0},
	} {
		t.Run(c.start, func(t *testing.T) {
			now, err := time.Parse(time.RFC3339Nano, c.start)
			if err != nil {
				t.Fatal(err)
			}
			slept := time.Duration(0)
			wallNow = func() time.Time { return now }
			wallSleep = func(d time.Duration) { slept += d; now = now.Add(d) }
			t.Cleanup(func() { wallNow, wallSleep = time.Now, time.Sleep })
			got := InOneMonth(t, before, after)
			if !got.Equal(now) {
				t.Errorf("returned %s, the clock reads %s", got, now)
			}
			if first, last := month(got.Add(-after)), month(got.Add(before-time.Nanosecond)); !first.Equal(last) {
				t.Errorf("left at %s after sleeping %s: the test's broker times run from %s to %s, in two months", got.Format(time.RFC3339Nano), slept,
					got.Add(-after).Format(time.RFC3339Nano), got.Add(before).Format(time.RFC3339Nano))
			}
			if slept != c.sleep {
				t.Errorf("slept %s, want %s", slept, c.sleep)
			}
		})
	}
}
