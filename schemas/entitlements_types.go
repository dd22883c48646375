package schemas

// The records of usage.entitlements and usage.balances
// (docs/entitlements.md). Their meaning (which record applies to an event,
// how a grant is drawn) is the entitlements package's; these are the wire
// types.

// OnLimit says what a cap does with an event that would pass it.
type OnLimit string

// OnLimit values.
const (
	OnLimitReject OnLimit = "REJECT"
	OnLimitAllow  OnLimit = "ALLOW"
)

// OverdraftPolicy says what happens when grants cannot pay for an event.
type OverdraftPolicy string

// OverdraftPolicy values.
const (
	OverdraftAllow OverdraftPolicy = "ALLOW"
	OverdraftDeny  OverdraftPolicy = "DENY"
)

// Cap limits one meter's usage per billing period.
type Cap struct {
	Meter   string  `avro:"meter"`
	Limit   int64   `avro:"limit"`
	OnLimit OnLimit `avro:"on_limit"`
}

// Grant is an amount of micro-credits that pays for events whose
// event_time is in [EffectiveFrom, ExpiresAt) (ExpiresAt 0: never).
type Grant struct {
	ID            string `avro:"id"`
	Amount        int64  `avro:"amount"`
	Priority      int32  `avro:"priority"`
	EffectiveFrom int64  `avro:"effective_from"`
	ExpiresAt     int64  `avro:"expires_at"`
}

// Overdraft is the overdraft policy; Limit is per billing period, 0: none.
type Overdraft struct {
	Policy OverdraftPolicy `avro:"policy"`
	Limit  int64           `avro:"limit"`
}

// Entitlements is a record of usage.entitlements: a customer's plan, caps,
// grants and overdraft policy, or (CustomerID empty, key DefaultPlanKey)
// the default plan.
type Entitlements struct {
	CustomerID    string    `avro:"customer_id"`
	Plan          string    `avro:"plan"`
	EffectiveFrom int64     `avro:"effective_from"`
	Unmetered     bool      `avro:"unmetered"`
	Caps          []Cap     `avro:"caps"`
	Grants        []Grant   `avro:"grants"`
	Overdraft     Overdraft `avro:"overdraft"`
}

// Kind implements Message.
func (*Entitlements) Kind() Kind { return KindEntitlements }

// Rate prices a meter: MicroCredits per PerUnits units.
type Rate struct {
	Meter        string `avro:"meter"`
	MicroCredits int64  `avro:"micro_credits"`
	PerUnits     int64  `avro:"per_units"`
}

// RateVersion is the rates in effect from EffectiveFrom (event time) to
// the next version.
type RateVersion struct {
	EffectiveFrom int64  `avro:"effective_from"`
	Rates         []Rate `avro:"rates"`
}

// RateCard is the record of usage.entitlements under RateCardKey: the
// whole card, every version.
type RateCard struct {
	Versions []RateVersion `avro:"versions"`
}

// Kind implements Message.
func (*RateCard) Kind() Kind { return KindRateCard }

// MeterBalance is a capped meter's usage in the current period.
type MeterBalance struct {
	Meter   string  `avro:"meter"`
	Usage   int64   `avro:"usage"`
	Limit   int64   `avro:"limit"`
	OnLimit OnLimit `avro:"on_limit"`
}

// GrantBalance is what is left of a grant.
type GrantBalance struct {
	ID            string `avro:"id"`
	Priority      int32  `avro:"priority"`
	EffectiveFrom int64  `avro:"effective_from"`
	ExpiresAt     int64  `avro:"expires_at"`
	Amount        int64  `avro:"amount"`
	Consumed      int64  `avro:"consumed"`
	Remaining     int64  `avro:"remaining"`
}

// Balance is a record of usage.balances: a customer's usage against its
// caps in the current period and its credits per grant.
type Balance struct {
	CustomerID      string          `avro:"customer_id"`
	Plan            string          `avro:"plan"`
	Unmetered       bool            `avro:"unmetered"`
	Revision        int64           `avro:"revision"`
	UpdatedAt       int64           `avro:"updated_at"`
	PeriodStart     int64           `avro:"period_start"`
	PeriodEnd       int64           `avro:"period_end"`
	Meters          []MeterBalance  `avro:"meters"`
	Grants          []GrantBalance  `avro:"grants"`
	OverdraftPolicy OverdraftPolicy `avro:"overdraft_policy"`
	OverdraftLimit  int64           `avro:"overdraft_limit"`
	Overdrawn       int64           `avro:"overdrawn"`
	// CapsUntil is the broker time (epoch ms) from which Meters' limits
	// and policies and Unmetered are no longer those in effect: the
	// earliest effective_from after UpdatedAt of a version that changes
	// them, among the entitlements the writer had read. 0: none known
	// (and balances written before the field).
	CapsUntil int64 `avro:"caps_until"`
}

// Kind implements Message.
func (*Balance) Kind() Kind { return KindBalance }
