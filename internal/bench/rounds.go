package bench

import (
	"context"
	"fmt"
	"io"
	"slices"
	"time"
)

// Result is one measured run: Count things (events, rows) in Elapsed, and
// for a stage the Startup before its first record (span).
type Result struct {
	Name    string
	Count   int
	Elapsed time.Duration
	Startup time.Duration
	// Detail is printed after the rate on the run's progress line, as is
	// (it brings its own separator: "; 12 transactions…").
	Detail string
}

// Rate is the run's throughput, Count per second.
func (r Result) Rate() float64 { return float64(r.Count) / r.Elapsed.Seconds() }

// A Contender is one side of a comparison. Run measures one run from the
// start of the benchmark's input; it is called once per round.
type Contender interface {
	// Run measures the contender's run in round (0-based); last reports
	// the last round, in which a contender may stay up after its run for
	// the measurements that follow the rounds.
	Run(ctx context.Context, round int, last bool) (Result, error)
}

// Rounds runs every contender once per round, in an order that rotates by
// one contender per round, so that none always runs first (cold broker
// caches) or last (the write-back of earlier runs). Medians and ratios
// of the rounds are what a benchmark reports: on a shared machine one
// run says little.
type Rounds struct {
	// N is the number of rounds, at least 1.
	N int
	// HoldLast runs the last round in the contenders' given order, so that
	// the last contender runs last and may stay up afterwards.
	HoldLast bool
	// Unit names what a Result counts ("events", "rows"), for the progress
	// lines.
	Unit string
	// Progress, when set, receives a line per run:
	// "bench: round 2 (a) passthrough: 123456 events/s; <detail>".
	Progress func(format string, args ...any)
}

// Order returns the contenders' indexes in the order round runs them.
// With two contenders the rounds alternate (0 1, 1 0, 0 1, …); with three
// they rotate (0 1 2, 1 2 0, 2 0 1, …).
func (r Rounds) Order(round, contenders int) []int {
	k := round % contenders
	if r.HoldLast && round == r.N-1 {
		k = 0
	}
	order := make([]int, contenders)
	for i := range order {
		order[i] = (i + k) % contenders
	}
	return order
}

// Run runs the rounds and returns every run's result, or the first error.
func (r Rounds) Run(ctx context.Context, contenders ...Contender) (*Results, error) {
	res := &Results{Unit: r.Unit, Runs: make([][]Result, len(contenders))}
	for round := 0; round < r.N; round++ {
		for _, i := range r.Order(round, len(contenders)) {
			run, err := contenders[i].Run(ctx, round, round == r.N-1)
			if err != nil {
				return nil, fmt.Errorf("bench: round %d: %w", round+1, err)
			}
			res.Runs[i] = append(res.Runs[i], run)
			if r.Progress != nil {
				r.Progress("round %d %s: %.0f %s/s%s", round+1, run.Name, run.Rate(), r.Unit, run.Detail)
			}
		}
	}
	return res, nil
}

// Results are the runs of each contender, in the order the contenders
// were given to Rounds.Run, each in round order.
type Results struct {
	Unit string // Rounds.Unit
	Runs [][]Result
}

// MedianStartup is the median start-up of contender i's runs (span).
func (r *Results) MedianStartup(i int) time.Duration {
	v := make([]float64, len(r.Runs[i]))
	for k, run := range r.Runs[i] {
		v[k] = float64(run.Startup)
	}
	return time.Duration(median(v))
}

// JSON returns contender i's runs for a JSON output, each named name.
func (r *Results) JSON(i int, name string) []RunJSON {
	out := make([]RunJSON, len(r.Runs[i]))
	for k, run := range r.Runs[i] {
		out[k] = RunJSON{Name: name, Seconds: run.Elapsed.Seconds(), StartupSeconds: run.Startup.Seconds()}
		switch r.Unit {
		case "rows":
			out[k].Rows, out[k].RowsPerSecond = run.Count, run.Rate()
		default:
			out[k].Events, out[k].EventsPerSecond = run.Count, run.Rate()
		}
	}
	return out
}

// RunJSON is a run in a JSON output: its count and rate are named by the
// unit ("events", "events_per_second" or "rows", "rows_per_second").
type RunJSON struct {
	Name            string  `json:"name"`
	Events          int     `json:"events,omitempty"`
	Rows            int     `json:"rows,omitempty"`
	Seconds         float64 `json:"seconds"`
	EventsPerSecond float64 `json:"events_per_second,omitempty"`
	RowsPerSecond   float64 `json:"rows_per_second,omitempty"`
	// StartupSeconds is a stage's start-up, not in Seconds (span).
	StartupSeconds float64 `json:"startup_seconds,omitempty"`
}

// Median is the median rate of contender i's runs (the mean of the two
// middle ones for an even number of rounds).
func (r *Results) Median(i int) float64 {
	rates := make([]float64, len(r.Runs[i]))
	for k, run := range r.Runs[i] {
		rates[k] = run.Rate()
	}
	return median(rates)
}

// RoundRatio is the median over the rounds of contender i's rate divided
// by contender j's in the same round. A round's runs are back to back, so
// their ratio is less exposed to load that comes and goes on a shared
// machine than the ratio of the medians.
func (r *Results) RoundRatio(i, j int) float64 {
	ratios := make([]float64, len(r.Runs[i]))
	for k := range ratios {
		ratios[k] = r.Runs[i][k].Rate() / r.Runs[j][k].Rate()
	}
	return median(ratios)
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	v = slices.Clone(v)
	slices.Sort(v)
	if len(v)%2 == 1 {
		return v[len(v)/2]
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2
}

// writeAligned writes pairs of a label and a value, one pair a line, the
// values aligned one space after the longest label.
func writeAligned(w io.Writer, labelsAndValues ...string) {
	width := 0
	for i := 0; i < len(labelsAndValues); i += 2 {
		width = max(width, len(labelsAndValues[i]))
	}
	for i := 0; i+1 < len(labelsAndValues); i += 2 {
		fmt.Fprintf(w, "%-*s %s\n", width, labelsAndValues[i], labelsAndValues[i+1])
	}
}
