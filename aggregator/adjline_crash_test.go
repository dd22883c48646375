package aggregator

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/internal/fault"
	"github.com/meterline/meterline/internal/stream"
	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/internal/testenv/oracle"
	"github.com/meterline/meterline/schemas"
)

// TestAdjustmentOnlyLinesOnceAcrossCrashes: every invoice line that only
// adjustments were booked into gets exactly one FINAL revision (value 0,
// past its period's end + grace; docs/design.md, Time), whatever crash
// point the aggregator dies at, again and again, restarting on kept or
// wiped state: lines booked into an open period (their FINALs among its
// chunks, one key a chunk), into a period whose FINALs are going out, into
// one whose queued events are being booked, into a final one, and into a
// period final without a marker; a line booked into twice; lines that have
// usage of their own (their own FINAL only). The outputs are checked
// against the billing oracle, and the lines' state keys are gone once
// their period expired.
func TestAdjustmentOnlyLinesOnceAcrossCrashes(t *testing.T) {
	points := []string{fault.BetweenChunks, fault.BeforeCommit}
	if !testing.Short() {
		points = propPoints
	}
	for _, point := range points {
		t.Run(point, func(t *testing.T) { runLineCrashes(t, point) })
	}
}

// lineRun is one run of TestAdjustmentOnlyLinesOnceAcrossCrashes: one
// instance, killed at point on its hit-th pass after each start or step,
// up to lineStepCrashes times a step.
type lineRun struct {
	t       *testing.T
	h       *aggHarness
	fs      vfs.FS
	run     *aggRunning
	point   string
	hit     int
	crashes int // in all
	step    int // crashes in the current step
	events  []*oracle.Event
}

// lineStepCrashes bounds the crashes of a step.
const lineStepCrashes = 3

// arm arms the point, unless the step had its crashes (or, for a crash
// during a restore, the instance does not restore).
func (lr *lineRun) arm(restores bool) {
	spec := ""
	if lr.step < lineStepCrashes && (lr.point != fault.DuringRestore || restores) {
		spec = fmt.Sprintf("%s@%d", lr.point, lr.hit)
		if lr.point == fault.DuringRestore {
			spec = lr.point + "@1" // a restore this small hits it once
		}
	}
	if err := fault.Arm(spec); err != nil {
		lr.t.Fatal(err)
	}
}

func (lr *lineRun) start(wipe bool) {
	if wipe {
		lr.fs = vfs.NewMem()
	}
	cfg := lr.h.config("a", lr.fs)
	cfg.Period, cfg.Grace, cfg.Window = Day, time.Hour, 3*24*time.Hour
	cfg.FinalChunk = 1
	lr.arm(wipe)
	lr.run = lr.h.start(cfg)
}

// reap restarts the instance if it crashed: on wiped state every other
// time (a restore from the changelog), and always for a crash during
// the restore.
func (lr *lineRun) reap() {
	select {
	case <-lr.run.done:
	default:
		return
	}
	if !errors.Is(lr.run.err, stream.ErrCrashed) {
		lr.t.Fatalf("the instance stopped: %v", lr.run.err)
	}
	lr.crashes++
	lr.step++
	lr.hit = lr.hit%3 + 1
	lr.start(lr.crashes%2 == 0 || lr.point == fault.DuringRestore)
}

// settle waits until the group caught up with the input, restarting the
// instance whenever it crashed.
func (lr *lineRun) settle() {
	deadline := time.Now().Add(time.Minute)
	for {
		lr.reap()
		if ok, err := testenv.CaughtUp(lr.h.brokers, lr.h.group, lr.h.names.DedupedTopic()); err == nil && ok {
			lr.reap()
			return
		}
		if time.Now().After(deadline) {
			lr.t.Fatal("not caught up after a minute")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// send produces events (oracle.Event, its Watermark the one it is
// processed at) and watermarks (int64), in order, and settles.
func (lr *lineRun) send(recs ...any) {
	lr.produce(recs...)
	lr.settle()
}

// produce is send without settling.
func (lr *lineRun) produce(recs ...any) {
	var out []*kgo.Record
	for _, r := range recs {
		switch r := r.(type) {
		case *oracle.Event:
			lr.events = append(lr.events, r)
			out = append(out, lr.h.dedupedEvent(0, &schemas.DedupedEvent{EventID: r.ID, CustomerID: r.Customer, Meter: r.Meter,
				Quantity: r.Quantity, EventTime: r.EventTime, IngestTime: r.Arrival}))
		case int64:
			out = append(out, lr.h.watermark(0, 0, 1, r))
		}
	}
	lr.step = 0
	if lr.point == fault.DuringRestore {
		// Only a restore hits it: every step starts with one, from the
		// changelog into wiped state.
		if err := lr.run.stop(); err != nil && !errors.Is(err, stream.ErrCrashed) {
			lr.t.Fatal(err)
		}
		lr.start(true)
	} else {
		lr.arm(false)
	}
	lr.h.produce(out...)
}

func runLineCrashes(t *testing.T, point string) {
	fault.SetHandler(fault.CrashHandler)
	t.Cleanup(func() { fault.SetHandler(nil); _ = fault.Arm("") })
	const dayMs, hourMs = 24 * 3600 * 1000, 3600 * 1000
	d0 := ms(t, "2026-05-04")
	d1, d2 := d0+dayMs, d0+2*dayMs
	lr := &lineRun{t: t, h: newAggHarnessSources(t, nil, 1, 1), fs: vfs.NewMem(), point: point, hit: 1}
	n := 0
	ev := func(c string, et, arr, wm int64) *oracle.Event {
		n++
		return &oracle.Event{ID: fmt.Sprintf("e%03d", n), Customer: c, Meter: "m", Quantity: int64(n), EventTime: et, Arrival: arr, Watermark: wm}
	}
	lr.start(false)

	// Day 0: usage of c0…c3, final; day 1: usage of c0.
	lr.send(ev("c0", d0+1000, d0+2000, 0), ev("c1", d0+1000, d0+2000, 0), ev("c2", d0+1000, d0+2000, 0),
		ev("c3", d0+1000, d0+2000, 0), ev("c0", d1+1000, d1+2000, 0), d1+hourMs+1)
	// Late events of day 0 that arrived in day 1, day 1 open: lines of
	// day 1 for c1, c4, c5 (c0 has usage there); c1's twice; and z00…z19,
	// whose lines sort after every two-letter customer's.
	step := []any{ev("c0", d0+3000, d1+2*hourMs, 0), ev("c1", d0+3000, d1+2*hourMs, 0), ev("c4", d0+3000, d1+2*hourMs, 0),
		ev("c5", d0+3000, d1+2*hourMs, 0), ev("c1", d0+4000, d1+3*hourMs, 0)}
	for i := range 20 {
		step = append(step, ev(fmt.Sprintf("z%02d", i), d0+3000, d1+2*hourMs, 0))
	}
	lr.send(append(step, d1+4*hourMs)...)
	// Day 1 decided: its FINALs (c0's, then the lines') go out one a
	// transaction. In the same poll, an event of day 1 that arrived on
	// time (a re-route), queued behind them: booked into day 1 while its
	// queued events are booked (c8's line, at once); and re-routed late
	// events of day 0 that arrived in day 1, booked into day 1 before its
	// FINALs went past their lines (c6's; c1's again). Then, while the
	// FINALs go out, most likely past c3's line (the z lines after it):
	// c3's (at once), twice; and after them, c9's.
	cut1 := d2 + hourMs + 1
	lr.send(cut1, ev("c8", d1+1000, d1+2000, cut1), ev("c6", d0+5000, d1+5*hourMs, cut1), ev("c1", d0+5000, d1+5*hourMs, cut1))
	lr.send(ev("c3", d0+5000, d1+5*hourMs, cut1), ev("c3", d0+5500, d1+5*hourMs, cut1))
	lr.send(ev("c9", d0+6000, d1+6*hourMs, cut1), ev("c6", d0+6000, d1+6*hourMs, cut1))
	// Day 2 final with nothing in it (no marker); then an event of day 1
	// that arrived on time in day 2, processed now: booked into day 2,
	// final without a marker (c7's line, at once), twice.
	cut2 := d2 + dayMs + hourMs + 1
	lr.send(cut2, ev("c7", d1+2000, d2+1000, cut2), ev("c7", d1+3000, d2+2000, cut2))

	// No more crashes: the instance (restarted if it crashed since it
	// caught up) finishes the chunks.
	_ = fault.Arm("")
	model := &oracle.Model{Period: oracle.Day, Grace: hourMs}
	bill := model.Bill(lr.events)
	for deadline := time.Now().Add(time.Minute); !bill.Complete(oracle.Read(t, lr.h.brokers, lr.h.names)); time.Sleep(20 * time.Millisecond) {
		lr.reap()
		if time.Now().After(deadline) {
			break // Verify says what is missing
		}
	}
	oracle.Verify(t, lr.h.brokers, lr.h.names, model, lr.events)
	t.Logf("%s: %d crashes", point, lr.crashes)
	if lr.crashes == 0 {
		t.Errorf("no crash at %s", point)
	}

	// Expiry at end + W + B + S (W 3 days, B 1 day, S 1 hour) of day 2: no
	// line key of day 1 or 2 is left in the changelog.
	lr.send(d2 + dayMs + 4*dayMs + hourMs + 1)
	for _, start := range []int64{d1, d2} {
		deadline := time.Now().Add(time.Minute)
		for {
			var lines [][]byte
			for _, k := range liveStateKeys(t, lr.h, start) {
				if k[0] == pfxLine {
					lines = append(lines, k)
				}
			}
			if len(lines) == 0 {
				break
			}
			lr.reap()
			if time.Now().After(deadline) {
				t.Fatalf("%d line keys of %s still live a minute after end + W + B + S (first %q)", len(lines), msTime(start), lines[0])
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}
