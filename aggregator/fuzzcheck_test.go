package aggregator

import (
	"fmt"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/schemas"
)

// The checks of FuzzAggregatorRecord.

// aggReasons are the reason codes the aggregator raises for records of
// usage.deduped and usage.entitlements (docs/entitlements.md, Rejections).
var aggReasons = map[string]bool{schemas.ReasonUndecodable: true, schemas.ReasonUnknownSchema: true, schemas.ReasonInvalid: true,
	schemas.ReasonUnknownMeter: true, schemas.ReasonOverLimit: true, schemas.ReasonNoCredit: true}

// check decodes a committed output and keeps what the end checks need.
func (h *aggFuzz) check(o *kgo.Record) {
	t := h.t
	switch o.Topic {
	case h.names.AggregatesTopic():
		var a schemas.Aggregate
		if err := schemas.DecodeInto(o.Value, &a); err != nil {
			t.Fatalf("an aggregate does not decode: %v", err)
		}
		k := aggFuzzKey(a.CustomerID, a.Meter, a.PeriodStart)
		if prev := h.last[k]; prev != nil && (a.Revision <= prev.Revision || prev.Status == schemas.StatusFinal) {
			t.Fatalf("aggregate %s: revision %d %s after revision %d %s", k, a.Revision, a.Status, prev.Revision, prev.Status)
		}
		h.last[k] = &a
	case h.names.AdjustmentsTopic():
		var a schemas.Adjustment
		if err := schemas.DecodeInto(o.Value, &a); err != nil {
			t.Fatalf("an adjustment does not decode: %v", err)
		}
		h.decided(a.EventID, "an adjustment")
		h.adjusted[a.EventID] = &a
	case h.names.RejectedTopic():
		var rj schemas.Rejected
		if err := schemas.DecodeInto(o.Value, &rj); err != nil {
			t.Fatalf("a rejection does not decode: %v", err)
		}
		h.checkRejected(&rj)
	case h.names.BalancesTopic():
		var b schemas.Balance
		if err := schemas.DecodeInto(o.Value, &b); err != nil {
			t.Fatalf("a balance does not decode: %v", err)
		}
		h.checkBalance(&b)
		h.balances = append(h.balances, &b)
	case h.names.EntitlementsTopic():
		// A restated record or a tick: nothing to count.
	default:
		t.Fatalf("an output to %s", o.Topic)
	}
}

func aggFuzzKey(c, m string, start int64) string { return fmt.Sprintf("%s/%s/%d", c, m, start) }

// decided records that an event was decided by a rejection or an
// adjustment: once.
func (h *aggFuzz) decided(id, what string) {
	if h.events[id] == nil {
		h.t.Fatalf("%s of event %q, which the program did not give", what, id)
	}
	if r, ok := h.rejections[id]; ok {
		h.t.Fatalf("%s of event %q, rejected before (%s)", what, id, r)
	}
	if _, ok := h.adjusted[id]; ok {
		h.t.Fatalf("%s of event %q, booked as an adjustment before", what, id)
	}
}

func (h *aggFuzz) checkRejected(rj *schemas.Rejected) {
	t := h.t
	if !aggReasons[rj.Reason] || rj.Stage != "aggregator" || rj.Detail == "" {
		t.Fatalf("rejection with reason %q, stage %q, detail %q", rj.Reason, rj.Stage, rj.Detail)
	}
	switch {
	case rj.EventID != "":
		h.decided(rj.EventID, "a rejection ("+rj.Reason+": "+rj.Detail+")")
		h.rejections[rj.EventID] = rj.Reason
	case rj.SourceTopic == h.names.DedupedTopic() && h.badEvents[rj.SourceOffset]:
		h.badRej[rj.SourceOffset]++
	case rj.SourceTopic == h.names.EntitlementsTopic():
	default:
		t.Fatalf("a rejection (%s: %s) of %s offset %d, which is no malformed record", rj.Reason, rj.Detail, rj.SourceTopic, rj.SourceOffset)
	}
}

// mayApply returns the plans that may apply to customer c: its own valid
// records and the default plan's.
func (h *aggFuzz) mayApply(c string) []*schemas.Entitlements {
	var ps []*schemas.Entitlements
	for _, e := range append(append([]*schemas.Entitlements(nil), h.plans[c]...), h.plans[""]...) {
		if e != nil {
			ps = append(ps, e)
		}
	}
	return ps
}

// capBound returns the largest limit of the caps on meter m that reject,
// if every plan that may apply to c has one and none is unmetered.
func (h *aggFuzz) capBound(c, m string) (int64, bool) {
	bound := int64(-1)
	for _, e := range h.mayApply(c) {
		if e.Unmetered {
			return 0, false
		}
		found := false
		for _, cp := range e.Caps {
			if cp.Meter == m && cp.OnLimit == schemas.OnLimitReject {
				found, bound = true, max(bound, cp.Limit)
			}
		}
		if !found {
			return 0, false
		}
	}
	return bound, bound >= 0
}

// overdraftBound returns the largest overdraft the plans that may apply
// to c allow, if every one denies it or limits it.
func (h *aggFuzz) overdraftBound(c string) (int64, bool) {
	bound := int64(0)
	for _, e := range h.mayApply(c) {
		switch {
		case e.Overdraft.Policy == schemas.OverdraftDeny:
		case e.Overdraft.Limit > 0:
			bound = max(bound, e.Overdraft.Limit)
		default:
			return 0, false
		}
	}
	return bound, true
}

func (h *aggFuzz) checkBalance(b *schemas.Balance) {
	t := h.t
	for _, g := range b.Grants {
		if g.Remaining < 0 || g.Consumed < 0 || g.Consumed > h.grantMax[g.ID] {
			t.Fatalf("balance of %s (revision %d): grant %s consumed %d, remaining %d, amount %d; the largest amount written %d",
				b.CustomerID, b.Revision, g.ID, g.Consumed, g.Remaining, g.Amount, h.grantMax[g.ID])
		}
	}
	if bound, ok := h.overdraftBound(b.CustomerID); b.Overdrawn < 0 || ok && b.Overdrawn > bound {
		t.Fatalf("balance of %s (revision %d): overdrawn %d; the plans that may apply allow %d (bounded: %v)",
			b.CustomerID, b.Revision, b.Overdrawn, bound, ok)
	}
	for _, m := range b.Meters {
		if bound, ok := h.capBound(b.CustomerID, m.Meter); ok && m.OnLimit == schemas.OnLimitReject && m.Usage > bound {
			t.Fatalf("balance of %s (revision %d): usage %d of %s past the largest cap %d that rejects", b.CustomerID, b.Revision,
				m.Usage, m.Meter, bound)
		}
	}
}

// checkEnd checks, once the program ended, the gate emptied and the work
// is done, that every event was decided once and within its caps.
func (h *aggFuzz) checkEnd() {
	t := h.t
	for off := range h.badEvents {
		if h.badRej[off] != 1 {
			t.Fatalf("the malformed record at offset %d of usage.deduped rejected %d times", off, h.badRej[off])
		}
	}
	counted := map[string]int64{}
	units := map[afUnitKey]int64{}
	for id, e := range h.events {
		start, _ := Hour.Bounds(e.EventTime)
		k := aggFuzzKey(e.CustomerID, e.Meter, start)
		if _, ok := h.rejections[id]; ok {
			continue
		}
		uk := afUnitKey{e.CustomerID, e.Meter, start}
		if e.Meter == "c" {
			units[uk]++
		} else {
			units[uk] += e.Quantity
		}
		if a := h.adjusted[id]; a != nil {
			if a.OriginalPeriodStart != start || a.CustomerID != e.CustomerID || a.Meter != e.Meter || a.Quantity != e.Quantity {
				t.Fatalf("event %s %+v booked as adjustment %+v", id, e, a)
			}
			continue
		}
		counted[k]++
		if h.last[k] == nil {
			t.Fatalf("event %s %+v neither rejected, nor booked as an adjustment, nor in an aggregate", id, e)
		}
	}
	for k, a := range h.last {
		if a.EventCount != counted[k] {
			t.Fatalf("aggregate %s: last revision %d (%s) counts %d events, %d were neither rejected nor adjustments", k,
				a.Revision, a.Status, a.EventCount, counted[k])
		}
	}
	for k, u := range units {
		if bound, ok := h.capBound(k.c, k.m); ok && u > bound {
			t.Fatalf("%s of %s in the period of %s: %d units accepted, the largest cap that rejects is %d", k.m, k.c, msTime(k.start), u, bound)
		}
	}
}

type afUnitKey struct {
	c, m  string
	start int64
}

// aggFuzzSeeds are the seed programs of FuzzAggregatorRecord.
func aggFuzzSeeds() [][]byte {
	ev := func(c, m, q, step, off byte) []byte { return []byte{afEvent, c, m, q, step, off} }
	tick := func(step byte) []byte { return []byte{afTick, step} }
	wm := func(step, lag byte) []byte { return []byte{afWatermark, step, lag} }
	cat := func(parts ...[]byte) []byte {
		var b []byte
		for _, p := range parts {
			b = append(b, p...)
		}
		return b
	}
	return [][]byte{
		// Events under and past the default plan's caps, an abort
		// processed again, a restore.
		cat(ev(0, 0, 5, 1, 0), ev(0, 0, 6, 0, 0), ev(0, 1, 1, 0, 0), tick(1), []byte{afAbort}, ev(0, 0, 6, 1, 0), tick(1),
			[]byte{afCommit}, ev(1, 1, 2, 1, 0), ev(1, 1, 2, 0, 0), ev(1, 1, 2, 0, 0), ev(1, 1, 2, 0, 0), ev(1, 1, 2, 0, 0), tick(1),
			[]byte{afRestore}, ev(1, 0, 7, 1, 0), tick(1), []byte{afAbort, afCommit}),
		// A customer's plan with grants and an overdraft limit, a rate
		// change, events across periods, watermarks past end + grace,
		// late events (adjustments), a restore in between.
		cat([]byte{afPlan, 0, 0x95, 0x42 | 0x10, 4, 0x01, 1}, []byte{afRates, 0x13, 5, 30, 1}, ev(0, 0, 3, 2, 0), ev(0, 1, 0, 2, 0),
			tick(3), []byte{afCommit}, wm(200, 0), ev(0, 0, 4, 200, 0), tick(1), []byte{afCommit}, wm(100, 0), tick(1),
			[]byte{afRestore}, ev(0, 0, 2, 1, 0xd0), ev(0, 1, 1, 1, 0xc0), tick(2), []byte{afAbort}, []byte{afWork, afCommit},
			wm(150, 0), ev(0, 0, 7, 1, 0x90), tick(1), []byte{afWork, afAbort, afCommit}),
		// Unmetered, a deletion, a scheduled plan, the default plan
		// replaced, overdraft allowed, zero and huge quantities.
		cat([]byte{afPlan, 1, 0x00, 0x00, 2, 0xc0, 0}, ev(1, 0, 7, 1, 0), ev(1, 0, 7, 0, 0), tick(1), []byte{afDelete, 1},
			ev(1, 0, 0, 1, 0), tick(1), []byte{afPlan, 3, 0x3d, 0x62, 0, 0x25, 3}, ev(2, 0, 7, 1, 0), ev(2, 1, 0, 2, 0), tick(90),
			ev(2, 0, 6, 1, 0), tick(1), []byte{afRestore, afAbort}, wm(250, 2), tick(1), []byte{afCommit}),
		// Malformed records of both topics, a watermark before the gate
		// opens, an abort across Work.
		cat([]byte{afMalformed, 0, 3, 1, 2, 3}, []byte{afMalformed, 1, 2, 9, 9}, ev(2, 1, 1, 1, 0), wm(0, 0),
			[]byte{afAbort}, tick(1), []byte{afCommit}, wm(250, 0), tick(1), []byte{afWork, afAbort, afWork, afCommit},
			[]byte{afRestore}, ev(2, 1, 1, 1, 0x80), tick(1)),
		// Many events of one customer, periods passing, chunks of FINALs.
		func() []byte {
			var b []byte
			for i := range 24 {
				b = append(b, ev(byte(i), byte(i/3), byte(i%5), 40, byte(-i*3))...)
				switch i % 6 {
				case 2:
					b = append(b, tick(1)...)
					b = append(b, afCommit)
				case 4:
					b = append(b, wm(1, 1)...)
					b = append(b, tick(1)...)
				case 5:
					b = append(b, afRestore, afWork)
				}
			}
			return b
		}(),
	}
}
