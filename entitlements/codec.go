package entitlements

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/meterline/meterline/schemas"
)

// State values are versioned binary encodings: a format byte, then
// varints and length-prefixed strings. Decoders never panic and bound
// every count by what Validate allows and by the bytes left, so corrupt
// state is an error (ErrCorrupt), never a crash or an allocation without
// bound.

// The first byte of every encoded state value: its format.
const (
	// stateFormat: the rate history; and the format in which state
	// written before grants had generations holds timelines, accounts,
	// the default plan's grants and charges (still read: their grants
	// are of legacyGen).
	stateFormat = 1
	// stateFormatGen: timelines, accounts, the default plan's grants and
	// charges, each grant with its generation.
	stateFormatGen = 2
)

// ErrCorrupt is returned (wrapped) when a state value does not decode.
var ErrCorrupt = errors.New("entitlements: corrupt state")

type enc struct{ b []byte }

func (e *enc) int(v int64)   { e.b = binary.AppendVarint(e.b, v) }
func (e *enc) uint(v uint64) { e.b = binary.AppendUvarint(e.b, v) }
func (e *enc) str(s string)  { e.uint(uint64(len(s))); e.b = append(e.b, s...) }
func (e *enc) bool(v bool)   { e.b = append(e.b, boolByte(v)) }
func (e *enc) byte(v byte)   { e.b = append(e.b, v) }
func newEnc(n int) *enc      { return newEncFormat(n, stateFormat) }
func newEncFormat(n int, format byte) *enc {
	e := &enc{b: make([]byte, 0, n)}
	e.byte(format)
	return e
}
func (e *enc) bytes() []byte { return e.b }
func (e *enc) plan(p *Plan)  { encodePlan(e, p) }
func (e *enc) count(n int)   { e.uint(uint64(n)) }
func (e *enc) grant(g schemas.Grant) {
	e.str(g.ID)
	e.int(g.Amount)
	e.int(int64(g.Priority))
	e.int(g.EffectiveFrom)
	e.int(g.ExpiresAt)
}

func boolByte(v bool) byte {
	if v {
		return 1
	}
	return 0
}

type dec struct {
	b   []byte
	err error
	// gens: the value is in stateFormatGen (its grants have
	// generations).
	gens bool
}

// newDec decodes a value of stateFormat.
func newDec(what string, b []byte) *dec {
	d := &dec{b: b}
	if len(b) == 0 || b[0] != stateFormat {
		d.fail("%s: unknown format", what)
		return d
	}
	d.b = b[1:]
	return d
}

// newDecGens decodes a value of stateFormatGen, or of stateFormat as
// written before grants had generations (dec.gens false).
func newDecGens(what string, b []byte) *dec {
	if len(b) > 0 && b[0] == stateFormatGen {
		return &dec{b: b[1:], gens: true}
	}
	return newDec(what, b)
}

func (d *dec) fail(format string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: "+format, append([]any{ErrCorrupt}, args...)...)
	}
	d.b = nil
}

func (d *dec) int() int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.fail("bad varint")
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *dec) uint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail("bad uvarint")
		return 0
	}
	d.b = d.b[n:]
	return v
}

// count reads a count of at most max items.
func (d *dec) count(max int) int {
	n := d.uint()
	if n > uint64(max) || n > uint64(len(d.b)) { // every item takes a byte at least
		d.fail("count %d out of range", n)
		return 0
	}
	return int(n)
}

func (d *dec) str() string {
	n := d.uint()
	if d.err != nil {
		return ""
	}
	if n > uint64(len(d.b)) {
		d.fail("string of %d bytes past the end", n)
		return ""
	}
	s := string(d.b[:n])
	d.b = d.b[n:]
	return s
}

func (d *dec) byte() byte {
	if d.err != nil {
		return 0
	}
	if len(d.b) == 0 {
		d.fail("unexpected end")
		return 0
	}
	v := d.b[0]
	d.b = d.b[1:]
	return v
}

func (d *dec) bool() bool {
	switch d.byte() {
	case 0:
		return false
	case 1:
		return true
	}
	d.fail("bad bool")
	return false
}

// end reports an error, or trailing bytes.
func (d *dec) end() error {
	if d.err == nil && len(d.b) != 0 {
		d.fail("%d trailing bytes", len(d.b))
	}
	return d.err
}

func (d *dec) grant() schemas.Grant {
	g := schemas.Grant{ID: d.str(), Amount: d.int()}
	p := d.int()
	if p < 0 || p > math.MaxInt32 {
		d.fail("grant priority %d out of range", p)
	}
	g.Priority = int32(p)
	g.EffectiveFrom, g.ExpiresAt = d.int(), d.int()
	return g
}

var onLimits = [...]schemas.OnLimit{schemas.OnLimitReject, schemas.OnLimitAllow}
var policies = [...]schemas.OverdraftPolicy{schemas.OverdraftAllow, schemas.OverdraftDeny}

func encodePlan(e *enc, p *Plan) {
	e.str(p.Name)
	e.bool(p.Unmetered)
	e.count(len(p.Caps))
	for _, c := range p.Caps {
		e.str(c.Meter)
		e.int(c.Limit)
		e.bool(c.OnLimit == schemas.OnLimitAllow)
	}
	e.count(len(p.Grants))
	for i, g := range p.Grants {
		e.grant(g)
		e.int(p.gen(i))
	}
	e.bool(p.Overdraft.Policy == schemas.OverdraftDeny)
	e.int(p.Overdraft.Limit)
}

// decodePlan reads a plan and validates it again (NewPlan), so that state
// can never hold what a record could not.
func decodePlan(d *dec) *Plan {
	e := &schemas.Entitlements{Plan: d.str(), Unmetered: d.bool()}
	n := d.count(MaxCaps)
	for i := 0; i < n && d.err == nil; i++ {
		c := schemas.Cap{Meter: d.str(), Limit: d.int()}
		c.OnLimit = onLimits[boolByte(d.bool())]
		e.Caps = append(e.Caps, c)
	}
	n = d.count(MaxGrants)
	var gens []int64
	for i := 0; i < n && d.err == nil; i++ {
		e.Grants = append(e.Grants, d.grant())
		if d.gens {
			gens = append(gens, d.int())
		}
	}
	e.Overdraft.Policy = policies[boolByte(d.bool())]
	e.Overdraft.Limit = d.int()
	if d.err != nil {
		return nil
	}
	p, err := NewPlan(e)
	if err != nil {
		d.fail("plan: %v", err)
		return nil
	}
	if gens != nil {
		// NewPlan sorts the grants in draw order, as they were encoded;
		// the generations follow them by id if they moved.
		p.gens = gens
		for i := range p.Grants {
			if p.Grants[i].ID == e.Grants[i].ID {
				continue
			}
			byID := make(map[string]int64, len(gens))
			for j, g := range e.Grants {
				byID[g.ID] = gens[j]
			}
			p.gens = make([]int64, len(p.Grants))
			for j, g := range p.Grants {
				p.gens[j] = byID[g.ID]
			}
			break
		}
	}
	return p
}

// MarshalBinary encodes the timeline for the stage's state.
func (t *Timeline) MarshalBinary() ([]byte, error) {
	e := newEncFormat(16+64*len(t.versions), stateFormatGen)
	e.count(len(t.versions))
	for _, v := range t.versions {
		e.int(v.From)
		e.bool(v.Plan != nil)
		if v.Plan != nil {
			e.plan(v.Plan)
		}
	}
	return e.bytes(), nil
}

// UnmarshalBinary decodes what MarshalBinary encoded. Errors wrap
// ErrCorrupt.
func (t *Timeline) UnmarshalBinary(b []byte) error {
	d := newDecGens("timeline", b)
	// MaxVersions bounds the versions within a span of a record's time,
	// not those kept: a stage far behind keeps the older ones as well.
	// count still bounds n by the bytes left (a version takes several).
	n := d.count(math.MaxInt32)
	vs := make([]Version, 0, n)
	for i := 0; i < n && d.err == nil; i++ {
		v := Version{From: d.int()}
		if d.bool() {
			v.Plan = decodePlan(d)
		}
		if i > 0 && d.err == nil && v.From <= vs[i-1].From {
			d.fail("timeline: versions out of order")
		}
		vs = append(vs, v)
	}
	if err := d.end(); err != nil {
		return fmt.Errorf("entitlements: decode timeline: %w", err)
	}
	t.versions = vs
	return nil
}

// MarshalBinary encodes the history for the stage's state.
func (h *RateHistory) MarshalBinary() ([]byte, error) {
	e := newEnc(64)
	e.count(len(h.cards))
	for _, c := range h.cards {
		e.int(c.written)
		e.count(len(c.versions))
		for _, v := range c.versions {
			e.int(v.EffectiveFrom)
			e.count(len(v.Rates))
			for _, r := range v.Rates {
				e.str(r.Meter)
				e.int(r.MicroCredits)
				e.int(r.PerUnits)
			}
		}
	}
	return e.bytes(), nil
}

// UnmarshalBinary decodes what MarshalBinary encoded. Errors wrap
// ErrCorrupt.
func (h *RateHistory) UnmarshalBinary(b []byte) error {
	d := newDec("rate history", b)
	n := d.count(math.MaxInt32)
	var cards []rateCard
	for i := 0; i < n && d.err == nil; i++ {
		c := rateCard{written: d.int()}
		card := &schemas.RateCard{}
		nv := d.count(MaxRateVersions)
		for j := 0; j < nv && d.err == nil; j++ {
			v := schemas.RateVersion{EffectiveFrom: d.int()}
			nr := d.count(MaxRates)
			for k := 0; k < nr && d.err == nil; k++ {
				v.Rates = append(v.Rates, schemas.Rate{Meter: d.str(), MicroCredits: d.int(), PerUnits: d.int()})
			}
			card.Versions = append(card.Versions, v)
		}
		if d.err == nil {
			if err := ValidateRateCard(card, nil); err != nil {
				d.fail("rate card: %v", err)
			}
			for _, v := range card.Versions {
				for k := 1; k < len(v.Rates); k++ {
					if v.Rates[k].Meter <= v.Rates[k-1].Meter {
						d.fail("rates out of order")
					}
				}
			}
		}
		if i > 0 && c.written < cards[i-1].written {
			d.fail("rate cards out of order")
		}
		c.versions = card.Versions
		cards = append(cards, c)
	}
	if err := d.end(); err != nil {
		return fmt.Errorf("entitlements: decode rate history: %w", err)
	}
	h.cards = cards
	return nil
}
