package entitlements

import (
	"errors"
	"testing"
	"time"

	"github.com/meterline/meterline/schemas"
)

// TestUnchangedRecordTakesNoVersion: a billing system that writes every
// customer's record each hour, unchanged, within the window: the records
// take no version of their own (the version in effect already says what
// they say), so none is refused for MaxVersions, the grant's generation
// goes on (what it paid still counts), and a changed record still takes a
// version. When each one took a version, the 257th hourly record within
// the window (after about eleven days) was refused as too many versions.
func TestUnchangedRecordTakesNoVersion(t *testing.T) {
	const window = 35 * 24 * time.Hour
	l, err := New(Config{Prefix: []byte("e"), Period: monthBounds, Window: window})
	if err != nil {
		t.Fatal(err)
	}
	st := newMemStore()
	base := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC).UnixMilli()
	applyCard(t, l, st, unitCard(), base-1)
	rec := func(amount int64) *schemas.Entitlements {
		return &schemas.Entitlements{CustomerID: "acme", Plan: "pro",
			Caps:      []schemas.Cap{{Meter: "m", Limit: 1_000_000, OnLimit: schemas.OnLimitReject}},
			Grants:    []schemas.Grant{{ID: "g", Amount: amount}},
			Overdraft: schemas.Overdraft{Policy: schemas.OverdraftDeny}}
	}
	key := schemas.CustomerKey("acme")
	versions := func() int {
		t.Helper()
		tl, err := l.timeline(st, l.customerKey(subTimeline, "acme"))
		if err != nil {
			t.Fatal(err)
		}
		return tl.Len()
	}
	const hours = 3 * MaxVersions
	for h := range int64(hours) {
		at := base + h*hourMs
		// The watermark is the latest arrival: nothing within the window
		// is pruned (the horizon is the window before it).
		readRecord(t, l, st, key, rec(100_000), at, at-window.Milliseconds())
		d, err := l.Decide(st, "acme", Event{Meter: "m", Aggregation: "SUM", Quantity: 10, EventTime: at + 1, Arrival: at + 1})
		if err != nil || d.Outcome != Accepted {
			t.Fatalf("hour %d: %+v, %v", h, d, err)
		}
	}
	if n := versions(); n != 1 {
		t.Fatalf("%d records of one content: %d versions, want 1", hours, n)
	}
	// The grant paid 10 an hour from one generation: 100,000 - 10·hours
	// left, and an event of more than that is refused.
	at := base + hours*hourMs
	left := int64(100_000 - 10*hours)
	if d, err := l.Decide(st, "acme", Event{Meter: "m", Aggregation: "SUM", Quantity: left + 1, EventTime: at, Arrival: at}); err != nil || d.Outcome != NoCredit {
		t.Fatalf("an event of %d with %d left: %+v, %v", left+1, left, d, err)
	}
	// A changed record takes a version, and applies.
	readRecord(t, l, st, key, rec(200_000), at, at-window.Milliseconds())
	if n := versions(); n != 2 {
		t.Fatalf("after a changed record: %d versions, want 2", n)
	}
	if d, err := l.Decide(st, "acme", Event{Meter: "m", Aggregation: "SUM", Quantity: left + 1, EventTime: at + 1, Arrival: at + 1}); err != nil || d.Outcome != Accepted {
		t.Fatalf("an event of %d after the grant was raised: %+v, %v", left+1, d, err)
	}
}

// TestTimelineSameVersionReplacesScheduled: a record that says what the
// version in effect at its time says takes no version, and still
// replaces what was scheduled after it, as any record does.
func TestTimelineSameVersionReplacesScheduled(t *testing.T) {
	var tl Timeline
	for _, s := range []struct {
		written, from int64
		p             *Plan
	}{{100, 0, plan("a")}, {200, 500, plan("b")}, {300, 0, plan("a")}} {
		if err := tl.Set(s.written, s.from, s.p); err != nil {
			t.Fatal(err)
		}
	}
	if got := planName(tl.At(600)); got != "a" || tl.Len() != 1 {
		t.Fatalf("At(600) = %s with %d versions, want a alone: b, scheduled for 500, was replaced", got, tl.Len())
	}
	// Two deletes: the second takes no version either.
	_ = tl.Set(400, 0, nil)
	_ = tl.Set(450, 0, nil)
	if tl.Len() != 2 || planName(tl.At(460)) != "deleted" {
		t.Fatalf("versions %+v", tl.Versions())
	}
	if err := tl.Set(470, 0, plan("c")); errors.Is(err, ErrTooManyVersions) || planName(tl.At(480)) != "c" {
		t.Fatalf("a changed record: %v, %+v", err, tl.Versions())
	}
}
