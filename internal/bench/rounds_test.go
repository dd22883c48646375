package bench

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestRoundsOrderRotates(t *testing.T) {
	for _, tc := range []struct {
		name       string
		rounds     Rounds
		contenders int
		want       [][]int
	}{
		{"two alternate", Rounds{N: 4}, 2, [][]int{{0, 1}, {1, 0}, {0, 1}, {1, 0}}},
		{"three rotate", Rounds{N: 4}, 3, [][]int{{0, 1, 2}, {1, 2, 0}, {2, 0, 1}, {0, 1, 2}}},
		// bench dedup: its stage runs last in the last round, and stays up.
		{"hold last", Rounds{N: 3, HoldLast: true}, 3, [][]int{{0, 1, 2}, {1, 2, 0}, {0, 1, 2}}},
		{"hold last, one round", Rounds{N: 1, HoldLast: true}, 3, [][]int{{0, 1, 2}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got [][]int
			for r := range tc.rounds.N {
				got = append(got, tc.rounds.Order(r, tc.contenders))
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("orders %v, want %v", got, tc.want)
			}
		})
	}
}

// fixed is a contender whose runs take the given seconds, one a round, and
// which records the rounds it ran in and whether they were the last.
type fixed struct {
	name    string
	seconds []float64
	log     *[]string
	failAt  int // round that fails; -1: none
}

func (f fixed) Run(_ context.Context, round int, last bool) (Result, error) {
	*f.log = append(*f.log, fmt.Sprintf("%s%d%v", f.name, round, last))
	if round == f.failAt {
		return Result{}, errors.New("boom")
	}
	return Result{Name: f.name, Count: 100, Elapsed: time.Duration(f.seconds[round] * float64(time.Second)), Detail: "; d"}, nil
}

func TestRoundsRunMediansAndRatios(t *testing.T) {
	var log, lines []string
	r := Rounds{N: 4, Unit: "rows", Progress: func(format string, args ...any) { lines = append(lines, fmt.Sprintf(format, args...)) }}
	base := fixed{name: "base", seconds: []float64{1, 2, 4, 0.5}, log: &log, failAt: -1}
	cand := fixed{name: "cand", seconds: []float64{2, 2, 5, 1}, log: &log, failAt: -1}
	res, err := r.Run(context.Background(), base, cand)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"base0false", "cand0false", "cand1false", "base1false", "base2false", "cand2false", "cand3true", "base3true"}; !reflect.DeepEqual(log, want) {
		t.Errorf("runs %v, want %v", log, want)
	}
	// Rates: base 100, 50, 25, 200; cand 50, 50, 20, 100.
	if got := res.Median(0); got != 75 {
		t.Errorf("median of base %v, want 75 (the mean of the middle two)", got)
	}
	if got := res.Median(1); got != 50 {
		t.Errorf("median of cand %v, want 50", got)
	}
	// Per-round ratios 0.5, 1, 0.8, 0.5: median 0.65.
	if got := res.RoundRatio(1, 0); got < 0.6499 || got > 0.6501 {
		t.Errorf("median of per-round ratios %v, want 0.65", got)
	}
	if lines[0] != "round 1 base: 100 rows/s; d" || lines[2] != "round 2 cand: 50 rows/s; d" {
		t.Errorf("progress lines %q", lines)
	}
	if got := res.JSON(0, "b")[0]; got.Rows != 100 || got.RowsPerSecond != 100 || got.Events != 0 || got.Seconds != 1 {
		t.Errorf("JSON of a run %+v", got)
	}
}

func TestRoundsRunStopsAtFirstError(t *testing.T) {
	var log []string
	a := fixed{name: "a", seconds: []float64{1, 1, 1}, log: &log, failAt: 1}
	b := fixed{name: "b", seconds: []float64{1, 1, 1}, log: &log, failAt: -1}
	if _, err := (Rounds{N: 3}).Run(context.Background(), a, b); err == nil {
		t.Fatal("no error")
	}
	if want := []string{"a0false", "b0false", "b1false", "a1false"}; !reflect.DeepEqual(log, want) {
		t.Errorf("runs %v, want %v", log, want)
	}
}

func TestWriteAlignedMatchesTheTables(t *testing.T) {
	var b strings.Builder
	writeAligned(&b, "baseline raw franz-go:", "1 events/s", "meterline produce:", "2 events/s", "ratio:", "2.00")
	want := "baseline raw franz-go: 1 events/s\nmeterline produce:     2 events/s\nratio:                 2.00\n"
	if b.String() != want {
		t.Errorf("got\n%s\nwant\n%s", b.String(), want)
	}
}
