package rfc3339

import (
	"testing"
	"time"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		s    string
		want time.Time
		ok   bool
	}{
		{"2026-11-29T12:00:00Z", time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC), true},
		{"2026-11-29T12:00:00.250+01:00", time.Date(2026, 11, 29, 11, 0, 0, 25e7, time.UTC), true},
		{"2026-11-29T12:00:00,250Z", time.Time{}, false}, // comma: time.Parse takes it
		{"2026-11-29T1:00:00Z", time.Time{}, false},      // hour of one digit: time.Parse takes it
		{"2026-11-29T01:00:00Z", time.Date(2026, 11, 29, 1, 0, 0, 0, time.UTC), true},
		{"2026-11-29t12:00:00Z", time.Time{}, false},
		{"2026-11-29T12:00:00z", time.Time{}, false},
		{"2026-11-29T12:00:00+0100", time.Time{}, false},
		{"2026-11-29", time.Time{}, false},
		// An offset's hour is 00 to 23 and its minute 00 to 59 (RFC 3339,
		// time-numoffset); time.Parse takes 24 and 60, and reads them.
		{"2026-11-29T12:00:00+23:59", time.Date(2026, 11, 28, 12, 1, 0, 0, time.UTC), true},
		{"2026-11-29T12:00:00-23:59", time.Date(2026, 11, 30, 11, 59, 0, 0, time.UTC), true},
		{"2026-11-29T12:00:00+24:00", time.Time{}, false},
		{"2026-11-29T12:00:00.5-24:00", time.Time{}, false},
		{"2026-11-29T12:00:00+05:60", time.Time{}, false},
		{"2026-11-29T12:00:00-00:60", time.Time{}, false},
		{"", time.Time{}, false},
	} {
		got, ok := Parse(tc.s)
		if ok != tc.ok || !got.Equal(tc.want) {
			t.Errorf("Parse(%q) = %v, %v; want %v, %v", tc.s, got, ok, tc.want, tc.ok)
		}
	}
	if _, err := time.Parse(time.RFC3339Nano, "2026-11-29T1:00:00Z"); err != nil {
		t.Errorf("time.Parse refuses an hour of one digit now (%v): the check may be simpler", err)
	}
}
