// Package rfc3339 reads a time written in RFC 3339, as the formats that
// take one (an event's event_time, a CloudEvent's time) document it.
package rfc3339

import (
	"strings"
	"time"
)

// Parse reads s as an RFC 3339 time (time.RFC3339Nano's layout) and
// reports whether it is one. Go's time.Parse also takes a comma before the
// fraction of a second and an hour of one digit (2026-11-29T1:00:00Z),
// which RFC 3339, and OpenMeter's schema (format date-time), refuse; so
// does Parse. It also takes an offset of hour 24 or minute 60 (+24:00,
// read as a day ahead), which RFC 3339 (time-numoffset: hour 00-23,
// minute 00-59) refuses; so does Parse.
func Parse(s string) (time.Time, bool) {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil || strings.IndexByte(s, ',') >= 0 || !fixedFields(s) || !offsetInRange(s) {
		return time.Time{}, false
	}
	return t, true
}

// offsetInRange reports whether the numeric offset that ends s (a time
// time.Parse took: it ends in Z or in ±hh:mm) has an hour of 00 to 23
// and a minute of 00 to 59.
func offsetInRange(s string) bool {
	if n := len(s); n >= 6 && (s[n-6] == '+' || s[n-6] == '-') {
		return s[n-5:n-3] <= "23" && s[n-2:] <= "59"
	}
	return true
}

// fixedFields reports whether s has its date and time fields at RFC
// 3339's fixed places (2006-01-02T15:04:05).
func fixedFields(s string) bool {
	const layout = "dddd-dd-ddTdd:dd:dd"
	if len(s) < len(layout) {
		return false
	}
	for i := 0; i < len(layout); i++ {
		c := s[i]
		if layout[i] == 'd' && (c < '0' || c > '9') || layout[i] != 'd' && c != layout[i] {
			return false
		}
	}
	return true
}
