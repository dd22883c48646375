package entitlements

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/meterline/meterline/schemas"
)

// TestAccountPrunedKeepsLateEventCap: pruning drops the periods no event
// can reach any more from a customer's account, and only those: a late
// event of the period before is still checked against that period's own
// usage (accepted up to the cap, over_limit past it), whether the Ledger
// writes the account at once or keeps it in an AccountCache.
func TestAccountPrunedKeepsLateEventCap(t *testing.T) {
	for _, cached := range []bool{false, true} {
		t.Run(map[bool]string{false: "store", true: "cache"}[cached], func(t *testing.T) {
			at := func(m time.Month, d int) int64 { return time.Date(2026, m, d, 12, 0, 0, 0, time.UTC).UnixMilli() }
			l, err := New(Config{Prefix: []byte("e"), Period: monthBounds, Window: 35 * 24 * time.Hour})
			if err != nil {
				t.Fatal(err)
			}
			var st Store = newMemStore()
			commit := func() {}
			if cached {
				cs := newCachedStore(l)
				st, commit = cs, cs.commit
			}
			v, err := schemas.Encode(&schemas.Entitlements{CustomerID: "acme", Plan: "free",
				Caps:      []schemas.Cap{{Meter: "api_calls", Limit: 100, OnLimit: schemas.OnLimitReject}},
				Overdraft: schemas.Overdraft{Policy: schemas.OverdraftDeny}})
			if err != nil {
				t.Fatal(err)
			}
			rec, err := ParseRecord(schemas.CustomerKey("acme"), v, at(time.January, 1))
			if err == nil {
				err = l.Apply(st, rec)
			}
			if err != nil {
				t.Fatal(err)
			}
			decide := func(q, eventTime, arrival int64) Outcome {
				t.Helper()
				d, err := l.Decide(st, "acme", Event{Meter: "api_calls", Aggregation: "SUM", Quantity: q, EventTime: eventTime, Arrival: arrival})
				if err != nil {
					t.Fatal(err)
				}
				return d.Outcome
			}
			if decide(90, at(time.January, 10), at(time.January, 10)) != Accepted || decide(60, at(time.February, 20), at(time.February, 20)) != Accepted {
				t.Fatal("the first events are refused")
			}
			commit()
			// On March 10, no event can belong to January any more
			// (dedup's window is 35 days); February is still reachable.
			now := at(time.March, 10)
			for more := true; more; {
				if more, err = l.PrunePeriods(st, now, 1); err != nil {
					t.Fatal(err)
				}
			}
			commit()
			for _, c := range []struct {
				m    time.Month
				want []string
			}{{time.January, nil}, {time.February, []string{"acme"}}} {
				start, _ := monthBounds(at(c.m, 1))
				if cs, _, err := l.CustomersWithUsage(st, start, "", 10); err != nil || !slices.Equal(cs, c.want) {
					t.Fatalf("customers with usage in %s after pruning: %q, %v; want %q", c.m, cs, err, c.want)
				}
			}
			a, err := l.account(st, "acme")
			if err != nil {
				t.Fatal(err)
			}
			if len(a.periods) != 1 || a.periods[0].start != at(time.February, 1)-12*hourMs || a.periods[0].units("api_calls") != 60 {
				t.Fatalf("acme's account after pruning: %v, want February's 60 units only", a)
			}
			// Late February events arriving on March 10: 60 + 41 passes
			// the cap, 60 + 40 lands on it.
			if o := decide(41, at(time.February, 25), now); o != OverLimit {
				t.Fatalf("41 more units in February: %v, want over_limit", o)
			}
			if o := decide(40, at(time.February, 25), now+1); o != Accepted {
				t.Fatalf("40 more units in February: %v, want accepted", o)
			}
			if o := decide(1, at(time.February, 26), now+2); o != OverLimit {
				t.Fatalf("1 more unit in February: %v, want over_limit", o)
			}
			// March has its own cap.
			if o := decide(100, now, now+3); o != Accepted {
				t.Fatalf("100 units in March: %v, want accepted", o)
			}
			commit()
			b, err := l.Balance(st, "acme", at(time.February, 28), 1)
			if err != nil || len(b.Meters) != 1 || b.Meters[0].Usage != 100 {
				t.Fatalf("February's balance %+v, %v; want usage 100", b, err)
			}
		})
	}
}

// TestAccountEncoding: an account encodes and decodes to itself; a
// truncated or disordered one is ErrCorrupt.
func TestAccountEncoding(t *testing.T) {
	a := &Account{uses: []grantUse{{"a", 7, 5, 100}, {"a", 9, 2, 0}, {"b", legacyGen, 0, math.MaxInt64}}}
	p, _ := a.addPeriod(2000)
	p.add("tokens", 7)
	p.add("api_calls", 3)
	p.overdrawn = 11
	p, _ = a.addPeriod(1000)
	p.add("x", 1)
	b, _ := a.MarshalBinary()
	var got Account
	if err := got.UnmarshalBinary(b); err != nil {
		t.Fatal(err)
	}
	if again, _ := got.MarshalBinary(); !bytes.Equal(again, b) {
		t.Fatalf("%v re-encodes differently", &got)
	}
	if got.period(2000).units("api_calls") != 3 || got.period(2000).units("tokens") != 7 || got.period(1000).units("x") != 1 ||
		got.period(2000).overdrawnIn() != 11 || got.period(3000) != nil {
		t.Fatalf("decoded %v", &got)
	}
	for i := 0; i < len(b); i++ {
		if err := new(Account).UnmarshalBinary(b[:i]); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("%d of %d bytes: %v, want ErrCorrupt", i, len(b), err)
		}
	}
	for _, uses := range [][]grantUse{
		{{"b", 1, 1, 1}, {"a", 1, 1, 1}}, // disordered ids
		{{"a", 2, 1, 1}, {"a", 1, 1, 1}}, // disordered generations
		{{"a", 1, 1, 1}, {"a", 1, 1, 1}}, // twice
		{{"a", 1, 1, -1}},                // a negative expiry
	} {
		bb, _ := (&Account{uses: uses}).MarshalBinary()
		if err := new(Account).UnmarshalBinary(bb); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("grants %v: %v, want ErrCorrupt", uses, err)
		}
	}
}

// TestAccountChangeNote: the broker time noted for a customer's balance
// is kept with its account: encoded only when noted (an account without a
// note encodes byte for byte as before), never moved back, decoded, and a
// note that is not a positive time is ErrCorrupt. It does not keep an
// empty account alive.
func TestAccountChangeNote(t *testing.T) {
	a := &Account{uses: []grantUse{{"a", 1, 5, 100}}}
	plain, _ := a.MarshalBinary()
	a.NoteChange(2000)
	a.NoteChange(1500)
	if a.ChangedAt() != 2000 {
		t.Fatalf("ChangedAt %d after notes 2000 and 1500, want 2000", a.ChangedAt())
	}
	b, _ := a.MarshalBinary()
	if !bytes.HasPrefix(b, plain) || len(b) == len(plain) {
		t.Fatalf("an account with a note encodes as %x, want the plain encoding %x and the note after it", b, plain)
	}
	var got Account
	if err := got.UnmarshalBinary(b); err != nil || got.ChangedAt() != 2000 || got.uses[0] != a.uses[0] {
		t.Fatalf("decoded %v (%v), want the note 2000 back", &got, err)
	}
	if err := got.UnmarshalBinary(plain); err != nil || got.ChangedAt() != 0 {
		t.Fatalf("an account without a note decodes as %v (%v)", &got, err)
	}
	for _, bad := range []int64{0, -5} {
		if err := new(Account).UnmarshalBinary(binary.AppendVarint(bytes.Clone(plain), bad)); !errors.Is(err, ErrCorrupt) {
			t.Errorf("a note of %d: %v, want ErrCorrupt", bad, err)
		}
	}
	e := &Account{}
	e.NoteChange(3000)
	if !e.Empty() {
		t.Error("an account holding only a note is not Empty")
	}
}

// TestBalanceAsOfNeverGoesBack: BalanceAsOf returns the later of the time
// asked and the one the account notes, notes a later time when it is past
// the floor (the watermark), and writes the note with the account, which
// the Store then holds; an empty account keeps none.
func TestBalanceAsOfNeverGoesBack(t *testing.T) {
	l, err := New(Config{Prefix: []byte("e"), Period: monthBounds, Window: 35 * 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	st := newMemStore()
	l.WriteAccount(st, "acme", &Account{uses: []grantUse{{"g1", 1, 5, 100}}}, nil)
	for _, c := range []struct {
		at, floor, want, noted int64
	}{
		{at: 1000, floor: 1000, want: 1000, noted: 0}, // the watermark: no note
		{at: 5000, floor: 1000, want: 5000, noted: 5000},
		{at: 3000, floor: 2000, want: 5000, noted: 5000}, // never back
		{at: 6000, floor: 6000, want: 6000, noted: 5000},
	} {
		got, err := l.BalanceAsOf(st, "acme", c.at, c.floor)
		if err != nil {
			t.Fatal(err)
		}
		noted, err := l.ChangedAt(st, "acme")
		if err != nil {
			t.Fatal(err)
		}
		if got != c.want || noted != c.noted {
			t.Errorf("BalanceAsOf(%d, floor %d) = %d, noted %d; want %d, noted %d", c.at, c.floor, got, noted, c.want, c.noted)
		}
	}
	if got, err := l.BalanceAsOf(st, "nobody", 5000, 1000); err != nil || got != 5000 {
		t.Errorf("BalanceAsOf of an empty account = %d, %v; want 5000", got, err)
	}
	if noted, err := l.ChangedAt(st, "nobody"); err != nil || noted != 0 || len(st.m) != 1 {
		t.Errorf("an empty account noted %d (%v), %d keys; want no note and acme's key alone", noted, err, len(st.m))
	}
}
