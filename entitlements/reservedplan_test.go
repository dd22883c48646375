package entitlements

import (
	"strings"
	"testing"

	"github.com/meterline/meterline/schemas"
)

// TestReservedPlanNamesRefused: a document whose plan is a value the
// aggregator's metrics give the plan label for no plan of its own (none,
// unnamed, other) is refused by Record, for a customer and for the
// default plan, naming the reserved words: counted under that label, it
// could not be told from no plan, a plan without a name or the plans
// past the first 64. A name that differs (another case, a longer word)
// is taken. A record with such a plan written straight to the topic is
// still taken by the aggregator (ParseRecord): refusing it would change
// what records already in effect decide.
func TestReservedPlanNamesRefused(t *testing.T) {
	for _, name := range []string{"none", "unnamed", "other"} {
		for _, customer := range []string{"acme", ""} {
			d, err := ParseDocument([]byte("plan: " + name + "\n"))
			if err != nil {
				t.Fatal(err)
			}
			_, err = d.Record(customer, nil)
			if err == nil || !strings.Contains(err.Error(), "plan: ") || !strings.Contains(err.Error(), "none, unnamed and other") {
				t.Errorf("plan %q, customer %q: %v; want it refused naming none, unnamed and other", name, customer, err)
			}
		}
		e := &schemas.Entitlements{CustomerID: "acme", Plan: name, Caps: []schemas.Cap{}, Grants: []schemas.Grant{},
			Overdraft: schemas.Overdraft{Policy: schemas.OverdraftAllow}}
		v, err := schemas.Encode(e)
		if err != nil {
			t.Fatal(err)
		}
		r, err := ParseRecord(schemas.CustomerKey("acme"), v, 1)
		if err != nil {
			t.Fatalf("ParseRecord of plan %q: %v", name, err)
		}
		if r.Plan == nil || r.Plan.Name != name {
			t.Errorf("ParseRecord of plan %q: %+v", name, r.Plan)
		}
	}
	for _, name := range []string{"None", "OTHER", "nones", "other-plan", "free"} {
		d, err := ParseDocument([]byte("plan: " + name + "\n"))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := d.Record("acme", nil); err != nil {
			t.Errorf("plan %q: %v", name, err)
		}
	}
}
