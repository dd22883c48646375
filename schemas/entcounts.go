package schemas

import (
	"errors"
	"fmt"
	"strings"
	"unsafe"
)

// EntitlementsCounts reads b, a message of the current Entitlements schema,
// for its customer_id and how many caps and grants it holds, without
// decoding it: it allocates nothing but the customer_id. ok is true only
// for bytes Decode decodes, giving the same customer_id and as many caps
// and grants; it is false for anything else (another kind or schema
// version, bytes that do not decode: Decode says why). Its reading rules
// are fast.go's, which are hamba's, and so is its one difference: block
// counts that overflow are not ok, where hamba may take them.
//
// A record written straight to the topic may hold 65,536 caps and as many
// grants in 530 KB, which Decode allocates about 30 MB for: a reader that
// refuses more than a bound can refuse it by these counts first.
func EntitlementsCounts(b []byte) (customerID string, caps, grants int64, ok bool) {
	customerID, caps, grants, err := entitlementsCounts(b)
	if err != nil {
		return "", 0, 0, false
	}
	return strings.Clone(customerID), caps, grants, true
}

// errNotEntitlements: the bytes are not a message of the current
// Entitlements schema.
var errNotEntitlements = errors.New("schemas: not a message of the current Entitlements schema")

// entitlementsCounts is EntitlementsCounts, with the reason it is not ok:
// errNotEntitlements, or why the body would not decode (wrapping
// errCountOverflow where hamba, unlike fast.go, takes the body). The
// customer_id is a substring of b.
func entitlementsCounts(b []byte) (customerID string, caps, grants int64, err error) {
	r, err := load()
	if err != nil {
		return "", 0, 0, err
	}
	if len(b) <= headerSize || string(b[:headerSize]) != string(r.headers[KindEntitlements][:]) {
		return "", 0, 0, errNotEntitlements
	}
	body := b[headerSize:]
	// The body is only read, and nothing read from it is kept but a copy
	// of the customer_id: no copy of it is made.
	d := bodyDecoder{s: unsafe.String(unsafe.SliceData(body), len(body))}
	customerID = d.str("customer_id")
	d.str("plan")
	d.long("effective_from")
	d.bool("unmetered")
	caps = d.skipArray("caps", func() {
		d.str("caps.meter")
		d.long("caps.limit")
		d.enum("caps.on_limit", 2)
	})
	grants = d.skipArray("grants", func() {
		d.str("grants.id")
		d.long("grants.amount")
		d.int("grants.priority")
		d.long("grants.effective_from")
		d.long("grants.expires_at")
	})
	d.enum("overdraft.policy", 2)
	d.long("overdraft.limit")
	return customerID, caps, grants, d.err(KindEntitlements)
}

// bool reads a boolean: a byte 0 or 1, as hamba requires.
func (d *bodyDecoder) bool(field string) {
	switch {
	case d.failed:
	case d.i >= len(d.s):
		d.fail(field, "truncated bool")
	case d.s[d.i] > 1:
		d.fail(field, "bad bool")
	default:
		d.i++
	}
}

// enum reads the index of one of n symbols.
func (d *bodyDecoder) enum(field string, n int32) {
	if v := d.int(field); !d.failed && (v < 0 || v >= n) {
		d.fail(field, fmt.Sprintf("enum index %d out of range", v))
	}
}

// skipArray reads an array in Avro block encoding (blockCount), item
// reading each item, and returns how many it holds.
func (d *bodyDecoder) skipArray(field string, item func()) int64 {
	total := int64(0)
	for {
		c := d.blockCount(field, total)
		if c == 0 {
			return total
		}
		total += c
		for ; c > 0 && !d.failed; c-- {
			item()
		}
	}
}
