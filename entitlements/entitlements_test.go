package entitlements

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/meterline/meterline/schemas"
)

func TestCost(t *testing.T) {
	const M = math.MaxInt64
	for _, c := range []struct {
		units, micro, per int64
		want              int64
		ok                bool
	}{
		{0, 1000, 1, 0, true},
		{3, 1000, 1, 3000, true},
		{1, 1, 2, 1, true}, // 0.5 → 1
		{3, 1, 2, 2, true}, // 1.5 → 2
		{5, 1, 2, 3, true}, // 2.5 → 3 (half up, not to even)
		{1, 1, 3, 0, true}, // 0.333 → 0
		{2, 1, 3, 1, true}, // 0.667 → 1
		{100, 15, 1000, 2, true},
		{3333, 15, 1000, 50, true}, // 49.995
		{33, 15, 1000, 0, true},    // 0.495
		{M, 1, 1, M, true},
		{M, 1, 2, M/2 + 1, true}, // (2^63−1)/2 = 2^62 − 0.5 → 2^62
		{M, M, M, M, true},
		{M, 2, 1, 0, false},
		{M/2 + 1, 2, 1, 0, false},
		{M / 2, 2, 1, M - 1, true},
		{M, M, 1, 0, false},
		{1, 1, 0, 0, false},
		{-1, 1, 1, 0, false},
	} {
		got, ok := Cost(c.units, schemas.Rate{MicroCredits: c.micro, PerUnits: c.per})
		if got != c.want || ok != c.ok {
			t.Errorf("Cost(%d × %d/%d) = %d, %v; want %d, %v", c.units, c.micro, c.per, got, ok, c.want, c.ok)
		}
	}
}

func plan(name string) *Plan {
	return &Plan{Name: name, Overdraft: schemas.Overdraft{Policy: schemas.OverdraftAllow}}
}

func planName(p *Plan, ok bool) string {
	switch {
	case !ok:
		return "none"
	case p == nil:
		return "deleted"
	}
	return p.Name
}

// TestTimeline: effective_from is raised to the broker time; a record
// replaces what would have taken effect at or after its own time; a
// tombstone takes effect at its broker time; Prune keeps what is in
// effect at the horizon.
func TestTimeline(t *testing.T) {
	var tl Timeline
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(tl.Set(100, 0, plan("a")))   // from 100
	must(tl.Set(200, 150, plan("b"))) // raised to 200
	must(tl.Set(210, 400, plan("c"))) // scheduled
	must(tl.Set(220, 300, plan("d"))) // replaces c
	must(tl.Set(230, 0, nil))         // deleted from 230, d with it
	for _, c := range []struct {
		at   int64
		want string
	}{{99, "none"}, {100, "a"}, {199, "a"}, {200, "b"}, {229, "b"}, {230, "deleted"}, {300, "deleted"}, {400, "deleted"}} {
		if got := planName(tl.At(c.at)); got != c.want {
			t.Errorf("At(%d) = %s, want %s", c.at, got, c.want)
		}
	}
	// The tombstone at 230 replaced d, scheduled for 300, after it.
	if tl.Len() != 3 {
		t.Fatalf("versions %+v, want a, b and the tombstone", tl.Versions())
	}
	tl.Prune(205)
	if tl.Len() != 2 || planName(tl.At(205)) != "b" {
		t.Fatalf("after Prune(205): %+v", tl.Versions())
	}
	tl.Prune(1000)
	if tl.Len() != 0 {
		t.Fatalf("a lone tombstone before the horizon is dropped: %+v", tl.Versions())
	}
	for i := 0; i < MaxVersions; i++ {
		must(tl.Set(int64(1000+i), 0, plan(fmt.Sprintf("x%d", i))))
	}
	if err := tl.Set(5000, 0, plan("y")); !errors.Is(err, ErrTooManyVersions) || !errors.Is(err, ErrInvalid) {
		t.Fatalf("Set past MaxVersions = %v", err)
	}
}

func TestTimelineTombstoneReplacesScheduled(t *testing.T) {
	var tl Timeline
	_ = tl.Set(100, 500, plan("later"))
	_ = tl.Set(200, 0, nil)
	if got := planName(tl.At(600)); got != "deleted" {
		t.Fatalf("At(600) = %s: a delete replaces what was scheduled after it", got)
	}
}

// TestRateHistory: the card as it stood at min(arrival, event_time), its
// version at event_time; a card whose broker time stepped back counts as
// written at the previous card's time; Prune keeps what prices the horizon.
func TestRateHistory(t *testing.T) {
	card := func(vs ...int64) *schemas.RateCard {
		c := &schemas.RateCard{}
		for _, v := range vs {
			c.Versions = append(c.Versions, schemas.RateVersion{EffectiveFrom: v, Rates: []schemas.Rate{{Meter: "m", MicroCredits: v, PerUnits: 1}}})
		}
		return c
	}
	var h RateHistory
	if err := h.Set(100, card(10, 150)); err != nil {
		t.Fatal(err)
	}
	if err := h.Set(200, card(10, 150, 180, 300)); err != nil {
		t.Fatal(err)
	}
	if err := h.Set(190, nil); err != nil { // stepped back: counts at 200
		t.Fatal(err)
	}
	if err := h.Set(400, card(10)); err != nil {
		t.Fatal(err)
	}
	rate := func(arrival, et int64) int64 {
		r, ok := h.Rate(arrival, et, "m")
		if !ok {
			return -1
		}
		return r.MicroCredits
	}
	for _, c := range []struct{ arrival, et, want int64 }{
		{50, 50, -1},    // before any card
		{120, 120, 10},  // card 1, version 10
		{160, 160, 150}, // card 1, version 150
		{185, 185, 150}, // card 2 (written 200) not yet: 180 cannot reprice 185
		{250, 185, 150}, // late: priced by the card as it stood at 185
		{150, 250, 150}, // skew: arrived at 150, the card of then
		{199, 199, 150},
		{200, 200, -1}, // the tombstone, counted at 200 after the one at 200
		{350, 350, -1},
		{450, 450, 10},
	} {
		if got := rate(c.arrival, c.et); got != c.want {
			t.Errorf("Rate(%d, %d) = %d, want %d", c.arrival, c.et, got, c.want)
		}
	}
	h.Prune(210)
	if h.Len() != 2 || rate(250, 250) != -1 || rate(450, 450) != 10 {
		t.Fatalf("after Prune(210): %d cards", h.Len())
	}
}

func TestValidateReportsEveryError(t *testing.T) {
	doc := `
plan: free
caps:
  api_calls: {limit: 0}
  tokens: {limit: 10, on_limit: maybe}
  peak: {limit: 5}
  "bad meter": {limit: x}
grants:
  promo: {amount: -1, priority: -2, effective_from: "2026-12-01T00:00:00Z", expires_at: "2026-11-01T00:00:00Z"}
  other: {amount: 5, expires_at: "yesterday"}
overdraft: {policy: deny, limit: 10}
`
	d, err := ParseDocument([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	meters := Meters(func(m string) (string, bool) { return map[string]string{"peak": "MAX"}[m], m == "peak" })
	_, err = d.Record("acme", meters)
	if !errors.Is(err, ErrInvalid) {
		t.Fatalf("Record = %v, want ErrInvalid", err)
	}
	for _, want := range []string{
		"caps.api_calls.limit: must be positive (got 0)",
		`caps.tokens.on_limit: must be reject or allow (got "maybe")`,
		"caps.peak: peak is a MAX meter: caps apply to SUM and COUNT meters only",
		`caps."bad meter".limit: not a 64-bit integer ("x")`,
		"grants.promo.amount: must be positive (got -1)",
		"grants.promo.priority: must not be negative (got -2)",
		"grants.promo.expires_at: must be after effective_from",
		`grants.other.expires_at: not an RFC 3339 time such as 2026-12-01T00:00:00Z ("yesterday")`,
		"overdraft.limit: must be 0 with policy deny (got 10)",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the errors do not say %q:\n%v", want, err)
		}
	}
	if _, err := d.Record("", nil); err == nil || !strings.Contains(err.Error(), "caps.api_calls.limit") {
		t.Fatalf("the default plan: %v", err)
	}
	if _, err := (&Document{Customer: "acme"}).Record("globex", nil); err == nil || !strings.Contains(err.Error(), `customer: "acme", but the record is for "globex"`) {
		t.Fatalf("customer mismatch: %v", err)
	}
	if _, err := ParseDocument([]byte("plan: x\ncap: {}\n")); err == nil || !strings.Contains(err.Error(), `unknown field "cap"`) {
		t.Fatalf("unknown field: %v", err)
	}
}

func TestRatesDocument(t *testing.T) {
	d, err := ParseRatesDocument([]byte(`
versions:
  - effective_from: "2026-12-01T00:00:00Z"
    rates: {api_calls: 1000, tokens: 15/1000, storage: "0.250", bad: "1/0", worse: abc, neg: "-5", "a b": "-1/-2", per_units: "-0.5"}
  - effective_from: "2026-11-01T00:00:00Z"
    rates: {api_calls: 900}
`))
	if err != nil {
		t.Fatal(err)
	}
	// A rate is one value in the document (rates.<meter>): its errors
	// name that, not the record's micro_credits and per_units, which
	// the document does not show.
	_, err = d.Card(nil)
	for _, want := range []string{
		"versions[0].rates.bad: the units it is priced per (after /) must be positive (got 0)",
		"versions[0].rates.neg: the price must not be negative (got -5)",
		`versions[0].rates."a b": the price must not be negative (got -1)`,
		`versions[0].rates."a b": the units it is priced per (after /) must be positive (got -2)`,
		"versions[0].rates.per_units: the price must not be negative (got -5)",
		`versions[0].rates.worse: not a rate such as 1000, 15/1000 or 0.015 micro-credits per unit ("abc")`,
		"versions[1].effective_from: must be after versions[0]'s",
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("the errors do not say %q:\n%v", want, err)
		}
	}
	if err != nil && (strings.Contains(err.Error(), ".micro_credits") || strings.Contains(err.Error(), "per_units: must")) {
		t.Errorf("the errors name a field the document does not show:\n%v", err)
	}
	for in, want := range map[string][2]int64{"1000": {1000, 1}, "15/1000": {15, 1000}, "0.250": {250, 1000},
		"1_000": {1000, 1}, "2.5": {25, 10}, "0": {0, 1}} {
		mc, per, err := ParseRate(in)
		if err != nil || mc != want[0] || per != want[1] {
			t.Errorf("ParseRate(%q) = %d/%d, %v; want %d/%d", in, mc, per, err, want[0], want[1])
		}
	}
	for _, in := range []string{"", "1e3", "x/1", "1/x", "0.1234567890123456789", "99999999999999999999"} {
		if _, _, err := ParseRate(in); err == nil {
			t.Errorf("ParseRate(%q) accepted", in)
		}
	}
}

// TestDocumentRoundTrip: what get prints, set reads back to the same
// record.
// checkRoundTrip: the document of e, encoded by enc as get prints it,
// reads back as e.
func checkRoundTrip(t *testing.T, enc func(any) ([]byte, error), e *schemas.Entitlements, writtenAt int64) {
	t.Helper()
	y, err := enc(DocumentOf(e, writtenAt))
	if err != nil {
		t.Fatal(err)
	}
	d, err := ParseDocument(y)
	if err != nil {
		t.Fatalf("%v\n%s", err, y)
	}
	back, err := d.Record(e.CustomerID, nil)
	if err != nil || !reflect.DeepEqual(back, e) {
		t.Fatalf("round trip:\n%s\n got %+v, %v\nwant %+v", y, back, err, e)
	}
}

func TestDocumentRoundTrip(t *testing.T) {
	e := &schemas.Entitlements{CustomerID: "acme", Plan: "pro", EffectiveFrom: 1796083200000,
		Caps:      []schemas.Cap{{Meter: "api_calls", Limit: 1000, OnLimit: schemas.OnLimitReject}, {Meter: "tokens", Limit: 5, OnLimit: schemas.OnLimitAllow}},
		Grants:    []schemas.Grant{{ID: "a", Amount: 7, Priority: 2, EffectiveFrom: 1796083200000, ExpiresAt: 1798761600000}, {ID: "b", Amount: 1}},
		Overdraft: schemas.Overdraft{Policy: schemas.OverdraftAllow, Limit: 99}}
	checkRoundTrip(t, yaml.Marshal, e, 1796083200123)
	c := &schemas.RateCard{Versions: []schemas.RateVersion{{EffectiveFrom: 1796083200000,
		Rates: []schemas.Rate{{Meter: "a", MicroCredits: 1000, PerUnits: 1}, {Meter: "b", MicroCredits: 15, PerUnits: 1000}}}}}
	y, _ := yaml.Marshal(RatesDocumentOf(c, 0))
	rd, err := ParseRatesDocument(y)
	if err != nil {
		t.Fatal(err)
	}
	if back, err := rd.Card(nil); err != nil || !reflect.DeepEqual(back, c) {
		t.Fatalf("rates round trip:\n%s\n got %+v, %v", y, back, err)
	}
}

func TestParseRecord(t *testing.T) {
	ent := func(customer string) []byte {
		b, _ := schemas.Encode(&schemas.Entitlements{CustomerID: customer, Overdraft: schemas.Overdraft{Policy: schemas.OverdraftAllow}})
		return b
	}
	card, _ := schemas.Encode(&schemas.RateCard{})
	tick, _ := schemas.Encode(&schemas.Tick{InstanceID: "i"})
	bad, _ := schemas.Encode(&schemas.Entitlements{CustomerID: "acme", Caps: []schemas.Cap{{Meter: "m", Limit: -1, OnLimit: schemas.OnLimitReject}},
		Overdraft: schemas.Overdraft{Policy: schemas.OverdraftAllow}})
	for _, c := range []struct {
		key, value []byte
		reason     string // "" accepted
	}{
		{schemas.CustomerKey("acme"), ent("acme"), ""},
		{schemas.CustomerKey("acme"), nil, ""},
		{[]byte(schemas.DefaultPlanKey), ent(""), ""},
		{[]byte(schemas.DefaultPlanKey), nil, ""},
		{[]byte(schemas.RateCardKey), card, ""},
		{[]byte(schemas.TickKey), tick, ""},
		{schemas.CustomerKey("acme"), ent("globex"), schemas.ReasonInvalid},
		{[]byte(schemas.DefaultPlanKey), ent("acme"), schemas.ReasonInvalid},
		{[]byte(schemas.RateCardKey), ent(""), schemas.ReasonInvalid},
		{schemas.CustomerKey("acme"), card, schemas.ReasonInvalid},
		{schemas.CustomerKey("acme"), tick, schemas.ReasonInvalid},
		{[]byte(schemas.TickKey), nil, schemas.ReasonInvalid},
		{[]byte("acme"), ent("acme"), schemas.ReasonInvalid},
		{nil, ent("acme"), schemas.ReasonInvalid},
		{schemas.CustomerKey("acme"), bad, schemas.ReasonInvalid},
		{schemas.CustomerKey("acme"), []byte("{}"), schemas.ReasonUndecodable},
		{schemas.CustomerKey("acme"), append([]byte{0xC3, 0x01, 1, 2, 3, 4, 5, 6, 7, 8}, 0), schemas.ReasonUnknownSchema},
	} {
		_, err := ParseRecord(c.key, c.value, 1)
		got := ""
		if err != nil {
			got = Reason(err)
		}
		if got != c.reason {
			t.Errorf("ParseRecord(%q, %x) = %v (reason %q), want reason %q", c.key, c.value, err, got, c.reason)
		}
		// The detail goes to usage.rejected as it is: the package named
		// once, a kind named in plain words.
		if err != nil && (strings.Count(err.Error(), "entitlements:") > 1 || strings.Contains(err.Error(), "a Aggregate")) {
			t.Errorf("ParseRecord(%q, %x): %q", c.key, c.value, err)
		}
	}
	agg := schemas.MustEncode(&schemas.Aggregate{CustomerID: "acme", Meter: "m", Aggregation: "SUM", Status: schemas.StatusOpen})
	if _, err := ParseRecord(schemas.CustomerKey("acme"), agg, 1); err == nil || strings.Count(err.Error(), "entitlements:") > 1 || !strings.Contains(err.Error(), "Aggregate") || strings.Contains(err.Error(), "a Aggregate") {
		t.Errorf("an Aggregate under a customer's key: %v", err)
	}
}

// TestGrantBalanceOutlivesARemoval: a grant removed from a customer's
// record and offered again keeps what it paid, as long as a version seen
// could still offer it: no credit is paid twice.
func TestGrantBalanceOutlivesARemoval(t *testing.T) {
	const day = 24 * hourMs
	base := int64(1796083200000) // 2026-12-01
	l, err := New(Config{Prefix: []byte("e"), Period: monthBounds})
	if err != nil {
		t.Fatal(err)
	}
	st := newMemStore()
	apply := func(at int64, e *schemas.Entitlements) {
		t.Helper()
		v, _ := schemas.Encode(e)
		rec, err := ParseRecord(schemas.CustomerKey("acme"), v, at)
		if err == nil {
			err = l.Apply(st, rec)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	withGrant := func(exp int64) *schemas.Entitlements {
		return &schemas.Entitlements{CustomerID: "acme", Grants: []schemas.Grant{{ID: "promo", Amount: 1000, ExpiresAt: exp}},
			Overdraft: schemas.Overdraft{Policy: schemas.OverdraftDeny}}
	}
	card, _ := schemas.Encode(&schemas.RateCard{Versions: []schemas.RateVersion{{EffectiveFrom: base, Rates: []schemas.Rate{{Meter: "m", MicroCredits: 1, PerUnits: 1}}}}})
	rec, _ := ParseRecord([]byte(schemas.RateCardKey), card, base)
	_ = l.Apply(st, rec)
	apply(base, withGrant(base+10*day))
	if d, _ := l.Decide(st, "acme", Event{Meter: "m", Aggregation: "SUM", Quantity: 800, EventTime: base + day, Arrival: base + day}); len(d.Draws) != 1 {
		t.Fatalf("first draw: %+v", d)
	}
	apply(base+2*day, withGrant(base+200*day)) // extended
	apply(base+3*day, &schemas.Entitlements{CustomerID: "acme", Overdraft: schemas.Overdraft{Policy: schemas.OverdraftDeny}})
	// Prune long after the first expiry, and after the extending version
	// left the timeline.
	if err := l.PruneCustomer(st, "acme", base+100*day); err != nil {
		t.Fatal(err)
	}
	apply(base+101*day, withGrant(base+200*day)) // offered again
	d, err := l.Decide(st, "acme", Event{Meter: "m", Aggregation: "SUM", Quantity: 500, EventTime: base + 102*day, Arrival: base + 102*day})
	if err != nil || d.Outcome != NoCredit {
		t.Fatalf("500 more from a grant of 1,000 that paid 800: %+v, %v", d, err)
	}
	// Once the partition is read W past its latest expiry (no record can
	// continue it) and no version that may decide an event still to come
	// offers it, the entry goes: state stays bounded.
	apply(base+235*day, &schemas.Entitlements{CustomerID: "acme", Overdraft: schemas.Overdraft{Policy: schemas.OverdraftDeny}})
	if err := l.PruneCustomer(st, "acme", base+300*day); err != nil {
		t.Fatal(err)
	}
	if more, err := l.PrunePeriods(st, base+300*day, 10); more || err != nil {
		t.Fatal(more, err)
	}
	if n := len(st.m); n != 3 { // the rate card, the read-to time, the timeline
		t.Fatalf("state after the grant's window passed: %d keys %q", n, keys(st))
	}
}

func keys(s *memStore) []string {
	var out []string
	for k := range s.m {
		out = append(out, k)
	}
	return out
}

// PassesCap is the cap rule of Decide (and of the ingest's quota gate):
// landing exactly on the limit is within it; a sum past 64 bits is not
// this rule's. Decide refuses a SUM event over_limit exactly when it
// says so (and as invalid when the sum does not fit).
func TestPassesCap(t *testing.T) {
	for _, c := range []struct {
		usage, units, limit int64
		want                bool
	}{
		{0, 10, 10, false}, {1, 10, 10, true}, {10, 0, 10, false}, {11, 0, 10, true},
		{1 << 61, 1 << 61, 1 << 61, true}, {1 << 62, 1 << 62, 0, false}, {math.MaxInt64, 1, 0, false},
	} {
		if got := PassesCap(c.usage, c.units, c.limit); got != c.want {
			t.Errorf("PassesCap(%d, %d, %d) = %v", c.usage, c.units, c.limit, got)
		}
		p := &Plan{Name: "p", Caps: []schemas.Cap{{Meter: "m", Limit: c.limit, OnLimit: schemas.OnLimitReject}}}
		d := Decide(Input{Plan: p, Event: Event{Meter: "m", Aggregation: "SUM", Quantity: c.units}, Usage: c.usage})
		if (d.Outcome == OverLimit) != c.want {
			t.Errorf("Decide(usage %d, units %d, limit %d): %v, PassesCap says %v", c.usage, c.units, c.limit, d.Outcome, c.want)
		}
	}
}

// TestGrantBalanceOutlivesPrunedVersions: what a grant paid is kept as long
// as any version seen could offer the grant, also when the versions that
// offered it longest were pruned before PruneCustomer first looked at the
// customer's draw: a default plan's version (PruneShared prunes those),
// and a version of the customer's own read before the draw that a later
// one replaced. Records are applied and pruned as the aggregator does:
// after each record, PruneCustomer (a customer's) or PruneShared (the
// default plan, the rate card) at the horizon W behind it. A version of the
// customer's pruned before the grant first paid counts too: the expiry it
// gave the grant outlives it. Each time the grant is offered again, within
// the expiry a version seen gave it, after it paid 800 of its 1,000: 500
// more are refused.
func TestGrantBalanceOutlivesPrunedVersions(t *testing.T) {
	const day = 24 * hourMs
	base := int64(1796083200000) // 2026-12-01
	w := DefaultWindow.Milliseconds()
	withGrant := func(customer string, from, exp int64) *schemas.Entitlements {
		e := &schemas.Entitlements{CustomerID: customer, EffectiveFrom: from, Overdraft: schemas.Overdraft{Policy: schemas.OverdraftDeny}}
		if exp != 0 {
			e.Grants = []schemas.Grant{{ID: "welcome", Amount: 1000, ExpiresAt: exp}}
		}
		return e
	}
	card := &schemas.RateCard{Versions: []schemas.RateVersion{{EffectiveFrom: base, Rates: []schemas.Rate{{Meter: "m", MicroCredits: 1, PerUnits: 1}}}}}
	def, acme := []byte(schemas.DefaultPlanKey), schemas.CustomerKey("acme")
	type step struct {
		at  int64
		key []byte
		m   schemas.Message // nil: a tombstone
		// draw: instead of a record, an event of q units arriving at at.
		draw int64
	}
	for _, c := range []struct {
		name  string
		steps []step
	}{
		{"default plan", []step{
			{at: base, key: def, m: withGrant("", 0, base+10*day)},
			{at: base + day, draw: 800},
			{at: base + 2*day, key: def, m: withGrant("", 0, base+200*day)},   // extended
			{at: base + 3*day, key: def, m: withGrant("", 0, 0)},              // dropped
			{at: base + 100*day, key: []byte(schemas.RateCardKey), m: card},   // PruneShared drops the versions
			{at: base + 100*day, key: acme, m: withGrant("acme", 0, 0)},       // PruneCustomer
			{at: base + 101*day, key: acme},                                   // back on the default plan
			{at: base + 101*day, key: def, m: withGrant("", 0, base+200*day)}, // offered again
		}},
		{"own scheduled version", []step{
			{at: base, key: acme, m: withGrant("acme", 0, base+10*day)},
			{at: base + day/2, key: acme, m: withGrant("acme", base+5*day, base+200*day)}, // extended from the 6th
			{at: base + day*3/4, key: acme, m: withGrant("acme", base+6*day, 0)},          // dropped from the 7th
			{at: base + day, draw: 800},                                            // decided by the first version
			{at: base + 110*day, key: acme, m: withGrant("acme", 0, 0)},            // PruneCustomer prunes the first three
			{at: base + 111*day, key: acme, m: withGrant("acme", 0, base+200*day)}, // offered again
		}},
		{"own version pruned before the first draw", []step{
			{at: base, key: acme, m: withGrant("acme", 0, base+200*day)},           // the longest offer
			{at: base + day, key: acme, m: withGrant("acme", 0, base+50*day)},      // shortened
			{at: base + 40*day, key: acme, m: withGrant("acme", 0, base+50*day)},   // PruneCustomer prunes the first two: nothing paid yet
			{at: base + 41*day, draw: 800},                                         // decided by the third
			{at: base + 121*day, key: acme, m: withGrant("acme", 0, 0)},            // PruneCustomer: 50 days + 2W behind
			{at: base + 122*day, key: acme, m: withGrant("acme", 0, base+200*day)}, // offered again, within 200 days + W
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			l, err := New(Config{Prefix: []byte("e"), Period: monthBounds})
			if err != nil {
				t.Fatal(err)
			}
			st := newMemStore()
			apply := func(at int64, key []byte, m schemas.Message) {
				t.Helper()
				var v []byte
				if m != nil {
					if v, err = schemas.Encode(m); err != nil {
						t.Fatal(err)
					}
				}
				rec, err := ParseRecord(key, v, at)
				if err == nil {
					err = l.Apply(st, rec)
				}
				if err == nil && rec.Key.Reserved == "" {
					err = l.PruneCustomer(st, rec.Key.Customer, at-w)
				} else if err == nil {
					err = l.PruneShared(st, at-w)
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			decide := func(at, q int64) Decision {
				t.Helper()
				d, err := l.Decide(st, "acme", Event{Meter: "m", Aggregation: "SUM", Quantity: q, EventTime: at, Arrival: at})
				if err != nil {
					t.Fatal(err)
				}
				return d
			}
			apply(base, []byte(schemas.RateCardKey), card)
			var last int64
			for _, s := range c.steps {
				if s.draw != 0 {
					if d := decide(s.at, s.draw); d.Outcome != Accepted || len(d.Draws) != 1 {
						t.Fatalf("first draw: %+v", d)
					}
					continue
				}
				apply(s.at, s.key, s.m)
				last = s.at
			}
			if d := decide(last+day, 500); d.Outcome != NoCredit {
				t.Fatalf("500 more from a grant of 1,000 that paid 800: %+v", d)
			}
		})
	}
}

// TestRateMatchesSearch: Rate's written-out binary searches find what
// the definition says (the last card read at or before min(arrival,
// event time), its last version in effect at the event time, the meter's
// rate in it), on random histories, including equal times and meters
// absent from a version.
func TestRateMatchesSearch(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	meters := []string{"a", "b", "bb", "c", "d", "e"}
	for range 200 {
		var h RateHistory
		type card struct {
			written  int64
			versions []schemas.RateVersion
		}
		var cards []card
		written := int64(0)
		for range 1 + rng.IntN(5) {
			written += int64(rng.IntN(3)) * 10
			if rng.IntN(6) == 0 {
				if err := h.Set(written, nil); err != nil {
					t.Fatal(err)
				}
				cards = append(cards, card{written: written})
				continue
			}
			c := &schemas.RateCard{}
			from := int64(rng.IntN(3)) * 10
			for range 1 + rng.IntN(4) {
				v := schemas.RateVersion{EffectiveFrom: from}
				for _, m := range meters {
					if rng.IntN(2) == 0 {
						v.Rates = append(v.Rates, schemas.Rate{Meter: m, MicroCredits: 1 + rng.Int64N(100), PerUnits: 1})
					}
				}
				if len(v.Rates) == 0 {
					v.Rates = append(v.Rates, schemas.Rate{Meter: "a", MicroCredits: 1, PerUnits: 1})
				}
				c.Versions = append(c.Versions, v)
				from += 1 + int64(rng.IntN(3))*10
			}
			if err := h.Set(written, c); err != nil {
				t.Fatal(err)
			}
			cards = append(cards, card{written, h.cards[len(h.cards)-1].versions})
		}
		for range 100 {
			arrival, et, m := int64(rng.IntN(80))-5, int64(rng.IntN(80))-5, meters[rng.IntN(len(meters))]
			var want schemas.Rate
			wantOK := false
			for _, c := range cards {
				if c.written > min(arrival, et) {
					break
				}
				want, wantOK = schemas.Rate{}, false
				for _, v := range c.versions {
					if v.EffectiveFrom > et {
						break
					}
					want, wantOK = schemas.Rate{}, false
					for _, r := range v.Rates {
						if r.Meter == m {
							want, wantOK = r, true
						}
					}
				}
			}
			if got, ok := h.Rate(arrival, et, m); ok != wantOK || !reflect.DeepEqual(got, want) {
				t.Fatalf("Rate(%d, %d, %q) = %+v %v, want %+v %v; cards %+v", arrival, et, m, got, ok, want, wantOK, cards)
			}
		}
	}
}
