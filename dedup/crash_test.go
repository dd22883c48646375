package dedup

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/internal/fault"
	"github.com/meterline/meterline/internal/stream"
)

// TestInProcessCrashWindows kills the stage in-process at each crash window
// (fault.CrashHandler: no transaction is ended, no state applied), restarts
// it on the same state, feeds more copies and counts. The real-binary
// SIGKILL version of this suite runs on the real broker
// (internal/crashtest).
func TestInProcessCrashWindows(t *testing.T) {
	fault.SetHandler(fault.CrashHandler)
	t.Cleanup(func() { fault.SetHandler(nil); _ = fault.Arm("") })
	for _, point := range []string{fault.BeforeCommit, fault.AfterCommit, fault.DuringApply, fault.AfterApply, fault.DuringRestore} {
		t.Run(point, func(t *testing.T) {
			h := newHarness(t, nil, 2)
			fs := vfs.NewMem()
			arr := t0 + 10*day
			events := func(from, to int, arrival int64) []*kgo.Record {
				var rs []*kgo.Record
				for i := from; i < to; i++ {
					rs = append(rs, h.event("c", "m", fmt.Sprintf("id-%03d", i), 1, arr-hour, arrival))
				}
				return rs
			}
			hits := "@3"
			if point == fault.DuringRestore {
				// Build state first, then crash while a wiped instance
				// restores it.
				a := h.start(h.config("a", fs))
				h.produce(events(0, 30, arr)...)
				h.caughtUp()
				if err := a.stop(); err != nil {
					t.Fatal(err)
				}
				fs = vfs.NewMem()
				hits = "@1"
			}
			if err := fault.Arm(point + hits); err != nil {
				t.Fatal(err)
			}
			a := h.start(h.config("a", fs))
			for i := 0; i < 10; i++ {
				h.produce(events(i*5, i*5+10, arr+int64(i)*1000)...)
				if err, done := a.wait(50 * time.Millisecond); done {
					if !errors.Is(err, stream.ErrCrashed) {
						t.Fatalf("stage stopped with %v, want a simulated crash", err)
					}
					break
				}
			}
			if err, done := a.wait(20 * time.Second); !done || !errors.Is(err, stream.ErrCrashed) {
				t.Fatalf("the stage did not crash at %s (err %v)", point, err)
			}
			_ = fault.Arm("")
			b := h.start(h.config("a", fs))
			h.produce(events(0, 60, arr+hour)...) // copies of everything, and new ones
			h.caughtUp()
			o := h.outputs()
			for id, n := range o.byID() {
				if n != 1 {
					t.Errorf("%s forwarded %d times", id, n)
				}
			}
			if len(o.byID()) != 60 {
				t.Errorf("%d identities forwarded, want 60", len(o.byID()))
			}
			_ = b
		})
	}
}
