package entitlements

import (
	"errors"
	"runtime"
	"strings"
	"testing"

	"github.com/meterline/meterline/schemas"
)

// TestParseRecordRefusesCountsBeforeDecoding: a record written straight
// to the topic with 65,536 caps and as many grants (about 530 KB, no
// larger than the largest valid record) cost about 30 MB to decode, to be
// refused for its counts. It is refused by them before it is decoded,
// with what ParseRecord says of it decoded (ErrWrongKind under a key that
// does not take it, else invalid naming the counts), allocating a small
// share of its size; a record within the bounds is decoded as before.
func TestParseRecordRefusesCountsBeforeDecoding(t *testing.T) {
	huge := func(customer string) []byte {
		e := &schemas.Entitlements{CustomerID: customer, Overdraft: schemas.Overdraft{Policy: schemas.OverdraftAllow}}
		for range 1 << 16 {
			e.Caps = append(e.Caps, schemas.Cap{OnLimit: schemas.OnLimitReject})
			e.Grants = append(e.Grants, schemas.Grant{})
		}
		return schemas.MustEncode(e)
	}
	past := bigPlan("past")
	past.Caps = append(past.Caps, schemas.Cap{Meter: "zz", Limit: 1, OnLimit: schemas.OnLimitReject})
	for _, c := range []struct {
		name  string
		key   []byte
		value []byte
		kind  error
		says  string
	}{
		{"customer", schemas.CustomerKey("acme"), huge("acme"), ErrInvalid, "65536 caps, more than 256"},
		{"customer's grants", schemas.CustomerKey("acme"), huge("acme"), ErrInvalid, "65536 grants, more than 256"},
		{"default plan", []byte(schemas.DefaultPlanKey), huge(""), ErrInvalid, "65536 caps, more than 256"},
		{"another customer's key", schemas.CustomerKey("globex"), huge("acme"), ErrWrongKind, `customer_id "acme" under the key of "globex"`},
		{"default plan naming a customer", []byte(schemas.DefaultPlanKey), huge("acme"), ErrWrongKind, `the default plan names customer "acme"`},
		{"rate card key", []byte(schemas.RateCardKey), huge(""), ErrWrongKind, "Entitlements under"},
		{"one cap past the bound", schemas.CustomerKey("acme"), schemas.MustEncode(past), ErrInvalid, "257 caps, more than 256"},
	} {
		var m0, m1 runtime.MemStats
		runtime.ReadMemStats(&m0)
		_, err := ParseRecord(c.key, c.value, 1)
		runtime.ReadMemStats(&m1)
		if !errors.Is(err, c.kind) || err == nil || !strings.Contains(err.Error(), c.says) || Reason(err) != schemas.ReasonInvalid {
			t.Errorf("%s: %v, want %v saying %q", c.name, err, c.kind, c.says)
		}
		if n := m1.TotalAlloc - m0.TotalAlloc; n > uint64(len(c.value))/4 {
			t.Errorf("%s: %d bytes allocated to refuse a record of %d", c.name, n, len(c.value))
		}
	}
	if _, err := ParseRecord(schemas.CustomerKey("acme"), schemas.MustEncode(bigPlan("max")), 1); err != nil {
		t.Errorf("a record of %d caps and %d grants: %v", MaxCaps, MaxGrants, err)
	}
}
