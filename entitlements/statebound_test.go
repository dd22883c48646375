package entitlements

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meterline/meterline/schemas"
)

// syncCard is a rate card as a billing system keeps it: meters at rates
// that changed twice, with the past versions kept (docs/entitlements.md,
// The rate card). gen changes the latest version's rates.
func syncCard(meters int, gen int64) *schemas.RateCard {
	c := &schemas.RateCard{}
	for v, from := range []int64{
		time.Date(2026, 10, 1, 0, 0, 0, 0, time.UTC).UnixMilli(),
		time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC).UnixMilli(),
		time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC).UnixMilli(),
	} {
		rv := schemas.RateVersion{EffectiveFrom: from}
		for m := range meters {
			rate := int64(1000 + 10*v + m)
			if v == 2 {
				rate += gen
			}
			rv.Rates = append(rv.Rates, schemas.Rate{Meter: fmt.Sprintf("meter_%02d", m), MicroCredits: rate, PerUnits: 1000})
		}
		c.Versions = append(c.Versions, rv)
	}
	return c
}

// TestRateCardWrittenAgainUnchangedTakesNoState: a billing system that
// writes its rate card every hour, unchanged, as it may a customer's
// record (docs/entitlements.md, The aggregator), leaves the state as the first
// write did. The rate history is one state value, written in the
// changelog whole with every card read: kept per write, a card of 40
// meters written hourly for the 71 days the history spans would make it
// megabytes, past the broker's record size, and no transaction of the
// partition (every partition: the card is on each) could commit.
func TestRateCardWrittenAgainUnchangedTakesNoState(t *testing.T) {
	span := DefaultWindow + 25*time.Hour
	l, err := New(Config{Prefix: []byte("e"), Period: monthBounds, Span: span})
	if err != nil {
		t.Fatal(err)
	}
	st := newMemStore()
	base := time.Date(2026, 12, 10, 0, 0, 0, 0, time.UTC).UnixMilli()
	var first int
	for i := range int64(30 * 24) {
		at := base + i*time.Hour.Milliseconds()
		// A stage caught up: its watermark at the record's time.
		readRecord(t, l, st, []byte(schemas.RateCardKey), syncCard(40, 0), at, at-span.Milliseconds())
		v, _, _ := st.Get(l.keyRates)
		if i == 0 {
			first = len(v)
		} else if len(v) != first {
			t.Fatalf("write %d of the same card: the rate history is %d bytes, %d after the first", i+1, len(v), first)
		}
	}
	d, err := l.Evaluate(st, "acme", Event{Meter: "meter_03", Aggregation: "SUM", Quantity: 1000, EventTime: base + 5, Arrival: base + 6})
	if err != nil || d.Cost != 1023 {
		t.Fatalf("an event priced %d (%v), want 1023", d.Cost, err)
	}
}

// TestRateCardBoundSameWhenLagging: rate cards that change every 15
// minutes are refused, as a customer's records are (Timeline), once
// MaxVersions cards take effect within the span before one; whether one
// is refused depends on the records alone. One ledger is pruned after
// each card to the span before it (a stage caught up), the other never
// (a stage far behind on usage.deduped keeps every card): both refuse
// the same cards and price alike. The caught-up one keeps at most
// 3·MaxVersions + 1 cards: those of two spans, whose bytes a card counts
// (Ledger.bytesSpan), and of the window W (here a span) before them,
// since a late event is priced by the card of its event time.
func TestRateCardBoundSameWhenLagging(t *testing.T) {
	const span = 3 * 24 * time.Hour
	const step = 15 * time.Minute
	// sides[0] is caught up, sides[1] lagging.
	var sides [2]struct {
		l       *Ledger
		st      Store
		refused int
	}
	for k := range sides {
		l, err := New(Config{Prefix: []byte("e"), Period: monthBounds, Window: span, Span: span})
		if err != nil {
			t.Fatal(err)
		}
		sides[k].l, sides[k].st = l, newMemStore()
	}
	base := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC).UnixMilli()
	n := int64(7 * 24 * time.Hour / step)
	for i := range n {
		at := base + i*step.Milliseconds()
		v, _ := schemas.Encode(syncCard(3, i))
		var costs [2]int64
		for k := range sides {
			sd := &sides[k]
			rec, err := ParseRecord([]byte(schemas.RateCardKey), v, at)
			if err == nil {
				if err = sd.l.Apply(sd.st, rec); errors.Is(err, ErrTooManyVersions) {
					sd.refused, err = sd.refused+1, nil
				}
			}
			if err == nil && k == 0 {
				err = sd.l.PruneShared(sd.st, at-span.Milliseconds())
			}
			var d Decision
			if err == nil {
				d, err = sd.l.Evaluate(sd.st, "acme", Event{Meter: "meter_01", Aggregation: "SUM", Quantity: 1000, EventTime: at + 1, Arrival: at + 1})
			}
			if err != nil {
				t.Fatalf("card %d, side %d: %v", i, k, err)
			}
			costs[k] = d.Cost
		}
		if sides[0].refused != sides[1].refused || costs[0] != costs[1] {
			t.Fatalf("card %d at +%s: caught up refused %d and priced %d; lagging refused %d and priced %d",
				i, time.Duration(i)*step, sides[0].refused, costs[0], sides[1].refused, costs[1])
		}
	}
	if sides[0].refused == 0 {
		t.Error("no card refused")
	}
	h, err := sides[0].l.rates(sides[0].st)
	if err != nil || h.Len() > 3*MaxVersions+1 {
		t.Errorf("the caught-up stage keeps %d cards (%v), want at most %d", h.Len(), err, 3*MaxVersions+1)
	}
	t.Logf("refused %d of %d cards on both", sides[0].refused, n)
}

// bigPlan is a customer's record of MaxCaps caps and MaxGrants grants
// with names of MaxNameBytes: about 530 KB, valid on its own.
func bigPlan(name string) *schemas.Entitlements {
	e := &schemas.Entitlements{CustomerID: "acme", Plan: name, Overdraft: schemas.Overdraft{Policy: schemas.OverdraftAllow}}
	for i := range MaxCaps {
		e.Caps = append(e.Caps, schemas.Cap{Meter: fmt.Sprintf("%04d", i) + strings.Repeat("m", MaxNameBytes-4), Limit: 1, OnLimit: schemas.OnLimitReject})
	}
	for i := range MaxGrants {
		e.Grants = append(e.Grants, schemas.Grant{ID: fmt.Sprintf("%04d", i) + strings.Repeat("g", MaxNameBytes-4), Amount: 1})
	}
	return e
}

// TestVersionsBoundedInBytes: a key's versions are one state value,
// written whole to the changelog, which refuses a record past the
// broker's size (1 MB by default): two versions of a customer's record of
// about 530 KB would make the partition's every transaction fail. The
// second is refused (ErrTooManyVersions) while the first counts, and the
// state value stays under MaxVersionBytes; a smaller record is applied.
// Rate cards alike.
func TestVersionsBoundedInBytes(t *testing.T) {
	l, err := New(Config{Prefix: []byte("e"), Period: monthBounds})
	if err != nil {
		t.Fatal(err)
	}
	st := newMemStore()
	at := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC).UnixMilli()
	apply := func(key []byte, m schemas.Message) error {
		t.Helper()
		at += 1000
		v, err := schemas.Encode(m)
		if err != nil {
			t.Fatal(err)
		}
		rec, err := ParseRecord(key, v, at)
		if err != nil {
			t.Fatal(err)
		}
		return l.Apply(st, rec)
	}
	key := schemas.CustomerKey("acme")
	if err := apply(key, bigPlan("one")); err != nil {
		t.Fatal(err)
	}
	if err := apply(key, bigPlan("two")); !errors.Is(err, ErrTooManyVersions) {
		t.Fatalf("a second record of about 530 KB: %v, want ErrTooManyVersions", err)
	}
	small := &schemas.Entitlements{CustomerID: "acme", Plan: "small", Overdraft: schemas.Overdraft{Policy: schemas.OverdraftDeny}}
	if err := apply(key, small); err != nil {
		t.Fatalf("a small record after it: %v", err)
	}
	if v, _, _ := st.Get(l.customerKey(subTimeline, "acme")); len(v) > MaxVersionBytes {
		t.Errorf("the timeline is %d bytes, more than %d", len(v), MaxVersionBytes)
	}
	card := func(price int64) *schemas.RateCard {
		v := schemas.RateVersion{}
		for i := range 400 {
			v.Rates = append(v.Rates, schemas.Rate{Meter: fmt.Sprintf("%04d", i) + strings.Repeat("m", MaxNameBytes-4), MicroCredits: price, PerUnits: 1})
		}
		return &schemas.RateCard{Versions: []schemas.RateVersion{v}}
	}
	if err := apply([]byte(schemas.RateCardKey), card(1)); err != nil {
		t.Fatal(err)
	}
	if err := apply([]byte(schemas.RateCardKey), card(2)); !errors.Is(err, ErrTooManyVersions) {
		t.Fatalf("a second rate card of about 420 KB: %v, want ErrTooManyVersions", err)
	}
	if v, _, _ := st.Get(l.keyRates); len(v) > MaxVersionBytes {
		t.Errorf("the rate history is %d bytes, more than %d", len(v), MaxVersionBytes)
	}
}

// TestUndeclaredMetersKeepNoUsage: a customer's usage account is one
// state value, with an entry per meter it used in a period. A producer
// chooses undeclared meter names (counted as SUM without strict meters):
// 40,000 of them made an account of 1.4 MB, past the broker's record
// size. An undeclared meter's usage is kept only while the plan caps it
// or the rate card prices it; a capped one is still stopped at its cap.
func TestUndeclaredMetersKeepNoUsage(t *testing.T) {
	l, err := New(Config{Prefix: []byte("e"), Period: monthBounds, Span: DefaultWindow})
	if err != nil {
		t.Fatal(err)
	}
	st := newMemStore()
	base := time.Date(2026, 12, 10, 0, 0, 0, 0, time.UTC).UnixMilli()
	readRecord(t, l, st, schemas.CustomerKey("acme"), &schemas.Entitlements{CustomerID: "acme", Plan: "free",
		Caps:      []schemas.Cap{{Meter: "capped_undeclared", Limit: 10, OnLimit: schemas.OnLimitReject}},
		Overdraft: schemas.Overdraft{Policy: schemas.OverdraftAllow}}, base, base-DefaultWindow.Milliseconds())
	decide := func(meter string, at int64) Decision {
		t.Helper()
		ev := Event{Meter: meter, Aggregation: "SUM", Quantity: 4, EventTime: at, Arrival: at, Undeclared: true}
		d, err := l.Evaluate(st, "acme", ev)
		if err == nil && d.Outcome == Accepted {
			err = l.Record(st, "acme", ev, d)
		}
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	for i := range 2000 {
		if d := decide(fmt.Sprintf("api_call_%08d_from_a_buggy_sdk", i), base+int64(i)+1); d.Outcome != Accepted {
			t.Fatalf("event %d: %s, want accepted", i, d.Outcome)
		}
	}
	if v, _, _ := st.Get(l.customerKey(subAccount, "acme")); len(v) > 64 {
		t.Fatalf("2,000 undeclared meters, neither capped nor priced: the account is %d bytes", len(v))
	}
	var outcomes []Outcome
	for i := range 3 {
		outcomes = append(outcomes, decide("capped_undeclared", base+10_000+int64(i)).Outcome)
	}
	if want := []Outcome{Accepted, Accepted, OverLimit}; !slices.Equal(outcomes, want) {
		t.Errorf("an undeclared meter capped at 10, events of 4: %v, want %v", outcomes, want)
	}
}
