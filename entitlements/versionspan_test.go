package entitlements

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/meterline/meterline/schemas"
)

// TestVersionBoundSameWhenLagging: whether the bound of MaxVersions
// refuses a record depends on the records alone, not on how far the stage
// has pruned. One ledger is pruned after each record to the span before
// it (a stage caught up: its watermark at the record's time), the other
// never (a stage whose watermark is far behind keeps every version). A
// customer's record changes every 15 minutes for 12 days, with a span of
// 5 days: both refuse the same records and decide the same events.
func TestVersionBoundSameWhenLagging(t *testing.T) {
	const span = 5 * 24 * time.Hour
	const step = 15 * time.Minute
	mk := func() (*Ledger, Store) {
		l, err := New(Config{Prefix: []byte("e"), Period: monthBounds, Window: span, Span: span})
		if err != nil {
			t.Fatal(err)
		}
		return l, newMemStore()
	}
	caught, caughtSt := mk()
	lagging, laggingSt := mk()
	base := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC).UnixMilli()
	key := schemas.CustomerKey("acme")
	refused := [2]int{}
	for i := range int64(12 * 24 * time.Hour / step) {
		at := base + i*step.Milliseconds()
		m := &schemas.Entitlements{CustomerID: "acme", Plan: fmt.Sprintf("p%d", i),
			Caps:      []schemas.Cap{{Meter: "m", Limit: 1_000 + i, OnLimit: schemas.OnLimitReject}},
			Overdraft: schemas.Overdraft{Policy: schemas.OverdraftDeny}}
		v, err := schemas.Encode(m)
		if err != nil {
			t.Fatal(err)
		}
		var errs [2]error
		for k, side := range []struct {
			l  *Ledger
			st Store
		}{{caught, caughtSt}, {lagging, laggingSt}} {
			rec, err := ParseRecord(key, v, at)
			if err != nil {
				t.Fatal(err)
			}
			errs[k] = side.l.Apply(side.st, rec)
			if errs[k] != nil && !errors.Is(errs[k], ErrTooManyVersions) {
				t.Fatalf("record %d: %v", i, errs[k])
			}
			if errs[k] != nil {
				refused[k]++
			}
			if k == 0 {
				if err := side.l.PruneCustomer(side.st, "acme", at-span.Milliseconds()); err != nil {
					t.Fatal(err)
				}
			}
		}
		if (errs[0] == nil) != (errs[1] == nil) {
			t.Fatalf("record %d at +%s: caught up: %v; lagging: %v", i, time.Duration(i)*step, errs[0], errs[1])
		}
		ev := Event{Meter: "m", Aggregation: "SUM", Quantity: 1, EventTime: at + 1, Arrival: at + 1}
		d0, err0 := caught.Evaluate(caughtSt, "acme", ev)
		d1, err1 := lagging.Evaluate(laggingSt, "acme", ev)
		if err0 != nil || err1 != nil || d0.Plan == nil || d1.Plan == nil || d0.Plan.Name != d1.Plan.Name {
			t.Fatalf("record %d: an event decided by plan %v (%v) caught up, %v (%v) lagging", i, d0.Plan, err0, d1.Plan, err1)
		}
	}
	// 480 changes a span: refused once 256 versions take effect within
	// one, so some were, and alike.
	if refused[0] == 0 || refused[0] != refused[1] {
		t.Errorf("refused %d caught up and %d lagging: want the same, more than 0", refused[0], refused[1])
	}
	t.Logf("refused %d of %d records on both", refused[0], 12*24*time.Hour/step)
}

// TestTimelineSetWithinCountsFromSince: the versions before the one in
// effect at since do not count.
func TestTimelineSetWithinCountsFromSince(t *testing.T) {
	var tl Timeline
	for i := range int64(MaxVersions + 10) {
		if err := tl.Set(1000+i, 0, plan(fmt.Sprintf("x%d", i))); err != nil && i < MaxVersions {
			t.Fatalf("version %d: %v", i, err)
		}
	}
	// Counting from the version in effect at 1010 (x10): 246 versions.
	if err := tl.SetWithin(5000, 0, plan("y"), 1010, 1010); err != nil {
		t.Fatalf("with 246 counted: %v", err)
	}
	// x0 … x255 and y: 257 from 999, 256 from 1001 (x1), 255 from 1002.
	for _, c := range []struct {
		since int64
		ok    bool
	}{{999, false}, {1001, false}, {1002, true}} {
		err := tl.SetWithin(5001, 0, plan("z"), c.since, c.since)
		if c.ok != (err == nil) || err != nil && !errors.Is(err, ErrTooManyVersions) {
			t.Errorf("since %d: %v, want accepted %v", c.since, err, c.ok)
		}
	}
}
