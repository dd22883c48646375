package entitlements

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"

	"github.com/meterline/meterline/internal/clip"
	"github.com/meterline/meterline/schemas"
)

// Limits on one record of usage.entitlements. They keep a record, and the
// state built from it, small: a plan and its versions are held per
// customer, and a record must fit the broker's message size.
const (
	// MaxCaps bounds the caps of one plan.
	MaxCaps = 256
	// MaxGrants bounds the grants of one plan.
	MaxGrants = 256
	// MaxRateVersions bounds the versions of the rate card.
	MaxRateVersions = 1000
	// MaxRates bounds the rates of the rate card, summed over its versions.
	MaxRates = 10_000
	// MaxNameBytes bounds a plan name, a meter name and a grant id.
	MaxNameBytes = schemas.MaxIdentityFieldBytes
)

// ErrInvalid is wrapped by every FieldError: a record of usage.entitlements
// that breaks a rule. The aggregator rejects such a record (reason
// invalid) and keeps what was in effect before it.
var ErrInvalid = errors.New("invalid")

// FieldError names the field of a record that is wrong, by a path an
// operator reads in the YAML document: "caps.api_calls.limit",
// "grants.promo.expires_at", "versions[1].rates.tokens".
type FieldError struct {
	Field  string
	Reason string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Reason }

// Unwrap makes errors.Is(err, ErrInvalid) hold.
func (e *FieldError) Unwrap() error { return ErrInvalid }

// fieldErrs collects FieldErrors in the order they are found, the first
// maxFieldErrors of them: a record written straight to the topic may
// hold tens of thousands of bad caps or grants, and naming each one cost
// the aggregator a third of a second and 170 MB for one record of
// 530 KB. Past them, one error says that there are more.
type fieldErrs []error

// maxFieldErrors bounds the problems fieldErrs names.
const maxFieldErrors = 64

// errMoreProblems follows the first maxFieldErrors problems named.
var errMoreProblems = fmt.Errorf("%w: more problems, not named (the first %d are)", ErrInvalid, maxFieldErrors)

func (f *fieldErrs) add(field, format string, args ...any) {
	switch n := len(*f); {
	case n == maxFieldErrors:
		*f = append(*f, errMoreProblems)
		return
	case n > maxFieldErrors:
		return
	}
	f.must(field, format, args...)
}

// must adds a problem whatever maxFieldErrors says: a record's count past
// a bound, which says why it is refused when its items have more
// problems than are named.
func (f *fieldErrs) must(field, format string, args ...any) {
	*f = append(*f, &FieldError{Field: field, Reason: fmt.Sprintf(format, args...)})
}

func (f fieldErrs) err() error { return errors.Join(f...) }

// Meters tells the aggregation of a meter (SUM, COUNT, MAX, UNIQUE_COUNT
// or LATEST) and whether it is declared. Validation with a Meters refuses
// caps and rates on meters whose aggregation is not SUM or COUNT.
type Meters func(meter string) (aggregation string, declared bool)

// Charged reports whether a meter's aggregation can carry a cap or a rate:
// SUM and COUNT, whose events add units to the period (SUM: the quantity;
// COUNT: one).
func Charged(aggregation string) bool { return aggregation == "SUM" || aggregation == "COUNT" }

// Plan is what one Entitlements record grants, validated: the caps sorted
// by meter, the grants in draw order (Decide draws from them in this order
// among those whose window holds the event's time).
type Plan struct {
	Name      string
	Unmetered bool
	Caps      []schemas.Cap
	Grants    []schemas.Grant
	Overdraft schemas.Overdraft
	// gens[i] is the generation of Grants[i] (named by the read time of
	// the record that started it, generation.go), by which what the grant
	// paid is kept; nil for a plan no Ledger applied (and for the
	// versions of state written before generations, legacyGen).
	gens []int64
}

// same reports whether p and q decide every event alike: the same plan,
// caps, grants with the same generations, and overdraft; two nil plans
// (tombstones) are the same.
func (p *Plan) same(q *Plan) bool {
	if p == nil || q == nil {
		return p == q
	}
	return p.Name == q.Name && p.Unmetered == q.Unmetered && p.Overdraft == q.Overdraft &&
		slices.Equal(p.Caps, q.Caps) && slices.Equal(p.Grants, q.Grants) && slices.Equal(p.gens, q.gens)
}

// legacyGen is the generation of a grant in state written before grants
// had generations: what such a grant paid is kept under it, and the
// versions read then offer it.
const legacyGen = math.MinInt64

// gen returns the generation of Grants[i].
func (p *Plan) gen(i int) int64 {
	if i < len(p.gens) {
		return p.gens[i]
	}
	return legacyGen
}

// withGens returns a copy of p whose grants have the generations gens
// (p itself is not modified: a Plan may be shared once applied).
func (p *Plan) withGens(gens []int64) *Plan {
	q := *p
	q.gens = gens
	return &q
}

// Cap returns the cap of a meter.
func (p *Plan) Cap(meter string) (schemas.Cap, bool) {
	if c := p.capOf(meter); c != nil {
		return *c, true
	}
	return schemas.Cap{}, false
}

// capOf returns the cap of a meter, nil if none: Cap without copying it,
// once per event decided.
func (p *Plan) capOf(meter string) *schemas.Cap {
	caps := p.Caps
	if len(caps) <= smallCaps {
		// A plan caps a few meters: comparing them is cheaper than a
		// search (the caps are sorted by meter, the first equal is the
		// one the search finds).
		for i := range caps {
			if caps[i].Meter == meter {
				return &caps[i]
			}
		}
		return nil
	}
	i := sort.Search(len(caps), func(i int) bool { return caps[i].Meter >= meter })
	if i < len(caps) && caps[i].Meter == meter {
		return &caps[i]
	}
	return nil
}

// smallCaps is how many caps Cap compares one by one.
const smallCaps = 8

// PassesCap reports whether an event adding units to a period's usage takes
// it past a cap's limit (docs/entitlements.md, Plans and caps): usage
// landing exactly on the limit is within it. A sum that does not fit 64
// bits is not this rule's (Decide refuses the event as invalid before):
// false. Decide and the ingest's quota gate both decide a cap by it.
func PassesCap(usage, units, limit int64) bool {
	if units > 0 && usage > math.MaxInt64-units {
		return false
	}
	return usage+units > limit
}

// noPlan applies when a customer has no record and there is no default
// plan: nothing capped, no grants, overdraft allowed without limit, so
// that no event is refused unless an operator asked for it.
var noPlan = &Plan{Overdraft: schemas.Overdraft{Policy: schemas.OverdraftAllow}}

// expiry returns a grant's end, math.MaxInt64 for one that never expires.
func expiry(g schemas.Grant) int64 {
	if g.ExpiresAt == 0 {
		return math.MaxInt64
	}
	return g.ExpiresAt
}

// drawsBefore orders grants for drawing: lower priority first, then the
// earliest expiry, then the id.
func drawsBefore(a, b schemas.Grant) bool {
	if a.Priority != b.Priority {
		return a.Priority < b.Priority
	}
	if ea, eb := expiry(a), expiry(b); ea != eb {
		return ea < eb
	}
	return a.ID < b.ID
}

// NewPlan validates an Entitlements record (Validate, without meters) and
// returns its Plan.
func NewPlan(e *schemas.Entitlements) (*Plan, error) {
	if err := Validate(e, nil); err != nil {
		return nil, err
	}
	p := &Plan{Name: e.Plan, Unmetered: e.Unmetered, Overdraft: e.Overdraft,
		Caps: append([]schemas.Cap(nil), e.Caps...), Grants: append([]schemas.Grant(nil), e.Grants...)}
	sort.Slice(p.Caps, func(i, j int) bool { return p.Caps[i].Meter < p.Caps[j].Meter })
	sort.Slice(p.Grants, func(i, j int) bool { return drawsBefore(p.Grants[i], p.Grants[j]) })
	return p, nil
}

// Record returns the Entitlements record of p for a customer ("" for the
// default plan): caps sorted by meter and grants by id, as the schema
// asks.
func (p *Plan) Record(customer string, effectiveFrom int64) *schemas.Entitlements {
	e := &schemas.Entitlements{CustomerID: customer, Plan: p.Name, EffectiveFrom: effectiveFrom, Unmetered: p.Unmetered,
		Caps: append([]schemas.Cap{}, p.Caps...), Grants: append([]schemas.Grant{}, p.Grants...), Overdraft: p.Overdraft}
	sort.Slice(e.Grants, func(i, j int) bool { return e.Grants[i].ID < e.Grants[j].ID })
	return e
}

// checkName reports a name that is empty, too long or not clean text.
func (f *fieldErrs) checkName(field, v string) {
	switch {
	case v == "":
		f.add(field, "must not be empty")
	case len(v) > MaxNameBytes:
		f.add(field, "%d bytes, more than %d", len(v), MaxNameBytes)
	default:
		if fe := schemas.CheckText(field, v, true); fe != nil {
			f.add(field, "%s", fe.Reason)
		}
	}
}

// pathPart is a name as it appears in a field path: itself when it is a
// plain word, else quoted; a long one cut to its first clip.Echo bytes.
func pathPart(name string) string {
	name = clip.To(name, clip.Echo)
	if name != "" && strings.IndexFunc(name, func(r rune) bool {
		return !(r == '_' || r == '-' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z')
	}) < 0 {
		return name
	}
	return fmt.Sprintf("%q", name)
}

// Validate checks an Entitlements record and returns every problem at once
// (FieldErrors joined; past maxFieldErrors, and past the bounds on caps
// and grants, it names no more), each named by its field path. With meters, caps on
// meters whose aggregation is not SUM or COUNT are refused (a configuration
// error, docs/entitlements.md, Plans and caps). It does not check the
// customer_id against the record key (ParseRecord does).
func Validate(e *schemas.Entitlements, meters Meters) error {
	var f fieldErrs
	if e.CustomerID != "" {
		f.checkName("customer", e.CustomerID)
	}
	if e.Plan != "" {
		f.checkName("plan", e.Plan)
	}
	if e.EffectiveFrom < 0 {
		f.add("effective_from", "must not be negative (got %d)", e.EffectiveFrom)
	}
	if len(e.Caps) > MaxCaps {
		f.must("caps", "%d caps, more than %d", len(e.Caps), MaxCaps)
	}
	seen := map[string]bool{}
	// Past the bound the record is refused: its further items are not
	// looked at (one written straight to the topic may hold tens of
	// thousands).
	for i, c := range e.Caps[:min(len(e.Caps), MaxCaps+1)] {
		at := fmt.Sprintf("caps[%d]", i)
		if c.Meter == "" || len(c.Meter) > MaxNameBytes || schemas.CheckText("", c.Meter, true) != nil {
			f.checkName(at+".meter", c.Meter)
		} else {
			at = "caps." + pathPart(c.Meter)
			if seen[c.Meter] {
				f.add(at, "the meter has more than one cap")
			}
			seen[c.Meter] = true
		}
		if c.Limit <= 0 {
			f.add(at+".limit", "must be positive (got %d)", c.Limit)
		}
		if c.OnLimit != schemas.OnLimitReject && c.OnLimit != schemas.OnLimitAllow {
			f.add(at+".on_limit", "must be reject or allow (got %q)", string(c.OnLimit))
		}
		if meters != nil && c.Meter != "" {
			if agg, declared := meters(c.Meter); declared && !Charged(agg) {
				f.add(at, "%s is a %s meter: caps apply to SUM and COUNT meters only", c.Meter, agg)
			}
		}
	}
	if len(e.Grants) > MaxGrants {
		f.must("grants", "%d grants, more than %d", len(e.Grants), MaxGrants)
	}
	seen = map[string]bool{}
	for i, g := range e.Grants[:min(len(e.Grants), MaxGrants+1)] {
		at := fmt.Sprintf("grants[%d]", i)
		if g.ID == "" || len(g.ID) > MaxNameBytes || schemas.CheckText("", g.ID, true) != nil {
			f.checkName(at+".id", g.ID)
		} else {
			at = "grants." + pathPart(g.ID)
			if seen[g.ID] {
				f.add(at, "the id is used by more than one grant")
			}
			seen[g.ID] = true
		}
		if g.Amount <= 0 {
			f.add(at+".amount", "must be positive (got %d)", g.Amount)
		}
		if g.Priority < 0 {
			f.add(at+".priority", "must not be negative (got %d)", g.Priority)
		}
		if g.EffectiveFrom < 0 {
			f.add(at+".effective_from", "must not be negative (got %d)", g.EffectiveFrom)
		}
		if g.ExpiresAt < 0 {
			f.add(at+".expires_at", "must not be negative (got %d)", g.ExpiresAt)
		} else if g.ExpiresAt != 0 && g.ExpiresAt <= g.EffectiveFrom {
			f.add(at+".expires_at", "must be after effective_from")
		}
	}
	switch e.Overdraft.Policy {
	case schemas.OverdraftAllow:
		if e.Overdraft.Limit < 0 {
			f.add("overdraft.limit", "must not be negative (got %d)", e.Overdraft.Limit)
		}
	case schemas.OverdraftDeny:
		if e.Overdraft.Limit != 0 {
			f.add("overdraft.limit", "must be 0 with policy deny (got %d)", e.Overdraft.Limit)
		}
	default:
		f.add("overdraft.policy", "must be allow or deny (got %q)", string(e.Overdraft.Policy))
	}
	return f.err()
}
