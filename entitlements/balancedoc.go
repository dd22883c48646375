package entitlements

import (
	"math"
	"math/bits"
	"strings"

	"github.com/meterline/meterline/schemas"
)

// BalanceDocument is a record of usage.balances as `meterline
// entitlements balance` prints it: times in RFC 3339 UTC, credits in
// micro-credits, and, per capped meter, how much of the cap is used.
type BalanceDocument struct {
	Customer  string `json:"customer"`
	Plan      string `json:"plan,omitempty"`
	Unmetered bool   `json:"unmetered,omitempty"`
	// AsOf: the broker time the balance is as of (its updated_at).
	AsOf     string `json:"as_of"`
	Revision int64  `json:"revision"`
	// The billing period of AsOf: [start, end).
	PeriodStart string `json:"period_start"`
	PeriodEnd   string `json:"period_end"`
	// CapsUntil: when the caps (or unmetered) of the balance stop being
	// those in effect, a change scheduled for later (its caps_until);
	// absent when none is known.
	CapsUntil string              `json:"caps_until,omitempty"`
	Meters    []MeterBalanceDoc   `json:"meters,omitempty"`
	Grants    []GrantBalanceDoc   `json:"grants,omitempty"`
	Remaining int64               `json:"credits_remaining"`
	Overdraft OverdraftBalanceDoc `json:"overdraft"`
	Source    *BalanceSourceDoc   `json:"source,omitempty"`
}

// MeterBalanceDoc is a capped meter's usage in the period. UsedPercent
// is usage ÷ limit in percent, rounded down (0 when the limit is 0).
type MeterBalanceDoc struct {
	Meter       string `json:"meter"`
	Usage       int64  `json:"usage"`
	Limit       int64  `json:"limit"`
	OnLimit     string `json:"on_limit"`
	UsedPercent int64  `json:"used_percent"`
}

// GrantBalanceDoc is what is left of a grant not yet expired at AsOf.
type GrantBalanceDoc struct {
	ID            string `json:"id"`
	Priority      int32  `json:"priority,omitzero"`
	EffectiveFrom string `json:"effective_from,omitempty"`
	ExpiresAt     string `json:"expires_at,omitempty"`
	Amount        int64  `json:"amount"`
	Consumed      int64  `json:"consumed"`
	Remaining     int64  `json:"remaining"`
}

// OverdraftBalanceDoc is the overdraft policy and what the period has
// overdrawn (limit 0: none).
type OverdraftBalanceDoc struct {
	Policy    string `json:"policy"`
	Limit     int64  `json:"limit,omitzero"`
	Overdrawn int64  `json:"overdrawn"`
}

// BalanceSourceDoc says which record of usage.balances a document is.
type BalanceSourceDoc struct {
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
	Offset    int64  `json:"offset"`
}

// BalanceDocumentOf is b as a document.
func BalanceDocumentOf(b *schemas.Balance) *BalanceDocument {
	d := &BalanceDocument{Customer: b.CustomerID, Plan: b.Plan, Unmetered: b.Unmetered, AsOf: FormatTime(b.UpdatedAt),
		Revision: b.Revision, PeriodStart: FormatTime(b.PeriodStart), PeriodEnd: FormatTime(b.PeriodEnd),
		Overdraft: OverdraftBalanceDoc{Policy: strings.ToLower(string(b.OverdraftPolicy)), Limit: b.OverdraftLimit, Overdrawn: b.Overdrawn}}
	if b.CapsUntil != 0 {
		d.CapsUntil = FormatTime(b.CapsUntil)
	}
	for _, m := range b.Meters {
		d.Meters = append(d.Meters, MeterBalanceDoc{Meter: m.Meter, Usage: m.Usage, Limit: m.Limit,
			OnLimit: strings.ToLower(string(m.OnLimit)), UsedPercent: usedPercent(m.Usage, m.Limit)})
	}
	for _, g := range b.Grants {
		gd := GrantBalanceDoc{ID: g.ID, Priority: g.Priority, Amount: g.Amount, Consumed: g.Consumed, Remaining: g.Remaining}
		if g.EffectiveFrom != 0 {
			gd.EffectiveFrom = FormatTime(g.EffectiveFrom)
		}
		if g.ExpiresAt != 0 {
			gd.ExpiresAt = FormatTime(g.ExpiresAt)
		}
		d.Grants = append(d.Grants, gd)
		// Each remaining is at most its grant's amount, an int64: the sum
		// saturates rather than wraps.
		if g.Remaining > 0 {
			d.Remaining = satAdd(d.Remaining, g.Remaining)
		}
	}
	return d
}

// usedPercent is usage ÷ limit in percent, rounded down, without
// overflow (at most MaxInt64); 0 for a limit or usage of 0 or less.
func usedPercent(usage, limit int64) int64 {
	if limit <= 0 || usage <= 0 {
		return 0
	}
	if usage/limit >= math.MaxInt64/100 {
		return math.MaxInt64
	}
	// usage*100 in 128 bits; the quotient fits in int64 (checked above),
	// so Div64 cannot overflow.
	hi, lo := bits.Mul64(uint64(usage), 100)
	q, _ := bits.Div64(hi, lo, uint64(limit))
	return int64(q)
}

// satAdd is a+b for non-negative a and b, at most MaxInt64.
func satAdd(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}
