package aggregator

import (
	"fmt"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/meterline/meterline/entitlements"
	"github.com/meterline/meterline/internal/fault"
	"github.com/meterline/meterline/internal/stream"
	"github.com/meterline/meterline/schemas"
)

// decideEvent decides an event's entitlements (docs/entitlements.md, The
// aggregator, 3); it reports whether the event goes on to be counted. A
// rejected event goes to usage.rejected and changes nothing else. An
// accepted event's charge is returned, not yet recorded: the caller commits
// it once the event's aggregate has taken the event.
func (pt *partition) decideEvent(tx *stream.Tx, r *kgo.Record, e *schemas.DedupedEvent, m *Meter) (*charge, bool, error) {
	l := pt.pr.ledger
	// The partition's charge, reused: an event's charge is committed or
	// dropped before the next event is decided. Its decision is written
	// whole by EvaluateInto, which reuses its Draws; the other fields are
	// set here, field by field, the decision left alone.
	ch := &pt.charge
	if ch.pt != pt || ch.tx != tx {
		// Written only when they change: pointer writes, each with its
		// write barrier while the collector runs, per event otherwise.
		ch.pt, ch.tx = pt, tx
	}
	ch.customer = e.CustomerID
	// Its event too, every field of it: a composite literal would be
	// built in a temporary and copied.
	ev := &ch.ev
	// The catalog's name, equal to the event's: the account keeps the
	// string of a meter's first event, so that its lookups of the meter
	// compare the same string, not equal bytes.
	meter := m.Name
	if m == undeclared {
		meter = e.Meter
	}
	ev.Meter, ev.Aggregation, ev.Quantity = meter, string(m.Aggregation), e.Quantity
	ev.EventTime, ev.Arrival, ev.Undeclared = e.EventTime, e.IngestTime, m == undeclared
	if err := l.EvaluateInto(pt.ledger(tx), e.CustomerID, &ch.ev, &ch.d); err != nil {
		return nil, false, fmt.Errorf("aggregator: partition %d: entitlements of %s: %w", pt.p, e.CustomerID, err)
	}
	d := &ch.d
	if e := pt.ent; e.label == "" || e.labelPlan != d.Plan {
		e.labelPlan, e.label = d.Plan, pt.pr.plans.label(d.Plan)
	}
	if ch.label != pt.ent.label {
		ch.label = pt.ent.label
	}
	// Guarantee: the decision and its charge are in the open transaction
	// only; a crash here aborts both, and the event is decided again from
	// the committed balance.
	fault.Hit(fault.ChargeDecided)
	if d.Outcome != entitlements.Accepted {
		pt.ent.pending.add(d.Outcome.String(), ch.label, 0)
		return nil, false, pt.reject(tx, r, e, d.Outcome.Reason(), d.Detail)
	}
	if d.Misconfigured != "" && !pt.ent.warned[e.Meter] {
		// Once per meter and partition: the same cap or rate would
		// otherwise log with each of the meter's events.
		if pt.ent.warned == nil {
			pt.ent.warned = map[string]bool{}
		}
		pt.ent.warned[e.Meter] = true
		pt.pr.log.Warn("entitlements misconfigured for a meter (said once per meter and partition)", zap.String("meter", e.Meter),
			zap.Int32("partition", pt.p), zap.String("detail", d.Misconfigured))
	}
	return ch, true, nil
}

// charge is an accepted event's charge (Ledger.Evaluate's decision), held
// until its aggregate takes the event.
type charge struct {
	pt       *partition
	tx       *stream.Tx
	customer string
	ev       entitlements.Event
	d        entitlements.Decision
	label    string
}

// commit records the charge in the customer's account (Ledger.Record: in
// the partition's accounts, written to the transaction by Flush), and
// counts it.
func (ch *charge) commit() error {
	pt := ch.pt
	if err := pt.pr.ledger.RecordDecided(pt.ledger(ch.tx), ch.customer, &ch.ev, &ch.d); err != nil {
		return fmt.Errorf("aggregator: partition %d: entitlements of %s: %w", pt.p, ch.customer, err)
	}
	e := pt.ent
	e.pending.add(entitlements.Accepted.String(), ch.label, ch.d.Cost)
	// changed[customer] = max(changed[customer], arrival), looked up
	// only when the customer's entry does not know where changed keeps
	// its time.
	h := e.held(ch.customer)
	if h != nil && e.changedGen != 0 && h.chGen == e.changedGen {
		if at := &e.changedAt[h.chIdx]; ch.ev.Arrival > *at {
			*at = ch.ev.Arrival
		}
		return nil
	}
	i := e.change(ch.customer, ch.ev.Arrival)
	if h != nil {
		h.chIdx, h.chGen = i, e.changedGen
	}
	return nil
}

// change notes that customer c changed at time t: changed[c] =
// max(changed[c], t), a customer not in changed counting as 0. It
// returns the index of c's time in changedAt.
func (e *entPart) change(c string, t int64) int {
	i, ok := e.changed[c]
	if !ok {
		i = len(e.changedAt)
		e.changed[c] = i
		e.changedAt = append(e.changedAt, max(0, t))
		return i
	}
	e.changedAt[i] = max(e.changedAt[i], t)
	return i
}

// clearChanged empties changed, and so forgets every entry's index into
// it (changedGen).
func (e *entPart) clearChanged() {
	clear(e.changed)
	e.changedAt = e.changedAt[:0]
	e.changedGen++
}

// refund takes back the charge of a queued event that its booking
// refused (bookChunk): its decision accepted and charged it when it was
// queued, in an earlier transaction, and counted it as accepted; the
// refund is counted by the plan in effect at its arrival, as its decision
// was. The customer's balance goes out as for any change.
func (pt *partition) refund(tx *stream.Tx, e *schemas.DedupedEvent, charge []byte) error {
	ev := entitlements.Event{Meter: e.Meter, Quantity: e.Quantity, EventTime: e.EventTime, Arrival: e.IngestTime}
	st := pt.ledger(tx)
	cost, err := pt.pr.ledger.Refund(st, e.CustomerID, ev, charge)
	var plan *entitlements.Plan
	if err == nil {
		plan, err = pt.pr.ledger.PlanAt(st, e.CustomerID, e.IngestTime)
	}
	if err != nil {
		return fmt.Errorf("aggregator: partition %d: refund the charge of %s's queued event %s: %w", pt.p, e.CustomerID, e.EventID, err)
	}
	pt.ent.pending.refund(pt.pr.plans.label(plan), cost)
	pt.ent.change(e.CustomerID, e.IngestTime)
	pt.pr.log.Info("charge of a queued event refunded: its booking rejected it", zap.Int32("partition", pt.p),
		zap.String("customer", e.CustomerID), zap.String("event_id", e.EventID))
	return nil
}
