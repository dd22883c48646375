package entitlements

import (
	"fmt"
	"testing"
	"time"

	"github.com/meterline/meterline/schemas"
)

// memoLedger returns a Ledger whose Period counts its calls, and a store
// with acme on a plan capped at 100 api_calls a month, paying 1
// micro-credit a unit from a grant.
func memoLedger(t *testing.T, st func(*Ledger) Store) (*Ledger, Store, *int) {
	t.Helper()
	calls := new(int)
	l, err := New(Config{Prefix: []byte("e"), Period: func(ms int64) (int64, int64) { *calls++; return monthBounds(ms) }})
	if err != nil {
		t.Fatal(err)
	}
	s := st(l)
	jan1 := time.Date(2026, time.January, 1, 0, 0, 0, 0, time.UTC).UnixMilli()
	for _, kv := range []struct {
		key string
		m   schemas.Message
	}{
		{"acme", &schemas.Entitlements{CustomerID: "acme", Plan: "free",
			Caps:      []schemas.Cap{{Meter: "api_calls", Limit: 100, OnLimit: schemas.OnLimitReject}},
			Grants:    []schemas.Grant{{ID: "g", Amount: 1_000_000}},
			Overdraft: schemas.Overdraft{Policy: schemas.OverdraftDeny}}},
		{schemas.RateCardKey, &schemas.RateCard{Versions: []schemas.RateVersion{{Rates: []schemas.Rate{
			{Meter: "api_calls", MicroCredits: 1, PerUnits: 1}}}}}},
	} {
		v, err := schemas.Encode(kv.m)
		if err != nil {
			t.Fatal(err)
		}
		k := []byte(kv.key)
		if kv.key == "acme" {
			k = schemas.CustomerKey(kv.key)
		}
		rec, err := ParseRecord(k, v, jan1)
		if err == nil {
			err = l.Apply(s, rec)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	return l, s, calls
}

// TestPeriodMemo: the Ledger remembers the last billing period it
// computed, and an event of another period is counted in its own: 100
// units in January fill January's cap, and the next events, in February,
// then back in January (late), then March, are each checked against their
// own period's usage. Config.Period is called once per change of period,
// not once per event.
func TestPeriodMemo(t *testing.T) {
	l, st, calls := memoLedger(t, func(*Ledger) Store { return newMemStore() })
	at := func(m time.Month, d int) int64 { return time.Date(2026, m, d, 12, 0, 0, 0, time.UTC).UnixMilli() }
	decide := func(q int64, m time.Month, d int) Outcome {
		t.Helper()
		dec, err := l.Decide(st, "acme", Event{Meter: "api_calls", Aggregation: "SUM", Quantity: q, EventTime: at(m, d), Arrival: at(time.March, 28)})
		if err != nil {
			t.Fatal(err)
		}
		return dec.Outcome
	}
	*calls = 0
	for i := range 10 {
		if got := decide(10, time.January, 1+i); got != Accepted {
			t.Fatalf("January event %d: %s", i, got)
		}
	}
	if *calls != 1 {
		t.Fatalf("Period called %d times for 10 events of one period, want 1", *calls)
	}
	for _, c := range []struct {
		q    int64
		m    time.Month
		d    int
		want Outcome
	}{
		{100, time.February, 1, Accepted}, // February's own cap, not January's usage
		{1, time.January, 31, OverLimit},  // January is full
		{1, time.February, 28, OverLimit}, // so is February
		{50, time.March, 1, Accepted},
		{51, time.March, 2, OverLimit},
		{50, time.March, 3, Accepted},
	} {
		if got := decide(c.q, c.m, c.d); got != c.want {
			t.Fatalf("%d units on %s %d: %s, want %s", c.q, c.m, c.d, got, c.want)
		}
	}
	b, err := l.Balance(st, "acme", at(time.March, 28), 1)
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(b.Meters[0].Usage, b.Grants[0].Consumed); got != "100 300" {
		t.Fatalf("March usage and credits consumed: %s, want 100 300", got)
	}
}

// TestChangedAccountAfterWrite: an AccountCache hears of an account's
// first change since it was last written (WriteAccount), so that a change
// after a commit point is written at the next one: the store, read
// without the cache, holds every accepted event's usage after each
// commit.
func TestChangedAccountAfterWrite(t *testing.T) {
	var cs *cachedStore
	l, _, _ := memoLedger(t, func(l *Ledger) Store { cs = newCachedStore(l); return cs })
	day := func(d int) int64 { return time.Date(2026, time.January, d, 12, 0, 0, 0, time.UTC).UnixMilli() }
	for i := 1; i <= 5; i++ {
		for j := range 2 {
			d, err := l.Decide(cs, "acme", Event{Meter: "api_calls", Aggregation: "SUM", Quantity: 3, EventTime: day(i), Arrival: day(i) + int64(j)})
			if err != nil || d.Outcome != Accepted {
				t.Fatalf("event %d: %v %v", i, d.Outcome, err)
			}
		}
		if len(cs.dirty) != 1 {
			t.Fatalf("commit %d: %d accounts changed, want acme's", i, len(cs.dirty))
		}
		cs.commit()
		// The committed store alone, as after a restart.
		b, err := l.Balance(cs.memStore, "acme", day(i)+1, 1)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := b.Meters[0].Usage, int64(6*i); got != want {
			t.Fatalf("after commit %d the store holds usage %d, want %d", i, got, want)
		}
	}
}

// TestOverLimitDetail: the Detail of an OverLimit decision is, byte for
// byte, what fmt made of it before (usage.rejected records do not change).
func TestOverLimitDetail(t *testing.T) {
	for _, plan := range []string{"", "free", `quo"te`, "tab\tand\nnewline", "ünïcode ✓", "\x00\xff bad utf-8", `back\slash`, "del\x7f", "~ tilde", string(make([]byte, 300))} {
		for _, n := range [][3]int64{{0, 1, 0}, {1900, 57, 1900}, {-1, -9223372036854775808, 9223372036854775807}} {
			want := fmt.Sprintf("%s: usage in the period %d + %d would pass the cap %d of plan %q", "api_calls", n[0], n[1], n[2], plan)
			if got := overLimitDetail("api_calls", n[0], n[1], n[2], plan); got != want {
				t.Errorf("overLimitDetail = %q, want %q", got, want)
			}
		}
	}
}

// TestEvaluateIntoReusesDraws: a Decision reused for the next event holds
// that event's draws only.
func TestEvaluateIntoReusesDraws(t *testing.T) {
	l, st, _ := memoLedger(t, func(*Ledger) Store { return newMemStore() })
	jan := time.Date(2026, time.January, 5, 0, 0, 0, 0, time.UTC).UnixMilli()
	var d Decision
	for i := range 3 {
		ev := Event{Meter: "api_calls", Aggregation: "SUM", Quantity: int64(10 + i), EventTime: jan + int64(i), Arrival: jan + int64(i)}
		want, err := l.Evaluate(st, "acme", ev)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.EvaluateInto(st, "acme", &ev, &d); err != nil {
			t.Fatal(err)
		}
		if fmt.Sprint(d.Draws) != fmt.Sprint(want.Draws) || d.Cost != want.Cost || len(d.Draws) != 1 {
			t.Fatalf("event %d: draws %v cost %d, want %v cost %d", i, d.Draws, d.Cost, want.Draws, want.Cost)
		}
		if err := l.Record(st, "acme", ev, d); err != nil {
			t.Fatal(err)
		}
	}
}
