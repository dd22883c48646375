package entitlements

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/meterline/meterline/schemas"
)

// grantsPlan is a record of customer (or the default plan, "") offering
// MaxGrants grants of MaxNameBytes-byte ids that start with prefix and
// never expire, scheduled for effective_from.
func grantsPlan(customer, prefix string, effectiveFrom int64) *schemas.Entitlements {
	e := &schemas.Entitlements{CustomerID: customer, Plan: "p", EffectiveFrom: effectiveFrom,
		Overdraft: schemas.Overdraft{Policy: schemas.OverdraftAllow}}
	for i := range MaxGrants {
		id := fmt.Sprintf("%s-%04d-", prefix, i)
		e.Grants = append(e.Grants, schemas.Grant{ID: id + strings.Repeat("g", MaxNameBytes-len(id)), Amount: 1})
	}
	return e
}

// TestGrantStateBoundedInBytes: a customer's grant generations are kept in
// its account, one state value written whole to the changelog, and the
// default plan's in one value too. A producer rewriting a scheduled record
// (effective_from far ahead: each replaces the last, so the versions stay
// two) with fresh grant ids that never expire added a generation per
// grant each time, kept for good: a few records made the value larger
// than the broker takes, and every transaction of the partition failed.
// A record whose grants would take the generations kept alive past
// MaxVersionBytes is refused (ErrTooManyVersions); what was in effect stays.
func TestGrantStateBoundedInBytes(t *testing.T) {
	for _, customer := range []string{"acme", ""} {
		l, err := New(Config{Prefix: []byte("e"), Period: monthBounds, Window: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		st := newMemStore()
		at := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC).UnixMilli()
		key, stateKey := schemas.CustomerKey(customer), l.customerKey(subAccount, customer)
		if customer == "" {
			key, stateKey = []byte(schemas.DefaultPlanKey), l.keyDefaultGrants
		}
		refused := 0
		for i := range 8 {
			at += 1000
			v, err := schemas.Encode(grantsPlan(customer, fmt.Sprint(i), math.MaxInt64/2))
			if err != nil {
				t.Fatal(err)
			}
			rec, err := ParseRecord(key, v, at)
			if err != nil {
				t.Fatal(err)
			}
			switch err := l.Apply(st, rec); {
			case errors.Is(err, ErrTooManyGrants) && errors.Is(err, ErrInvalid):
				refused++
			case err != nil:
				t.Fatal(err)
			case refused > 0:
				t.Fatalf("%q: record %d applied after one was refused", customer, i)
			}
		}
		if refused == 8 {
			t.Errorf("%q: the first record of 256 grants refused", customer)
		}
		if refused == 0 {
			t.Errorf("%q: 8 records of 256 fresh grants each, none refused", customer)
		}
		if v, _, _ := st.Get(stateKey); len(v) > MaxGrantBytes {
			t.Errorf("%q: the grant state is %d bytes, more than %d", customer, len(v), MaxGrantBytes)
		}
	}
}
