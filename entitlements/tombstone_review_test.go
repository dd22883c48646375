package entitlements

import (
	"errors"
	"strings"
	"testing"

	"github.com/meterline/meterline/schemas"
)

// TestDeleteUnderInvalidCustomerRefused: a delete (null value) under the
// key of a customer_id that no record can have (a control or
// bidirectional character, invalid UTF-8, longer than an identity field)
// is refused invalid, as a record of that customer is: applied, it kept
// state for the key (its origin, up to the key's size) for as long as the
// state lives, and deleted nothing.
func TestDeleteUnderInvalidCustomerRefused(t *testing.T) {
	for _, c := range []string{"ac\x1bme", "a\u202eb", "\xff", strings.Repeat("x", MaxNameBytes+1), "a\u200bb"} {
		r, err := ParseRecord(schemas.CustomerKey(c), nil, 1)
		if !errors.Is(err, ErrInvalid) || schemas.ReasonInvalid != Reason(err) {
			t.Errorf("a delete under the key of %.40q: %+v, %v; want it refused invalid", c, r, err)
		}
	}
	if r, err := ParseRecord(schemas.CustomerKey("acme"), nil, 1); err != nil || !r.Tombstone || r.Key.Customer != "acme" {
		t.Errorf("a delete of acme: %+v, %v", r, err)
	}
}
