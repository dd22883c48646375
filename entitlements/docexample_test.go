package entitlements

import (
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/meterline/meterline/schemas"
)

// docFiles returns the YAML files that the worked example of
// docs/entitlements.md writes with `cat > NAME <<'YAML'`, by name.
func docFiles(t *testing.T) map[string][]byte {
	t.Helper()
	b, err := os.ReadFile("../docs/entitlements.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	i := strings.Index(doc, "\n## A worked example\n")
	if i < 0 {
		t.Fatal(`docs/entitlements.md has no section "A worked example"`)
	}
	doc = doc[i:]
	if j := strings.Index(doc[1:], "\n## "); j >= 0 {
		doc = doc[:j+1]
	}
	out := map[string][]byte{}
	re := regexp.MustCompile(`(?s)cat > (\S+) <<'YAML'\n(.*?)\nYAML\n`)
	for _, m := range re.FindAllStringSubmatch(doc, -1) {
		out[m[1]] = []byte(m[2] + "\n")
	}
	for _, f := range []string{"default.yaml", "rates.yaml", "acme.yaml", "globex.yaml"} {
		if out[f] == nil {
			t.Fatalf("the worked example of docs/entitlements.md writes no %s", f)
		}
	}
	return out
}

// TestWorkedExampleDecides runs the worked example of docs/entitlements.md
// through the Ledger, as an aggregator with --entitlements would read it,
// and checks what its text says of it: the default plan is "a free tier
// of 1,000 API calls a month", so a customer without a record of its own
// gets 1,000 API calls in a month and the 1,001st is over_limit, and "no
// credit beyond it": its tokens, priced by the rate card, are no_credit; acme,
// on a prepaid plan, pays from its grants by priority (prepaid-2026
// before welcome); globex's record, scheduled for 2030, does not apply
// yet; and once acme's record is deleted, the default plan applies to it,
// its cap counting what acme used in the month.
func TestWorkedExampleDecides(t *testing.T) {
	files := docFiles(t)
	l, err := New(Config{Prefix: []byte{'e'}, Period: monthBounds})
	if err != nil {
		t.Fatal(err)
	}
	st := newMemStore()
	written := mustTime(t, "2026-12-01T10:00:00Z")
	apply := func(key []byte, m schemas.Message) {
		t.Helper()
		var v []byte
		if m != nil {
			if v, err = schemas.Encode(m); err != nil {
				t.Fatal(err)
			}
		}
		rec, err := ParseRecord(key, v, written)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Apply(st, rec); err != nil {
			t.Fatal(err)
		}
		written++
	}
	record := func(name string) *schemas.Entitlements {
		t.Helper()
		d, err := ParseDocument(files[name])
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		e, err := d.Record(d.Customer, nil)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		return e
	}
	apply([]byte(schemas.DefaultPlanKey), record("default.yaml"))
	rd, err := ParseRatesDocument(files["rates.yaml"])
	if err != nil {
		t.Fatal(err)
	}
	card, err := rd.Card(nil)
	if err != nil {
		t.Fatal(err)
	}
	apply([]byte(schemas.RateCardKey), card)
	for _, f := range []string{"acme.yaml", "globex.yaml"} {
		e := record(f)
		apply(schemas.CustomerKey(e.CustomerID), e)
	}

	at := mustTime(t, "2026-12-02T00:00:00Z")
	decide := func(customer, meter string, qty int64) Decision {
		t.Helper()
		at += 1000
		ev := Event{Meter: meter, Aggregation: "SUM", Quantity: qty, EventTime: at, Arrival: at}
		d, err := l.Decide(st, customer, ev)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	// The free tier: 1,000 API calls of a customer without a record.
	outcomes := map[string]int{}
	for range 1001 {
		d := decide("initech", "api_calls", 1)
		outcomes[d.Outcome.String()]++
		if d.Plan == nil || d.Plan.Name != "free" {
			t.Fatalf("initech decided by plan %v, want the default plan free", d.Plan)
		}
	}
	if want := map[string]int{"accepted": 1000, "over_limit": 1}; fmt.Sprint(outcomes) != fmt.Sprint(want) {
		t.Errorf(`the default plan, "a free tier of 1,000 API calls a month": 1,001 API calls of a customer without a record decided %v, want %v`, outcomes, want)
	}
	// No credit beyond it: a priced meter of the free tier is refused.
	if d := decide("initech", "tokens", 1000); d.Outcome != NoCredit {
		t.Errorf("initech's tokens on the free tier: %v (%s), want no_credit", d.Outcome, d.Detail)
	}
	// globex's record takes effect in 2030: until then, the free tier.
	if d := decide("globex", "api_calls", 1); d.Outcome != Accepted || d.Plan == nil || d.Plan.Name != "free" {
		t.Errorf("globex in 2026: %v by plan %v, want accepted by the default plan free (its own record is scheduled for 2030)", d.Outcome, d.Plan)
	}
	// acme's credits: every priced meter's cost comes from prepaid-2026
	// (priority 0) before welcome (priority 1).
	for _, m := range []string{"api_calls", "tokens"} {
		d := decide("acme", m, 1000)
		if d.Outcome != Accepted || d.Plan == nil || d.Plan.Name != "pro" {
			t.Fatalf("acme's %s: %v by plan %v, want accepted by pro", m, d.Outcome, d.Plan)
		}
		for _, dr := range d.Draws {
			if dr.Grant != "prepaid-2026" {
				t.Errorf("acme's %s drew %d from %s, want prepaid-2026 first", m, dr.Amount, dr.Grant)
			}
		}
	}
	// `meterline entitlements delete acme`: from then on, the default
	// plan, whose cap counts the 1,000 API calls acme used in the month.
	apply(schemas.CustomerKey("acme"), nil)
	at = max(at, written)
	if d := decide("acme", "api_calls", 1); d.Outcome != OverLimit || d.Plan == nil || d.Plan.Name != "free" {
		t.Errorf("acme after its delete: %v by plan %v (%s), want over_limit by the default plan free (1,000 used of its cap 1,000)", d.Outcome, d.Plan, d.Detail)
	}
}

// TestNoPlanOverdraws: a customer with no record, and no default plan, is
// never capped or refused (docs/entitlements.md, "Plans and caps"), but
// an event of a priced meter still costs its price, overdrawn without
// limit, and the customer's balance says so.
func TestNoPlanOverdraws(t *testing.T) {
	l, err := New(Config{Prefix: []byte{'e'}, Period: monthBounds})
	if err != nil {
		t.Fatal(err)
	}
	st := newMemStore()
	written := mustTime(t, "2026-12-01T00:00:00Z")
	card, err := schemas.Encode(&schemas.RateCard{Versions: []schemas.RateVersion{{Rates: []schemas.Rate{{Meter: "api_calls", MicroCredits: 1000, PerUnits: 1}}}}})
	if err != nil {
		t.Fatal(err)
	}
	rec, err := ParseRecord([]byte(schemas.RateCardKey), card, written)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Apply(st, rec); err != nil {
		t.Fatal(err)
	}
	at := written + 1000
	for i := range 3 {
		d, err := l.Decide(st, "acme", Event{Meter: "api_calls", Aggregation: "SUM", Quantity: 1_000_000, EventTime: at + int64(i), Arrival: at + int64(i)})
		if err != nil {
			t.Fatal(err)
		}
		if d.Outcome != Accepted || d.Plan != nil || d.Cost != 1_000_000_000 || d.Overdraft != d.Cost {
			t.Fatalf("event %d without a plan: %v, plan %v, cost %d, overdrawn %d; want accepted without a plan, its cost 1000000000 overdrawn", i, d.Outcome, d.Plan, d.Cost, d.Overdraft)
		}
	}
	b, err := l.Balance(st, "acme", at+10, 1)
	if err != nil {
		t.Fatal(err)
	}
	if b.Overdrawn != 3_000_000_000 || b.OverdraftPolicy != schemas.OverdraftAllow || b.OverdraftLimit != 0 {
		t.Errorf("balance without a plan: overdrawn %d (%s, limit %d), want 3000000000 (ALLOW, no limit)", b.Overdrawn, b.OverdraftPolicy, b.OverdraftLimit)
	}
}
