package ingest

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/meterline/meterline/producer"
)

// TestNumericStringQuantities: a quantity sent as a string is read as
// OpenMeter reads it (openmeter/meter/parse.go: strconv.ParseFloat of the
// string, then NaN and infinities refused), where that is a decimal: a
// sign +, leading zeros, no digit before or after the decimal point.
// What ParseFloat takes beyond a decimal (hexadecimal, _ between digits,
// inf, nan) and what it refuses (blanks around the number) is refused
// naming the value's field, and the value rules stay: no negative, no
// more decimals than the meter's scale, nothing beyond 64 bits.
func TestNumericStringQuantities(t *testing.T) {
	e := newEnv(t, nil)
	job := func(i int, v string) string {
		return fmt.Sprintf(`{"specversion":"1.0","id":"n%d","source":"batch","type":"job","subject":"acme-1","time":"2026-11-29T12:00:00Z","data":{"seconds":%q}}`, i, v)
	}
	// gpu_ms: SUM of $.seconds, scale 3.
	taken := []struct {
		v    string
		want int64
	}{
		{"+5", 5000}, {"0012", 12000}, {"00", 0}, {"+0", 0}, {"-0", 0}, {".5", 500}, {"5.", 5000},
		{"+.5e1", 5000}, {"0012.250", 12250}, {"1E+2", 100000}, {"+0.001", 1}, {"007e-3", 7},
	}
	var evs []string
	for i, c := range taken {
		evs = append(evs, job(i, c.v))
	}
	if status, _, b := e.post("/api/v1/events", "application/cloudevents-batch+json", e.token, batchOf(evs...)); status != http.StatusNoContent {
		t.Fatalf("numeric strings OpenMeter takes: %d %s", status, b)
	}
	var got, want []string
	recs := e.records()
	for _, r := range recs {
		got = append(got, fmt.Sprintf("%s=%d", r.EventID, r.Quantity))
	}
	for i, c := range taken {
		want = append(want, fmt.Sprintf("%s=%d", producer.EventID("batch", fmt.Sprintf("n%d", i)), c.want))
	}
	slices.Sort(got)
	slices.Sort(want)
	if len(recs) != len(taken) || !slices.Equal(got, want) {
		t.Fatalf("records %v, want %v", got, want)
	}

	for i, c := range []struct{ v, why string }{
		{"0x1p4", "hexadecimal"}, {"0X10", "hexadecimal"}, {"1_000", "_"}, {"Infinity", "not a finite number"},
		{"inf", "not a finite number"}, {"+Inf", "not a finite number"}, {"NaN", "not a finite number"},
		{" 5", "not a decimal number"}, {"5 ", "not a decimal number"}, {"", "not a decimal number"}, {"+", "not a decimal number"},
		{".", "not a decimal number"}, {"+-5", "not a decimal number"}, {"5e", "not a decimal number"}, {"1.2.3", "not a decimal number"},
		{"٣", "not a decimal number"}, {"-5", "negative"}, {"-.5", "negative"}, {"1.0005", "more than 3 decimal places"},
		{"1e400", "64-bit"}, {"+9223372036854775807", "64-bit"}, {"00001e-4", "more than 3 decimal places"},
	} {
		status, _, b := e.post("/api/v1/events", "application/cloudevents+json", e.token, []byte(job(100+i, c.v)))
		if status != http.StatusBadRequest {
			t.Errorf("%q: %d %s, want 400", c.v, status, b)
			continue
		}
		p := problem(t, b)
		if len(p.Errors) != 1 || p.Errors[0].Field != "data.seconds" || !strings.Contains(p.Errors[0].Reason, c.why) {
			t.Errorf("%q: %s, want data.seconds refused: %s", c.v, b, c.why)
		}
	}
	if n := len(e.records()); n != len(taken) {
		t.Fatalf("%d records after the refusals, want %d", n, len(taken))
	}
}
