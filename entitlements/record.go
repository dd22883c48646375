package entitlements

import (
	"errors"
	"fmt"

	"github.com/meterline/meterline/schemas"
)

// Record is one record of usage.entitlements, parsed and validated.
type Record struct {
	Key schemas.EntitlementsKey
	// Written is the record's broker timestamp, epoch ms.
	Written int64
	// Tombstone: a null value. Under a customer key the customer's record
	// is deleted (the default plan applies again); under DefaultPlanKey
	// there is no default plan; under RateCardKey no rate card, from
	// Written on.
	Tombstone bool
	// Entitlements is the record of a customer or of the default plan
	// (nil for a tombstone); Plan is its validated plan.
	Entitlements *schemas.Entitlements
	Plan         *Plan
	// RateCard is the rate card (nil for a tombstone).
	RateCard *schemas.RateCard
}

// IsTick reports whether the record is a tick (nothing to apply; its
// broker time says how far the partition has been read).
func (r *Record) IsTick() bool { return r.Key.Reserved == schemas.TickKey }

// ErrWrongKind is returned (wrapped, with ErrInvalid) when a value's kind
// does not belong under its key: an Entitlements record under RateCardKey,
// a RateCard under a customer key, a customer record whose customer_id is
// not its key's, a default plan that names a customer.
var ErrWrongKind = fmt.Errorf("%w: value does not belong under its key", ErrInvalid)

// ParseRecord parses and validates a record of usage.entitlements, which
// any client with write access may have produced. An error wraps
// schemas.ErrBadKey (a key that is neither a customer nor a reserved
// key), schemas.ErrUndecodable or schemas.ErrUnknownSchema (the value),
// or ErrInvalid (FieldErrors, ErrWrongKind): the stage rejects the record
// with the matching reason and keeps what was in effect.
func ParseRecord(key, value []byte, written int64) (*Record, error) {
	k, err := schemas.ParseEntitlementsKey(key)
	if err != nil {
		return nil, fmt.Errorf("entitlements: key: %w", err)
	}
	r := &Record{Key: k, Written: written, Tombstone: value == nil}
	if value == nil {
		if k.Reserved == schemas.TickKey {
			return nil, fmt.Errorf("entitlements: %w: a tick with a null value", ErrWrongKind)
		}
		if k.Reserved == "" {
			// A delete of a customer no record can name (Validate):
			// applied, it would keep state for its key and delete nothing.
			var f fieldErrs
			f.checkName("customer", k.Customer)
			if err := f.err(); err != nil {
				return nil, fmt.Errorf("entitlements: a delete under the key of a customer_id no record can have: %w", err)
			}
		}
		return r, nil
	}
	if err := refuseCounts(k, key, value); err != nil {
		return nil, err
	}
	if err := refuseRateCounts(k, key, value); err != nil {
		return nil, err
	}
	m, err := schemas.Decode(value)
	if err != nil {
		return nil, fmt.Errorf("entitlements: value: %w", err)
	}
	switch v := m.(type) {
	case *schemas.Tick:
		if k.Reserved != schemas.TickKey {
			return nil, fmt.Errorf("entitlements: %w: a Tick under %q", ErrWrongKind, key)
		}
		return r, nil
	case *schemas.RateCard:
		if k.Reserved != schemas.RateCardKey {
			return nil, fmt.Errorf("entitlements: %w: a RateCard under %q", ErrWrongKind, key)
		}
		if err := ValidateRateCard(v, nil); err != nil {
			return nil, fmt.Errorf("entitlements: rate card: %w", err)
		}
		r.RateCard = v
		return r, nil
	case *schemas.Entitlements:
		switch {
		case k.Reserved == schemas.DefaultPlanKey && v.CustomerID != "":
			return nil, fmt.Errorf("entitlements: %w: the default plan names customer %q", ErrWrongKind, v.CustomerID)
		case k.Reserved != "" && k.Reserved != schemas.DefaultPlanKey:
			return nil, fmt.Errorf("entitlements: %w: Entitlements under %q", ErrWrongKind, key)
		case k.Reserved == "" && v.CustomerID != k.Customer:
			return nil, fmt.Errorf("entitlements: %w: customer_id %q under the key of %q", ErrWrongKind, v.CustomerID, k.Customer)
		}
		p, err := NewPlan(v)
		if err != nil {
			return nil, fmt.Errorf("entitlements: %s: %w", describeKey(k), err)
		}
		r.Entitlements, r.Plan = v, p
		return r, nil
	}
	return nil, fmt.Errorf("entitlements: %w: a record of kind %s", ErrWrongKind, m.Kind())
}

// refuseCounts refuses an Entitlements record of more than MaxCaps caps
// or MaxGrants grants before it is decoded (schemas.EntitlementsCounts):
// one written straight to the topic may hold 65,536 of each in 530 KB,
// which decoding allocates about 30 MB for, to refuse it. The error is
// the one ParseRecord gives once the record is decoded, but that Validate
// names the record's other problems too: ErrWrongKind for a key that does
// not take the record, else ErrInvalid naming the counts past the bounds.
// A record within the bounds, or whose counts cannot be read so, is left
// to Decode.
func refuseCounts(k schemas.EntitlementsKey, key, value []byte) error {
	customer, caps, grants, ok := schemas.EntitlementsCounts(value)
	if !ok || caps <= MaxCaps && grants <= MaxGrants {
		return nil
	}
	switch {
	case k.Reserved == schemas.DefaultPlanKey && customer != "":
		return fmt.Errorf("entitlements: %w: the default plan names customer %q", ErrWrongKind, customer)
	case k.Reserved != "" && k.Reserved != schemas.DefaultPlanKey:
		return fmt.Errorf("entitlements: %w: Entitlements under %q", ErrWrongKind, key)
	case k.Reserved == "" && customer != k.Customer:
		return fmt.Errorf("entitlements: %w: customer_id %q under the key of %q", ErrWrongKind, customer, k.Customer)
	}
	var f fieldErrs
	if caps > MaxCaps {
		f.must("caps", "%d caps, more than %d", caps, MaxCaps)
	}
	if grants > MaxGrants {
		f.must("grants", "%d grants, more than %d", grants, MaxGrants)
	}
	return fmt.Errorf("entitlements: %s: %w", describeKey(k), f.err())
}

// refuseRateCounts refuses a RateCard record of more than MaxRateVersions
// versions or MaxRates rates before it is decoded
// (schemas.RateCardCounts), as refuseCounts does an Entitlements record:
// one written straight to the topic may hold 330,000 rates in 1 MB,
// which decoding allocates about 10 MB for, to refuse it. The error is
// the one ParseRecord gives once the record is decoded: ErrWrongKind
// under a key that does not take a rate card, else ErrInvalid naming the
// counts past the bounds, as ValidateRateCard does. A card within the
// bounds, or whose counts cannot be read so, is left to Decode.
func refuseRateCounts(k schemas.EntitlementsKey, key, value []byte) error {
	versions, rates, ok := schemas.RateCardCounts(value)
	if !ok || versions <= MaxRateVersions && rates <= MaxRates {
		return nil
	}
	if k.Reserved != schemas.RateCardKey {
		return fmt.Errorf("entitlements: %w: a RateCard under %q", ErrWrongKind, key)
	}
	var f fieldErrs
	if versions > MaxRateVersions {
		f.must("versions", "%d versions, more than %d", versions, MaxRateVersions)
	}
	if rates > MaxRates {
		f.must("versions", "%d rates in all, more than %d", rates, MaxRates)
	}
	return fmt.Errorf("entitlements: rate card: %w", f.err())
}

func describeKey(k schemas.EntitlementsKey) string {
	if k.Reserved != "" {
		return k.Reserved
	}
	return "customer " + k.Customer
}

// Reason returns the rejection reason code of docs/design.md, Bad input,
// for an error of ParseRecord: undecodable, unknown_schema or invalid.
func Reason(err error) string {
	switch {
	case errors.Is(err, schemas.ErrUnknownSchema):
		return schemas.ReasonUnknownSchema
	case errors.Is(err, schemas.ErrUndecodable):
		return schemas.ReasonUndecodable
	}
	return schemas.ReasonInvalid
}
