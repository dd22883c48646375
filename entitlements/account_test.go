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
// note that is not a positive time is ErrCorrupt. An account holding
// only a note is Empty (of usage and grants), and encodes as an empty
// account followed by the note.
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
	emptyEnc, _ := e.MarshalBinary()
	e.NoteChange(3000)
	if !e.Empty() || !e.noteOnly() {
		t.Error("an account holding only a note is not Empty and noteOnly")
	}
	b, _ = e.MarshalBinary()
	if err := got.UnmarshalBinary(b); err != nil || !bytes.HasPrefix(b, emptyEnc) || got.ChangedAt() != 3000 || !got.noteOnly() {
		t.Errorf("an account holding only a note encodes as %x, decodes as %v (%v)", b, &got, err)
	}
}

// TestBalanceAsOfNeverGoesBack: BalanceAsOf returns the later of the time
// asked and the one the account notes, notes a later time when it is past
// the floor (the watermark), and writes the note with the account, which
// the Store then holds; an account with nothing else is kept for its note
// (TestNoteOnlyAccount), and is as of no earlier time either.
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
	for _, c := range []struct{ at, floor, want int64 }{{5000, 1000, 5000}, {3000, 2000, 5000}} {
		if got, err := l.BalanceAsOf(st, "nobody", c.at, c.floor); err != nil || got != c.want {
			t.Errorf("BalanceAsOf(%d, floor %d) of an empty account = %d, %v; want %d", c.at, c.floor, got, err, c.want)
		}
	}
}

// putCounter is a memStore that counts the Puts of each key.
type putCounter struct {
	*memStore
	puts map[string]int
}

func (s *putCounter) Put(k, v []byte) {
	s.puts[string(k)]++
	s.memStore.Put(k, v)
}

// TestNoteOnlyAccount: an account with no usage and no grant is kept for
// the note BalanceAsOf gives it, in the note index of the note's period
// (put once per period, not with each note); BalanceAsOf drops it, its key
// deleted, once its note is at or below the floor; PrunePeriods deletes
// the note index below its cut, and the accounts whose note is at or below
// its horizon, and keeps the others; an account that pruning its usage
// leaves with a note alone is kept, in the note index of its period, or
// dropped with its note when that is at or below the horizon.
func TestNoteOnlyAccount(t *testing.T) {
	l, err := New(Config{Prefix: []byte("e"), Period: monthBounds, Window: 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	st := &putCounter{newMemStore(), map[string]int{}}
	jan, feb, mar := int64(0), monthMS(1970, 2), monthMS(1970, 3)
	acct, note := l.customerKey(subAccount, "nobody"), func(start int64) string {
		return string(l.indexKey(subNote, start, "nobody"))
	}
	asOf := func(at, floor, want int64) {
		t.Helper()
		if got, err := l.BalanceAsOf(st, "nobody", at, floor); err != nil || got != want {
			t.Fatalf("BalanceAsOf(%d, floor %d) = %d, %v; want %d", at, floor, got, err, want)
		}
	}
	asOf(jan+5000, jan+1000, jan+5000)
	asOf(jan+7000, jan+1000, jan+7000)
	asOf(jan+6000, jan+1000, jan+7000)
	if noted, err := l.ChangedAt(st, "nobody"); err != nil || noted != jan+7000 || st.puts[note(jan)] != 1 || len(st.m) != 2 {
		t.Fatalf("noted %d (%v), note index put %d times, %d keys; want 7000, once, the account and its index key", noted, err,
			st.puts[note(jan)], len(st.m))
	}
	const day = 24 * 3600_000
	asOf(feb+2*day, jan+1000, feb+2*day)
	if st.puts[note(feb)] != 1 || len(st.m) != 3 {
		t.Fatalf("a note of February: index put %d times, %d keys; want once, 3", st.puts[note(feb)], len(st.m))
	}
	// Pruned below February: January's index key goes, the account (its
	// note in February, past the horizon) stays.
	if more, err := l.PrunePeriods(st, feb+day, 10); err != nil || more {
		t.Fatal(more, err)
	}
	if _, ok := st.m[note(jan)]; ok || len(st.m) != 2 {
		t.Fatalf("after pruning January: %d keys, January's note index key kept: %v", len(st.m), ok)
	}
	// The watermark passes the note: the next balance drops it.
	asOf(feb+3*day, feb+3*day, feb+3*day)
	if _, ok := st.m[string(acct)]; ok {
		t.Fatal("an account holding only a note at or below the floor is kept")
	}
	asOf(feb+4*day, feb+day, feb+4*day) // noted again, its index key there
	if more, err := l.PrunePeriods(st, mar+day, 10); err != nil || more || len(st.m) != 0 {
		t.Fatalf("pruned below March: %v, %v; %d keys left, want none", more, err, len(st.m))
	}
	// An account with usage and a note: pruning its usage keeps a note
	// past the horizon, in the index of its period.
	for _, c := range []struct {
		note int64
		kept bool
	}{{mar + 2*day, true}, {mar + 10, false}} {
		a := &Account{periods: []periodUse{{start: feb, meters: []meterUse{{"api_calls", 1}}}}}
		a.NoteChange(c.note)
		l.WriteAccount(st, "nobody", a, nil)
		st.Put(l.periodIndexKey(feb, "nobody"), indexValue)
		if more, err := l.PrunePeriods(st, mar+day, 10); err != nil || more {
			t.Fatal(more, err)
		}
		_, kept := st.m[string(acct)]
		_, indexed := st.m[note(mar)]
		if noted, _ := l.ChangedAt(st, "nobody"); kept != c.kept || indexed != c.kept || c.kept && noted != c.note {
			t.Errorf("a note of %d pruned at horizon %d: kept %v, indexed %v, noted %d; want kept %v", c.note, mar+day, kept,
				indexed, noted, c.kept)
		}
		clear(st.m)
	}
}

// monthMS is the start of a month, epoch ms.
func monthMS(y, m int) int64 { return time.Date(y, time.Month(m), 1, 0, 0, 0, 0, time.UTC).UnixMilli() }
