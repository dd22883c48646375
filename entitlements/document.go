package entitlements

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"math"
	"math/big"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/meterline/meterline/internal/clip"
	"github.com/meterline/meterline/schemas"
)

// The operator's form of the records: YAML (or JSON) documents that
// `meterline entitlements` reads and prints. A document printed by `get`
// is accepted by `set` unchanged. Amounts are micro-credits; times are RFC
// 3339 (UTC, millisecond precision); names of caps, grants and rates are
// map keys, so field paths in errors read like the document:
// "caps.api_calls.limit: must be positive (got 0)".

// Document is an Entitlements record: a customer's, or the default plan
// (Customer empty).
type Document struct {
	Customer string `json:"customer,omitempty"`
	// Version: the version (RecordVersion) of the customer's record that the
	// document was read from, printed by get; set writes the document
	// only while that record is still the customer's latest. Empty: set
	// writes unconditionally. Checked by Record; the default plan has
	// none.
	Version string `json:"version,omitempty"`
	Plan    string `json:"plan,omitempty"`
	// EffectiveFrom: from when (arrival time) the record applies; empty:
	// from when it is written. An earlier time is raised to that.
	EffectiveFrom string `json:"effective_from,omitempty"`
	// AppliesFrom: from when (arrival time) the record applies, as the
	// aggregator takes it: effective_from, or the record's broker time
	// when that is later (docs/entitlements.md, The ordering rule: broker
	// time). Printed by get; ignored by set.
	AppliesFrom string              `json:"applies_from,omitempty"`
	Unmetered   bool                `json:"unmetered,omitempty"`
	Caps        map[string]CapDoc   `json:"caps,omitempty"`
	Grants      map[string]GrantDoc `json:"grants,omitempty"`
	Overdraft   *OverdraftDoc       `json:"overdraft,omitempty"`
	WrittenAt   string              `json:"written_at,omitempty"` // printed by get; ignored by set
}

// CapDoc is a cap: limit per billing period; on_limit reject (default) or
// allow.
type CapDoc struct {
	Limit   Int    `json:"limit"`
	OnLimit string `json:"on_limit,omitempty"`
}

// GrantDoc is a credit grant: amount in micro-credits; priority (lower is
// drawn first, default 0); the event-time window [effective_from,
// expires_at), each end optional.
type GrantDoc struct {
	Amount        Int    `json:"amount"`
	Priority      Int    `json:"priority,omitzero"`
	EffectiveFrom string `json:"effective_from,omitempty"`
	ExpiresAt     string `json:"expires_at,omitempty"`
}

// OverdraftDoc is the overdraft policy: allow (default; limit in
// micro-credits per period, absent: none; 0 is refused) or deny.
type OverdraftDoc struct {
	Policy string `json:"policy"`
	Limit  Int    `json:"limit,omitzero"`
}

// Int is an integer field of a document. It takes a JSON number or a
// string of digits; anything else is remembered and reported, with its
// field path, among every other problem of the document (a plain int64
// would stop decoding at the first one).
type Int struct {
	V   int64
	bad string // the raw text, when it was not an integer
	// given: the document wrote the field (0 may mean something else
	// than absent: overdraft.limit).
	given bool
}

// UnmarshalJSON implements json.Unmarshaler; it never fails.
func (n *Int) UnmarshalJSON(b []byte) error {
	s := string(bytes.TrimSpace(b))
	if u, err := strconv.Unquote(s); err == nil {
		s = u
	}
	s = strings.ReplaceAll(s, "_", "")
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		// An integer written as a decimal or with an exponent (5e6,
		// 1000000.0), read exactly: never through a float, which
		// would round one past 2^53 to another.
		r, ok := exactInt(s)
		if !ok {
			*n = Int{bad: clip.To(string(b), clip.Echo), given: true}
			return nil
		}
		v = r
	}
	*n = Int{V: v, given: true}
	return nil
}

// maxNumberText bounds the text of a number read exactly: an int64 has 19
// digits.
const maxNumberText = 64

// maxExponent bounds the exponent of a number read exactly: past it, a
// number of maxNumberText bytes is 0 or no 64-bit integer.
const maxExponent = 2 * maxNumberText

// exactInt reads an integer written as a decimal number of at most
// maxNumberText bytes, exactly; ok is false for anything else and for one
// that does not fit 64 bits.
func exactInt(s string) (v int64, ok bool) {
	if len(s) > maxNumberText || !decimalText(s) {
		return 0, false
	}
	if mant, exp, ok := strings.Cut(strings.ToLower(s), "e"); ok {
		// An exponent past ±maxExponent, which math/big would raise 10
		// to (1e999999 took 36 ms and megabytes), writes 0 or a number
		// that is no 64-bit integer: the mantissa, of at most
		// maxNumberText digits, is 0 or at least 10^-maxNumberText and
		// below 10^maxNumberText.
		if e, err := strconv.Atoi(strings.TrimLeft(exp, "+")); err != nil || e > maxExponent || e < -maxExponent {
			return 0, strings.Trim(mant, "+-0.") == ""
		}
	}
	r, ok := new(big.Rat).SetString(s)
	if !ok || !r.IsInt() || !r.Num().IsInt64() {
		return 0, false
	}
	return r.Num().Int64(), true
}

// decimalText reports whether s is a decimal number, with an optional
// sign, fraction and exponent (not a fraction a/b, nor 0x...).
func decimalText(s string) bool {
	s = strings.TrimLeft(s, "+-")
	mant, exp, hasExp := strings.Cut(strings.ToLower(s), "e")
	whole, frac, _ := strings.Cut(mant, ".")
	digits := func(d string) bool { return strings.Trim(d, "0123456789") == "" }
	if whole+frac == "" || !digits(whole) || !digits(frac) {
		return false
	}
	exp = strings.TrimLeft(exp, "+-")
	return !hasExp || exp != "" && digits(exp)
}

// MarshalJSON implements json.Marshaler.
func (n Int) MarshalJSON() ([]byte, error) { return strconv.AppendInt(nil, n.V, 10), nil }

// IsZero lets omitzero skip a zero Int.
func (n Int) IsZero() bool { return n.V == 0 && n.bad == "" }

func (f *fieldErrs) int(field string, n Int) int64 {
	if n.bad != "" {
		f.add(field, notInt64+" (%s)", n.bad)
	}
	return n.V
}

// FormatTime formats epoch ms as the documents do.
func FormatTime(ms int64) string {
	return time.UnixMilli(ms).UTC().Format("2006-01-02T15:04:05.000Z")
}

// ParseTime parses an RFC 3339 time of a document to epoch ms.
func ParseTime(s string) (int64, error) {
	t, err := time.Parse(time.RFC3339Nano, s)
	if y, _, _ := strings.Cut(s, "-"); err != nil && len(y) > 4 && strings.Trim(y, "0123456789") == "" {
		// A year of five digits or more, as get prints a time after
		// 9999 that a record written straight to the topic holds.
		return 0, fmt.Errorf("%s is after %s, the latest time a document can hold", clip.To(s, clip.Echo), FormatTime(maxDocTime))
	}
	if err != nil {
		return 0, fmt.Errorf("not an RFC 3339 time such as 2026-12-01T00:00:00Z (%q)", clip.To(s, clip.Echo))
	}
	if t.Nanosecond()%int(time.Millisecond) != 0 {
		// Kept to the millisecond, it would be cut to the one before:
		// a grant would stop paying, a record start, earlier than
		// written.
		return 0, fmt.Errorf("%s is more precise than a millisecond, the precision of times", clip.To(s, clip.Echo))
	}
	if t.Before(time.UnixMilli(schemas.MinEventTime)) {
		return 0, fmt.Errorf("%s is before 2000-01-01", s)
	}
	if t.UnixMilli() > maxDocTime {
		// Printed in UTC (FormatTime), it would have a year of five
		// digits, which RFC 3339 has not: get would print a document
		// that set refuses.
		return 0, fmt.Errorf("%s is after %s, the latest time a document can hold (in UTC)", s, FormatTime(maxDocTime))
	}
	return t.UnixMilli(), nil
}

// maxDocTime is the latest time of a document, 9999-12-31T23:59:59.999Z:
// a time written with an offset (9999-12-31T23:59:59-05:00) can be later
// in UTC, where FormatTime prints it.
const maxDocTime = 253402300799999

func (f *fieldErrs) time(field, s string) int64 {
	if s == "" {
		return 0
	}
	ms, err := ParseTime(s)
	if err != nil {
		f.add(field, "%v", err)
	}
	return ms
}

// docError is an error of decodeStrict: its field errors as they are, one
// a line; a syntax error prefixed with the package.
func docError(err error) error {
	if errors.Is(err, ErrInvalid) {
		return err
	}
	return fmt.Errorf("entitlements: %w", err)
}

// ParseDocument reads a Document from YAML or JSON. Unknown fields and
// malformed syntax are errors; the values are checked by Record.
func ParseDocument(b []byte) (*Document, error) {
	var d Document
	if err := decodeStrict(b, &d); err != nil {
		return nil, docError(err)
	}
	return &d, nil
}

// ReservedPlanNames are the values of the plan label of the aggregator's
// metrics (aggregator planLabels) that name no plan: none (no plan),
// unnamed (a plan without a name) and other (the plans past the first
// 64 names). Record refuses them as a plan's name, which would be counted
// under the same label and could not be told apart; the aggregator takes
// a record that names one (written straight to the topic) and labels it
// so.
var ReservedPlanNames = []string{"none", "unnamed", "other"}

// Record converts the document to an Entitlements record and validates it
// (Validate, with meters when not nil), returning every problem at once
// with its field path. customer names the customer ("" for the default
// plan); a document that names another one is an error, and so is a plan
// named by one of ReservedPlanNames.
func (d *Document) Record(customer string, meters Meters) (*schemas.Entitlements, error) {
	var f fieldErrs
	switch {
	case customer == "" && d.Customer != "":
		f.add("customer", "the default plan names no customer (got %q)", clip.To(d.Customer, clip.Echo))
	case d.Customer != "" && d.Customer != customer:
		f.add("customer", "%q, but the record is for %q", clip.To(d.Customer, clip.Echo), clip.To(customer, clip.Echo))
	}
	switch _, err := ParseRecordVersion(d.Version); {
	case d.Version == "":
	case customer == "":
		f.add("version", "the default plan is written unconditionally: only a customer's record has a version (got %q)", clip.To(d.Version, clip.Echo))
	case err != nil:
		f.add("version", "%v", err)
	}
	if slices.Contains(ReservedPlanNames, d.Plan) {
		f.add("plan", "%s is a reserved word: the metrics' plan label is none for no plan, unnamed for a plan without a name "+
			"and other past the first 64 plan names, so none, unnamed and other are not plan names", d.Plan)
	}
	e := &schemas.Entitlements{CustomerID: customer, Plan: d.Plan, Unmetered: d.Unmetered,
		EffectiveFrom: f.time("effective_from", d.EffectiveFrom), Caps: []schemas.Cap{}, Grants: []schemas.Grant{},
		Overdraft: schemas.Overdraft{Policy: schemas.OverdraftAllow}}
	for _, m := range slices.Sorted(maps.Keys(d.Caps)) {
		c, at := d.Caps[m], "caps."+pathPart(m)
		cp := schemas.Cap{Meter: m, Limit: f.int(at+".limit", c.Limit), OnLimit: schemas.OnLimitReject}
		switch strings.ToLower(c.OnLimit) {
		case "", "reject":
		case "allow":
			cp.OnLimit = schemas.OnLimitAllow
		default:
			f.add(at+".on_limit", "must be reject or allow (got %q)", clip.To(c.OnLimit, clip.Echo))
		}
		e.Caps = append(e.Caps, cp)
	}
	for _, id := range slices.Sorted(maps.Keys(d.Grants)) {
		g, at := d.Grants[id], "grants."+pathPart(id)
		pr := f.int(at+".priority", g.Priority)
		if pr > math.MaxInt32 || pr < math.MinInt32 {
			f.add(at+".priority", "out of range (%d)", pr)
			pr = 0
		}
		e.Grants = append(e.Grants, schemas.Grant{ID: id, Amount: f.int(at+".amount", g.Amount), Priority: int32(pr),
			EffectiveFrom: f.time(at+".effective_from", g.EffectiveFrom), ExpiresAt: f.time(at+".expires_at", g.ExpiresAt)})
	}
	if o := d.Overdraft; o != nil {
		switch strings.ToLower(o.Policy) {
		case "", "allow":
		case "deny":
			e.Overdraft.Policy = schemas.OverdraftDeny
		default:
			f.add("overdraft.policy", "must be allow or deny (got %q)", clip.To(o.Policy, clip.Echo))
		}
		e.Overdraft.Limit = f.int("overdraft.limit", o.Limit)
		if o.Limit.given && o.Limit.bad == "" && o.Limit.V == 0 && e.Overdraft.Policy == schemas.OverdraftAllow {
			// In the record a limit of 0 is none: written, it would
			// let the customer overdraw without bound.
			f.add("overdraft.limit", "0 is no limit: leave limit out to overdraw without limit, or write policy: deny to overdraw nothing")
		}
	}
	if err := Validate(e, meters); err != nil {
		errs := unjoin(err)
		keyPaths(errs, "caps", func(i int) (string, bool) { return itemName(i, e.Caps, func(c schemas.Cap) string { return c.Meter }) }, map[string]string{".meter": ""})
		keyPaths(errs, "grants", func(i int) (string, bool) { return itemName(i, e.Grants, func(g schemas.Grant) string { return g.ID }) }, map[string]string{".id": ""})
		f = append(f, f.unreported(errs)...)
	}
	if err := f.err(); err != nil {
		return nil, err
	}
	return e, nil
}

// notInt64 begins the error of a number that is not a 64-bit integer.
const notInt64 = "not a 64-bit integer"

// unreported is errs (Validate's) but those of a field that f reports as
// not a 64-bit integer: such a number is reported as that, not also as
// the 0 it was read as.
func (f fieldErrs) unreported(errs []error) []error {
	reported := map[string]bool{}
	for _, e := range f {
		if fe, ok := e.(*FieldError); ok && strings.HasPrefix(fe.Reason, notInt64) {
			reported[fe.Field] = true
		}
	}
	var out []error
	for _, e := range errs {
		if fe, ok := e.(*FieldError); ok && reported[fe.Field] {
			continue
		}
		out = append(out, e)
	}
	return out
}

// unjoin returns the errors joined in err.
func unjoin(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return slices.Clone(j.Unwrap())
	}
	return []error{err}
}

// itemName returns the name of items[i], if there is one.
func itemName[T any](i int, items []T, name func(T) string) (string, bool) {
	if i < 0 || i >= len(items) {
		return "", false
	}
	return name(items[i]), true
}

// keyPaths renames, in errs, the fields that Validate names by an
// item's index in a record's list (list[i], for an item whose name no
// record can hold) by the item's key in the document, as every other
// field of it is named: caps[0].meter is caps."a\tb", caps[0].limit
// caps."a\tb".limit. A field of an item that the document does not
// write apart (hidden: the record's field, such as ".meter", which is the
// item's key, or a rate's ".micro_credits", which its text holds, to the
// words that begin the reason in its place) is named by the item's key.
func keyPaths(errs []error, list string, name func(int) (string, bool), hidden map[string]string) {
	for k, err := range errs {
		fe, ok := err.(*FieldError)
		if !ok {
			continue
		}
		field, reason := fe.Field, fe.Reason
		if strings.HasPrefix(field, list+"[") {
			idx, rest, ok := strings.Cut(field[len(list)+1:], "]")
			i, err := strconv.Atoi(idx)
			if !ok || err != nil {
				continue
			}
			n, ok := name(i)
			if !ok {
				continue
			}
			field = list + "." + pathPart(n) + rest
		}
		for part, words := range hidden {
			// list.<key>.part, not list.part: the item whose key is part.
			if at, ok := strings.CutSuffix(field, part); ok && strings.HasPrefix(at, list+".") {
				field, reason = at, words+reason
				break
			}
		}
		if field != fe.Field {
			errs[k] = &FieldError{Field: field, Reason: reason}
		}
	}
}

// DocumentOf returns the document of a record; writtenAt (its broker
// time, 0: unknown) is printed for information.
func DocumentOf(e *schemas.Entitlements, writtenAt int64) *Document {
	d := &Document{Customer: e.CustomerID, Plan: e.Plan, Unmetered: e.Unmetered}
	if e.EffectiveFrom != 0 {
		d.EffectiveFrom = FormatTime(e.EffectiveFrom)
	}
	if writtenAt != 0 {
		d.WrittenAt = FormatTime(writtenAt)
	}
	for _, c := range e.Caps {
		if d.Caps == nil {
			d.Caps = map[string]CapDoc{}
		}
		d.Caps[c.Meter] = CapDoc{Limit: Int{V: c.Limit}, OnLimit: strings.ToLower(string(c.OnLimit))}
	}
	for _, g := range e.Grants {
		if d.Grants == nil {
			d.Grants = map[string]GrantDoc{}
		}
		gd := GrantDoc{Amount: Int{V: g.Amount}, Priority: Int{V: int64(g.Priority)}}
		if g.EffectiveFrom != 0 {
			gd.EffectiveFrom = FormatTime(g.EffectiveFrom)
		}
		if g.ExpiresAt != 0 {
			gd.ExpiresAt = FormatTime(g.ExpiresAt)
		}
		d.Grants[g.ID] = gd
	}
	d.Overdraft = &OverdraftDoc{Policy: strings.ToLower(string(e.Overdraft.Policy)), Limit: Int{V: e.Overdraft.Limit}}
	return d
}

// rateHidden: the fields of a rate that its text (rates.<meter>: "N/M")
// holds, and the words that name them in an error.
var rateHidden = map[string]string{".meter": "", ".micro_credits": "the price ", ".per_units": "the units it is priced per (after /) "}

// RatesDocument is the rate card: every version, in time order.
type RatesDocument struct {
	Versions  []RateVersionDoc `json:"versions"`
	WrittenAt string           `json:"written_at,omitempty"` // printed by get; ignored by set-rates
}

// RateVersionDoc is one version: from effective_from (event time) on,
// each meter's price per unit in micro-credits, written as an integer
// ("1000"), a fraction ("15/1000": 15 micro-credits per 1,000 units) or a
// decimal ("0.015").
type RateVersionDoc struct {
	EffectiveFrom string             `json:"effective_from"`
	Rates         map[string]RateDoc `json:"rates"`
}

// RateDoc is a rate as written in a document.
type RateDoc string

// UnmarshalJSON takes a JSON number or string.
func (r *RateDoc) UnmarshalJSON(b []byte) error {
	s := string(bytes.TrimSpace(b))
	if u, err := strconv.Unquote(s); err == nil {
		s = u
	}
	*r = RateDoc(s)
	return nil
}

// ParseRate parses a rate: "N", "N/M" or a decimal "D.F", micro-credits
// per unit.
func ParseRate(s string) (micro, per int64, err error) {
	s = strings.ReplaceAll(strings.TrimSpace(s), "_", "")
	bad := fmt.Errorf("not a rate such as 1000, 15/1000 or 0.015 micro-credits per unit (%q)", clip.To(s, clip.Echo))
	if len(s) > maxNumberText {
		// Longer than any rate a card can hold (two integers of 19
		// digits, or 18 decimals): refused before math/big reads it,
		// which takes seconds for a million digits.
		if strings.Trim(s, "0123456789./ ") != "" {
			return 0, 0, bad
		}
		return 0, 0, fmt.Errorf("%q has too many digits", clip.To(s, clip.Echo))
	}
	if n, d, ok := strings.Cut(s, "/"); ok {
		micro, err1 := strconv.ParseInt(strings.TrimSpace(n), 10, 64)
		per, err2 := strconv.ParseInt(strings.TrimSpace(d), 10, 64)
		if err1 != nil || err2 != nil {
			return 0, 0, bad
		}
		return micro, per, nil
	}
	// Decimal digits only: math/big also reads 0x10, 0b11 and 0o17.
	if !decimalText(s) || strings.ContainsAny(s, "eE") {
		return 0, 0, bad
	}
	r, ok := new(big.Rat).SetString(s)
	if !ok {
		return 0, 0, bad
	}
	// Keep the written precision (0.250 → 250/1000), so that the card
	// prints back as written.
	per = 1
	if _, frac, ok := strings.Cut(s, "."); ok {
		if len(frac) > 18 {
			return 0, 0, fmt.Errorf("%q has too many digits", clip.To(s, clip.Echo))
		}
		for range frac {
			per *= 10
		}
	}
	// With at most 18 decimals, what does not fit is the magnitude.
	num := new(big.Rat).Mul(r, new(big.Rat).SetInt64(per))
	if !num.IsInt() || !num.Num().IsInt64() {
		return 0, 0, fmt.Errorf("%q is out of range: a rate's numbers are 64-bit integers", clip.To(s, clip.Echo))
	}
	return num.Num().Int64(), per, nil
}

// FormatRate formats a rate as ParseRate reads it.
func FormatRate(r schemas.Rate) RateDoc {
	if r.PerUnits == 1 {
		return RateDoc(strconv.FormatInt(r.MicroCredits, 10))
	}
	return RateDoc(fmt.Sprintf("%d/%d", r.MicroCredits, r.PerUnits))
}

// ParseRatesDocument reads a RatesDocument from YAML or JSON.
func ParseRatesDocument(b []byte) (*RatesDocument, error) {
	var d RatesDocument
	if err := decodeStrict(b, &d); err != nil {
		return nil, docError(err)
	}
	return &d, nil
}

// Card converts the document to a RateCard and validates it
// (ValidateRateCard, with meters when not nil), returning every problem at
// once with its field path.
func (d *RatesDocument) Card(meters Meters) (*schemas.RateCard, error) {
	var f fieldErrs
	c := &schemas.RateCard{Versions: []schemas.RateVersion{}}
	for i, v := range d.Versions {
		at := fmt.Sprintf("versions[%d]", i)
		rv := schemas.RateVersion{Rates: []schemas.Rate{}}
		if v.EffectiveFrom == "" {
			f.add(at+".effective_from", "is required")
		} else {
			rv.EffectiveFrom = f.time(at+".effective_from", v.EffectiveFrom)
		}
		for _, m := range slices.Sorted(maps.Keys(v.Rates)) {
			mc, per, err := ParseRate(string(v.Rates[m]))
			if err != nil {
				f.add(at+".rates."+pathPart(m), "%v", err)
				per = 1
			}
			rv.Rates = append(rv.Rates, schemas.Rate{Meter: m, MicroCredits: mc, PerUnits: per})
		}
		c.Versions = append(c.Versions, rv)
	}
	if err := ValidateRateCard(c, meters); err != nil {
		errs := unjoin(err)
		for i, v := range c.Versions {
			keyPaths(errs, fmt.Sprintf("versions[%d].rates", i), func(j int) (string, bool) {
				return itemName(j, v.Rates, func(r schemas.Rate) string { return r.Meter })
			}, rateHidden)
		}
		f = append(f, errs...)
	}
	if err := f.err(); err != nil {
		return nil, err
	}
	return c, nil
}

// RatesDocumentOf returns the document of a rate card.
func RatesDocumentOf(c *schemas.RateCard, writtenAt int64) *RatesDocument {
	d := &RatesDocument{Versions: []RateVersionDoc{}}
	if writtenAt != 0 {
		d.WrittenAt = FormatTime(writtenAt)
	}
	for _, v := range c.Versions {
		rv := RateVersionDoc{EffectiveFrom: FormatTime(v.EffectiveFrom), Rates: map[string]RateDoc{}}
		for _, r := range v.Rates {
			rv.Rates[r.Meter] = FormatRate(r)
		}
		d.Versions = append(d.Versions, rv)
	}
	return d
}
