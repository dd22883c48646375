package dedup

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/schemas"
)

// TestExpiryCheckStable: the check that rejects a copy whose keys may have
// expired (too_old) decides alike when its transaction aborts and is
// processed again, and after a restart that reads the watermark back from
// the state; it never rejects an event that arrived at or after the
// watermark inside its window, nor a first copy whose clock stepped back
// but whose keys are live.
func TestExpiryCheckStable(t *testing.T) {
	c, brokers := testenv.KFake(t)
	h := newHarness(t, brokers, 1)
	reg := prometheus.NewRegistry()
	cfg := shortWindow(h, reg)
	tickT := t0 + swB + swW + swS // expires the bucket of swArr: keys before t0+B are gone
	h.produce(h.event("acme", "api_calls", "x1", 1, swArr, swArr), h.tick(0, tickT))
	st := h.start(cfg)
	h.caughtUp()

	// One transaction, which aborts: a stepped-back copy of x1 (too_old),
	// an ordinary event 1 s inside its window at the watermark, and a
	// first copy stamped 10 minutes back whose keys are live.
	testenv.FailNextTxnOffsetCommit(c)
	y := tickT + 1000
	h.produce(
		h.event("acme", "api_calls", "x1", 1, swArr, swArr+swW-1000),
		h.event("acme", "api_calls", "y1", 1, y-swW+1000, y),
		h.event("acme", "api_calls", "z1", 1, tickT-15*60_000, tickT-10*60_000),
	)
	h.caughtUp()
	if got := metricValues(t, reg, "meterline_stream_transactions_total")["outcome=aborted,stage=dedup"]; got < 1 {
		t.Fatalf("no aborted transaction (%v): the test did not test anything", metricValues(t, reg, "meterline_stream_transactions_total"))
	}
	if err := st.stop(); err != nil {
		t.Fatal(err)
	}

	// A restart on the same state: the watermark is read back. A copy of
	// y1 is a duplicate, and an event 1 s inside its window is accepted.
	h.start(cfg)
	w := y + 500 // y1's copy still inside its window
	h.produce(
		h.event("acme", "api_calls", "y1", 1, y-swW+1000, w),
		h.event("acme", "api_calls", "w1", 1, w-swW+1000, w),
		h.event("acme", "api_calls", "x1", 1, swArr, swArr+swW-500),
	)
	h.caughtUp()
	o := h.outputs()
	for id, want := range map[string]int{"x1": 1, "y1": 1, "z1": 1, "w1": 1} {
		if n := len(o.dedupedOf(id)); n != want {
			t.Errorf("%s forwarded %d times, want %d", id, n, want)
		}
	}
	if r := o.rejectedOf("x1"); len(r) != 2 || r[0].Reason != schemas.ReasonTooOld || r[1].Reason != schemas.ReasonTooOld {
		t.Errorf("x1's stepped-back copies: rejected %+v, want two too_old", r)
	}
	for _, id := range []string{"y1", "z1", "w1"} {
		if r := o.rejectedOf(id); len(r) != 0 {
			t.Errorf("%s rejected %+v, want none", id, r[0])
		}
	}
	if len(o.duplicates) != 1 || o.duplicates[0].EventID != "y1" {
		t.Errorf("duplicates %+v, want y1's copy", o.duplicates)
	}
}
