package ingest

import (
	"fmt"
	"net/http"
	"slices"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/meterline/meterline/entitlements"
	"github.com/meterline/meterline/schemas"
)

// The advisory quota gate (docs/ingest.md, The quota gate). It is a
// courtesy, not the decision: the aggregator decides every event exactly
// once (docs/entitlements.md, The aggregator). The gate answers 402 only
// when it is sure of the aggregator's answer for every usage event of the
// request, and lets the request through in every other case (fail open):
//
//   - the view of usage.balances is loaded (Balances.Loaded);
//   - for every usage event: its customer has a balance younger than
//     Config.GateMaxAge (Balances: the age is in broker time) whose caps
//     are still in effect (the broker time now is before its caps_until,
//     if it has one), the customer is not unmetered, the event's own event_time is in the
//     balance's period [period_start, period_end), and its meter has a cap
//     with on_limit REJECT that the event would take past its limit, as
//     the aggregator decides it (SUM adds the quantity, COUNT one; a
//     meter of another aggregation is not capped; an event landing exactly
//     on the cap is accepted). The aggregation is the ingest's meters
//     file's: a meter it does not declare is let through, since the
//     aggregator's file may make it a COUNT.
//
// A request refused is answered with nothing sent; each of its events is
// counted (meterline_ingest_gate_refused_events_total, by tenant) and the
// request is logged with the index, customer and meter of its first
// refused events (gateLogEvents), and how many more there are.

// gateLogEvents is how many refused events the line of a 402 names.
const gateLogEvents = 10

// gateRefusal is one usage event the gate refuses.
type gateRefusal struct {
	index    int
	customer string
	meter    string
}

func (g gateRefusal) MarshalLogObject(enc zapcore.ObjectEncoder) error {
	enc.AddInt("index", g.index)
	enc.AddString("customer_id", g.customer)
	enc.AddString("meter", g.meter)
	return nil
}

type gateRefusals []gateRefusal

func (gs gateRefusals) MarshalLogArray(enc zapcore.ArrayEncoder) error {
	for _, g := range gs {
		if err := enc.AppendObject(g); err != nil {
			return err
		}
	}
	return nil
}

// gateCheck returns the errors of a 402 when the gate refuses every usage
// event of the request, or nil to let it through. A request let through
// costs no allocation: every event is checked before anything is built.
func (s *Server) gateCheck(req *request) ([]EventError, gateRefusals) {
	b := s.balances
	if b == nil || len(req.usages) == 0 || !b.isLoaded() {
		return nil, nil
	}
	for k := range req.usages {
		if _, ok := s.overCap(&req.usages[k].ue); !ok {
			return nil, nil
		}
	}
	errs := make([]EventError, 0, len(req.usages))
	refused := make(gateRefusals, 0, len(req.usages))
	for k := range req.usages {
		u := &req.usages[k]
		// The view may have changed since the first pass: still fail open.
		oc, ok := s.overCap(&u.ue)
		if !ok {
			return nil, nil
		}
		errs = append(errs, EventError{Index: u.input, Field: u.mm.field("meter"), Code: schemas.ReasonOverLimit, Reason: oc.reason(&u.ue)})
		refused = append(refused, gateRefusal{u.input, u.ue.CustomerID, u.ue.Meter})
	}
	return errs, refused
}

// overCapEvent is why the gate refuses an event: its balance, its meter's
// and the units it would add.
type overCapEvent struct {
	bal   *schemas.Balance
	mb    schemas.MeterBalance
	units int64
}

func (o overCapEvent) reason(ue *schemas.UsageEvent) string {
	return fmt.Sprintf("meter %s: %d of the limit %d already used in the period %s (plan %q, balance as of %s); adding %d would pass it, and the plan rejects usage past it",
		ue.Meter, o.mb.Usage, o.mb.Limit, describePeriod(o.bal.PeriodStart, o.bal.PeriodEnd), o.bal.Plan,
		time.UnixMilli(o.bal.UpdatedAt).UTC().Format(time.RFC3339), o.units)
}

// overCap reports whether the balances say the aggregator will refuse
// the event over_limit, and why (see the rules above). It does not
// allocate.
func (s *Server) overCap(ue *schemas.UsageEvent) (overCapEvent, bool) {
	bal, ok := s.balances.Trusted(ue.CustomerID, s.cfg.GateMaxAge)
	if !ok || bal.Unmetered || ue.EventTime < bal.PeriodStart || ue.EventTime >= bal.PeriodEnd {
		return overCapEvent{}, false
	}
	i := slices.IndexFunc(bal.Meters, func(m schemas.MeterBalance) bool { return m.Meter == ue.Meter })
	if i < 0 || bal.Meters[i].OnLimit != schemas.OnLimitReject {
		return overCapEvent{}, false
	}
	mb := bal.Meters[i]
	// The balance does not carry the meter's aggregation: the ingest's
	// meters file must. A meter it does not declare may be a COUNT in the
	// aggregator's, which adds 1, not the quantity: not sure, let through.
	m, declared := s.cfg.Meters.Lookup(ue.Meter)
	if !declared || !entitlements.Charged(string(m.Aggregation)) {
		return overCapEvent{}, false
	}
	units := entitlements.Event{Meter: ue.Meter, Aggregation: string(m.Aggregation), Quantity: ue.Quantity}.Units()
	if units < 0 || !entitlements.PassesCap(mb.Usage, units, mb.Limit) {
		return overCapEvent{}, false
	}
	return overCapEvent{bal: bal, mb: mb, units: units}, true
}

// answerGate answers a request the gate refuses: 402 with each refused
// event; it counts and logs them.
func (s *Server) answerGate(w http.ResponseWriter, req *request, errs []EventError, refused gateRefusals) {
	tenant := req.key.Tenant
	writeProblem(w, http.StatusPaymentRequired, "quota-exhausted", "Quota exhausted",
		fmt.Sprintf("every event of the request is for a meter whose limit is used up in the event's period, by the latest balances; nothing was sent (%d of %d events)",
			countIndexes(errs), req.inputs), errs, 0)
	s.metrics.gateRefused(tenant, req.inputs)
	s.metrics.refusedEvents(tenant, errs)
	// One line a request, which a client can send in a loop: bounded, and
	// so is each line, which names the first gateLogEvents refused events
	// (their number and customer IDs are the client's; the answer names
	// every one).
	if fs, ok := s.gateLog.allow(); ok {
		fs = append(fs, zap.String("tenant", tenant), zap.String("key_id", req.key.ID), zap.Int("events", req.inputs),
			zap.Array("refused", refused[:min(len(refused), gateLogEvents)]))
		if len(refused) > gateLogEvents {
			fs = append(fs, zap.Int("refused_not_listed", len(refused)-gateLogEvents))
		}
		s.log.Info("ingest: quota gate answered 402; nothing was sent", fs...)
	}
}
