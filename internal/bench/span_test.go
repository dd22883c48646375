package bench

import (
	"context"
	"sync/atomic"
	"testing"
	"time"
)

// TestMeasureRunLeavesOutStartUp: a stage's rate is taken over its work,
// from the first poll that saw a record handled, not from its start: a
// stage that takes 300 ms to start and then handles its records has a
// start-up of at least 300 ms, and the records counted in its span are
// those handled after the first poll.
func TestMeasureRunLeavesOutStartUp(t *testing.T) {
	const want, step, startup = 20_000, 1_000, 300 * time.Millisecond
	var n atomic.Int64
	run := func(ctx context.Context) error {
		select {
		case <-time.After(startup):
		case <-ctx.Done():
			return nil
		}
		for n.Load() < want {
			n.Add(step)
			time.Sleep(10 * time.Millisecond)
		}
		<-ctx.Done()
		return nil
	}
	t0 := time.Now()
	sp, r, err := measureRun(t.Context(), run, n.Load, want)
	total := time.Since(t0)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	if sp.startup < startup {
		t.Errorf("start-up %v, want at least %v", sp.startup, startup)
	}
	if sp.startup+sp.elapsed > total || sp.elapsed <= 0 {
		t.Errorf("start-up %v and span %v of a run of %v", sp.startup, sp.elapsed, total)
	}
	if sp.count <= 0 || sp.count > want-step || sp.count%step != 0 {
		t.Errorf("counted %d records in the span, want those after the first poll's (at least %d), of %d", sp.count, step, want)
	}
	if sp.cpu < 0 {
		t.Errorf("CPU %v", sp.cpu)
	}
}

// TestMeasureRunAllAtOnce: a first poll that sees every record handled
// leaves no window; the span is then the whole run, with no start-up.
func TestMeasureRunAllAtOnce(t *testing.T) {
	var n atomic.Int64
	run := func(ctx context.Context) error {
		time.Sleep(50 * time.Millisecond)
		n.Store(500)
		<-ctx.Done()
		return nil
	}
	sp, r, err := measureRun(t.Context(), run, n.Load, 500)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	if sp.startup != 0 || sp.count != 500 || sp.elapsed < 50*time.Millisecond {
		t.Errorf("span %+v, want the whole run: 500 records, at least 50ms, no start-up", sp)
	}
}
