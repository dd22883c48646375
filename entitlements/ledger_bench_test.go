package entitlements

import (
	"fmt"
	"testing"
	"time"

	"github.com/meterline/meterline/schemas"
)

// benchStore is a Store with the caches the aggregator's store of the
// Ledger has (its ledgerStore): every read through a map (the
// aggregator's value cache), decoded plans and rate cards
// (DecodeCache), what a customer resolves to (ResolveCache) and the
// accounts decoded and changed in place (AccountCache), written at the
// end of each transaction (flush).
type benchStore struct {
	*resolvingStore
	decoded  map[string]any
	accounts map[string]*benchHeld
	dirty    []string
	buf      []byte
}

type benchHeld struct {
	a     *Account
	dirty bool
}

func newBenchStore(l *Ledger) *benchStore {
	return &benchStore{resolvingStore: newResolvingStore(l), decoded: map[string]any{}, accounts: map[string]*benchHeld{}}
}

func (s *benchStore) Decoded(v []byte) (any, bool)     { x, ok := s.decoded[string(v)]; return x, ok }
func (s *benchStore) KeepDecoded(v []byte, x any)      { s.decoded[string(v)] = x }
func (s *benchStore) KeepAccount(c string, a *Account) { s.accounts[c] = &benchHeld{a: a} }
func (s *benchStore) Account(c string) (*Account, bool) {
	h, ok := s.accounts[c]
	return accountOf(h), ok
}
func accountOf(h *benchHeld) *Account {
	if h == nil {
		return nil
	}
	return h.a
}
func (s *benchStore) ChangedAccount(c string, a *Account) {
	h, ok := s.accounts[c]
	if !ok {
		h = &benchHeld{}
		s.accounts[c] = h
	}
	h.a = a
	if !h.dirty {
		h.dirty = true
		s.dirty = append(s.dirty, c)
	}
}

// flush writes the changed accounts, as the aggregator's Flush does.
func (s *benchStore) flush() {
	for _, c := range s.dirty {
		h := s.accounts[c]
		s.buf = s.l.WriteAccount(s.memStore, c, h.a, s.buf)
		h.dirty = false
	}
	s.dirty = s.dirty[:0]
}

// benchInput is bench aggregate's input with entitlements (internal/bench:
// aggregateEventOf, benchPlan, benchRates): customers in turn, each with
// 40 events of each of five meters a round (SUM api_calls and tokens,
// capped at 1,900 a month and priced, paid from one grant; a MAX, a
// UNIQUE_COUNT and a LATEST meter, neither capped nor priced). Round r is
// in the r-th month after the first, so every round has the same
// decisions: about 6% of the events over the cap.
type benchInput struct {
	customers []string
	base      time.Time
	months    []int64 // the second day of each round's month, epoch ms
}

var benchMeters = []struct{ name, agg string }{
	{"api_calls", "SUM"}, {"tokens", "SUM"}, {"storage_bytes", "MAX"}, {"active_users", "UNIQUE_COUNT"}, {"seats", "LATEST"},
}

func newBenchInput(customers int) *benchInput {
	in := &benchInput{base: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	for c := range customers {
		in.customers = append(in.customers, fmt.Sprintf("cust-%05d", c))
	}
	return in
}

func (in *benchInput) perRound() int { return len(in.customers) * len(benchMeters) * 40 }

// event returns event i and its customer.
func (in *benchInput) event(i int) (string, Event) {
	n := len(in.customers)
	round := i / in.perRound()
	for len(in.months) <= round {
		in.months = append(in.months, in.base.AddDate(0, len(in.months), 1).UnixMilli())
	}
	m := benchMeters[(i/n)%len(benchMeters)]
	at := in.months[round] + int64(i%in.perRound())/10
	return in.customers[i%n], Event{Meter: m.name, Aggregation: m.agg, Quantity: int64(1 + i%100),
		EventTime: at - int64(i%1000), Arrival: at}
}

// newBenchLedger returns a Ledger and its store with bench aggregate's
// default plan and rate card applied.
func newBenchLedger(tb testing.TB, in *benchInput) (*Ledger, *benchStore) {
	l, err := New(Config{Prefix: []byte("e"), Period: monthBounds})
	if err != nil {
		tb.Fatal(err)
	}
	st := newBenchStore(l)
	written := in.base.UnixMilli() - 1000
	plan := &schemas.Entitlements{Plan: "bench",
		Caps: []schemas.Cap{{Meter: "api_calls", Limit: 1900, OnLimit: schemas.OnLimitReject},
			{Meter: "tokens", Limit: 1900, OnLimit: schemas.OnLimitReject}},
		Grants:    []schemas.Grant{{ID: "bench", Amount: 1_000_000_000}},
		Overdraft: schemas.Overdraft{Policy: schemas.OverdraftDeny}}
	rates := &schemas.RateCard{Versions: []schemas.RateVersion{{Rates: []schemas.Rate{
		{Meter: "api_calls", MicroCredits: 1, PerUnits: 1}, {Meter: "tokens", MicroCredits: 15, PerUnits: 1000}}}}}
	for _, kv := range []struct {
		key string
		m   schemas.Message
	}{{schemas.DefaultPlanKey, plan}, {schemas.RateCardKey, rates}} {
		v, err := schemas.Encode(kv.m)
		if err != nil {
			tb.Fatal(err)
		}
		rec, err := ParseRecord([]byte(kv.key), v, written)
		if err != nil {
			tb.Fatal(err)
		}
		if err := l.Apply(st, rec); err != nil {
			tb.Fatal(err)
		}
	}
	return l, st
}

// BenchmarkLedgerEvaluateRecord measures what entitlements cost the
// aggregator per event in its Ledger: EvaluateInto, Record of an accepted
// event, and a share of writing the changed accounts once per
// transaction (txEvents events), on bench aggregate's input (5,000
// customers; about 6% of the events over their cap).
func BenchmarkLedgerEvaluateRecord(b *testing.B) {
	const txEvents = 2000
	in := newBenchInput(5000)
	l, st := newBenchLedger(b, in)
	// A first pass loads every account: the steady state.
	for i := range len(in.customers) * len(benchMeters) {
		c, ev := in.event(i)
		if _, err := l.Decide(st, c, ev); err != nil {
			b.Fatal(err)
		}
	}
	st.flush()
	rejected := 0
	var d Decision // reused, as the aggregator's charge is
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		c, ev := in.event(i)
		if err := l.EvaluateInto(st, c, &ev, &d); err != nil {
			b.Fatal(err)
		}
		if d.Outcome == Accepted {
			if err := l.RecordDecided(st, c, &ev, &d); err != nil {
				b.Fatal(err)
			}
		} else {
			rejected++
		}
		if i%txEvents == txEvents-1 {
			st.flush()
		}
	}
	b.StopTimer()
	if b.N >= in.perRound() {
		b.ReportMetric(float64(rejected)/float64(b.N)*100, "%rejected")
	}
}
