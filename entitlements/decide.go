package entitlements

import (
	"fmt"
	"math"
	"strconv"

	"github.com/meterline/meterline/schemas"
)

// Event is what a decision needs of an event of usage.deduped.
type Event struct {
	Meter string
	// Aggregation is the meter's: SUM, COUNT, MAX, UNIQUE_COUNT or
	// LATEST. Only SUM and COUNT meters add units to a period's usage, can
	// be capped and can cost credits.
	Aggregation string
	Quantity    int64
	EventTime   int64 // epoch ms
	Arrival     int64 // ingest_time: broker time, epoch ms
	// Undeclared: the meter is not in the aggregator's catalog (counted
	// as SUM). Its usage is kept only while the plan caps it or the rate
	// card prices it: a producer chooses undeclared meter names, and each
	// one kept is an entry of the customer's account, one state value.
	Undeclared bool
}

// Units returns what the event adds to its period's usage: SUM the
// quantity, COUNT one, other aggregations nothing.
func (e Event) Units() int64 {
	switch e.Aggregation {
	case "SUM":
		return e.Quantity
	case "COUNT":
		return 1
	}
	return 0
}

// Outcome is what Decide decided.
type Outcome uint8

// Outcomes.
const (
	// Accepted: the event counts; Units, Draws and Overdraft are its
	// charge.
	Accepted Outcome = iota
	// OverLimit: it would take the period past a cap whose on_limit is
	// REJECT.
	OverLimit
	// NoCredit: the grants cannot pay for it and the overdraft policy
	// does not allow the rest.
	NoCredit
	// Invalid: a sum it takes part in (usage, cost, overdraft) would pass
	// 64 bits.
	Invalid
)

func (o Outcome) String() string {
	switch o {
	case Accepted:
		return "accepted"
	case OverLimit:
		return schemas.ReasonOverLimit
	case NoCredit:
		return schemas.ReasonNoCredit
	case Invalid:
		return schemas.ReasonInvalid
	}
	return fmt.Sprintf("Outcome(%d)", uint8(o))
}

// Reason returns the rejection reason code of docs/design.md, Bad input (""
// when accepted).
func (o Outcome) Reason() string {
	if o == Accepted {
		return ""
	}
	return o.String()
}

// Draw is what one grant paid for an event, in micro-credits.
type Draw struct {
	Grant  string
	Amount int64
	// gen is the grant's generation in the plan that decided the event
	// (Plan.gen): what it paid is kept under it.
	gen int64
}

// Decision is the decision on one event and, when accepted, the change it
// makes to the customer's Account (Ledger.Record): a rejected event changes
// nothing.
type Decision struct {
	Outcome Outcome
	// Detail says why, for usage.rejected and the audit log.
	Detail string
	// Units is added to the usage of the event's meter in its period.
	Units int64
	// Cost is the event's price in micro-credits (0 when unmetered or the
	// meter has no rate).
	Cost int64
	// Draws is what each grant paid, in draw order; Overdraft is the rest
	// of Cost, overdrawn in the event's period.
	Draws     []Draw
	Overdraft int64
	// OverCap: accepted past a cap whose on_limit is ALLOW.
	OverCap bool
	// Plan is the plan that decided it (Ledger.Decide sets it; nil: no
	// plan), for metrics by plan.
	Plan *Plan
	// Misconfigured, when not empty, says that a cap or a rate on a meter
	// whose aggregation is not SUM or COUNT was ignored (a configuration
	// error that validation with the meters file refuses; the meter may
	// have changed aggregation since the record was written).
	Misconfigured string
	// acct is the customer's account Ledger.EvaluateInto read (nil: it
	// read none), and start the start of the event's period, for
	// Ledger.Record: it records the charge in that account without
	// looking it up again.
	acct  *Account
	start int64
}

// Input is everything a decision depends on.
type Input struct {
	// Plan is in effect at the event's arrival; nil: no plan (no caps, no
	// grants, overdraft allowed).
	Plan *Plan
	// Rate is the meter's rate at the event's event_time, as the rate
	// card stood at the earlier of its arrival and event_time; HasRate is
	// false when there is none (the event costs nothing).
	Rate    schemas.Rate
	HasRate bool
	Event   Event
	// Usage is the customer's accepted units of the meter in the event's
	// own period (summed across groups); Overdrawn the micro-credits it
	// overdrew in that period.
	Usage     int64
	Overdrawn int64
	// Consumed returns what a grant has paid so far; nil: what uses
	// holds (Ledger.Evaluate), else nothing.
	Consumed func(grant string) int64
	uses     []grantUse
}

// Decide decides one event (docs/entitlements.md, The aggregator, 3):
// unmetered → accepted, no charge; a cap it would pass → OverLimit
// (on_limit REJECT); credits → drawn from the grants whose window holds its
// event_time, by priority, then earliest expiry, then id; what they cannot
// pay is overdrawn when the policy allows, else NoCredit. Decide is pure:
// it reads in and returns the change; nothing is consumed by a rejected
// event.
func Decide(in Input) Decision {
	var d Decision
	decideInto(&in, &in.Event, &d)
	return d
}

// decideInto is Decide of *in for the event *ev (in.Event is not read)
// into *d, reusing its Draws' backing array. It reads *in and *ev and
// writes *d in place: an Input, an Event and a Decision are too large to
// be copied for every event.
func decideInto(in *Input, ev *Event, d *Decision) {
	draws := d.Draws[:0]
	p := in.Plan
	if p == nil {
		p = noPlan
	}
	if ev.Quantity < 0 {
		*d = Decision{Outcome: Invalid, Detail: fmt.Sprintf("quantity: negative (%d)", ev.Quantity)}
		return
	}
	units := ev.Units()
	if units > math.MaxInt64-in.Usage {
		*d = Decision{Outcome: Invalid, Detail: fmt.Sprintf("quantity: the usage of %s in the period would pass 64 bits (%d + %d)", ev.Meter, in.Usage, units)}
		return
	}
	*d = Decision{Units: units, Draws: draws}
	c := p.capOf(ev.Meter)
	capped := c != nil
	if ev.Undeclared && (p.Unmetered || !capped && !in.HasRate) {
		// Nothing decides by this meter's usage: keep none.
		d.Units = 0
		return
	}
	if p.Unmetered {
		return
	}
	charged := Charged(ev.Aggregation)
	if capped {
		switch {
		case !charged:
			d.Misconfigured = fmt.Sprintf("cap on %s ignored: a %s meter (caps apply to SUM and COUNT meters only)", ev.Meter, ev.Aggregation)
		case PassesCap(in.Usage, units, c.Limit) && c.OnLimit == schemas.OnLimitReject:
			*d = Decision{Outcome: OverLimit, Detail: overLimitDetail(ev.Meter, in.Usage, units, c.Limit, p.Name), Draws: draws}
			return
		case PassesCap(in.Usage, units, c.Limit):
			d.OverCap = true
		}
	}
	if !in.HasRate {
		return
	}
	if !charged {
		if d.Misconfigured == "" {
			d.Misconfigured = fmt.Sprintf("rate of %s ignored: a %s meter (rates apply to SUM and COUNT meters only)", ev.Meter, ev.Aggregation)
		} else {
			d.Misconfigured += "; rate ignored too"
		}
		return
	}
	cost, ok := Cost(units, in.Rate)
	if !ok {
		*d = Decision{Outcome: Invalid, Detail: fmt.Sprintf("quantity: the cost of %d units of %s at %d/%d micro-credits would pass 64 bits",
			units, ev.Meter, in.Rate.MicroCredits, in.Rate.PerUnits)}
		return
	}
	d.Cost = cost
	need := cost
	for i, g := range p.Grants {
		if need == 0 {
			break
		}
		if ev.EventTime < g.EffectiveFrom || ev.EventTime >= expiry(g) {
			continue
		}
		gen := p.gen(i)
		used := consumedOf(in.uses, g.ID, gen)
		if in.Consumed != nil {
			used = in.Consumed(g.ID)
		}
		left := g.Amount - used
		if left <= 0 {
			continue
		}
		take := min(left, need)
		d.Draws = append(d.Draws, Draw{Grant: g.ID, Amount: take, gen: gen})
		need -= take
	}
	if need == 0 {
		return
	}
	od := p.Overdraft
	switch {
	case od.Policy != schemas.OverdraftAllow:
		*d = Decision{Outcome: NoCredit, Detail: fmt.Sprintf("%s: costs %d micro-credits, the grants of plan %q can pay %d, and overdraft is denied",
			ev.Meter, cost, p.Name, cost-need)}
		return
	case od.Limit > 0 && need > od.Limit-in.Overdrawn:
		*d = Decision{Outcome: NoCredit, Detail: fmt.Sprintf("%s: costs %d micro-credits, the grants of plan %q can pay %d, and overdrawing %d more would pass the overdraft limit %d (overdrawn %d)",
			ev.Meter, cost, p.Name, cost-need, need, od.Limit, in.Overdrawn)}
		return
	case need > math.MaxInt64-in.Overdrawn:
		*d = Decision{Outcome: Invalid, Detail: fmt.Sprintf("quantity: the overdraft in the period would pass 64 bits (%d + %d)", in.Overdrawn, need)}
		return
	}
	d.Overdraft = need
}

// overLimitDetail is an OverLimit decision's Detail, as
// fmt.Sprintf("%s: usage in the period %d + %d would pass the cap %d of
// plan %q", …) makes it, in one allocation: about one event in twenty is
// refused this way in a capped run. It is built on the stack, and the
// plan quoted by hand when quoting leaves it as it is (printable ASCII,
// no quote or backslash).
func overLimitDetail(meter string, usage, units, limit int64, plan string) string {
	var buf [192]byte
	b := append(buf[:0], meter...)
	b = append(b, ": usage in the period "...)
	b = strconv.AppendInt(b, usage, 10)
	b = append(b, " + "...)
	b = strconv.AppendInt(b, units, 10)
	b = append(b, " would pass the cap "...)
	b = strconv.AppendInt(b, limit, 10)
	b = append(b, " of plan "...)
	return string(appendQuoted(b, plan))
}

// appendQuoted appends strconv.Quote(s) to b.
func appendQuoted(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < ' ' || c > '~' || c == '"' || c == '\\' {
			return strconv.AppendQuote(b, s)
		}
	}
	return append(append(append(b, '"'), s...), '"')
}
