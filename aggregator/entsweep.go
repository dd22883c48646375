package aggregator

import (
	"encoding/binary"
	"errors"

	"github.com/meterline/meterline/internal/stream"
)

// sweepState is the balances sweep of a default-plan record (keyDefSweep):
// the default plan is every customer's without a plan of its own, so a
// record of it changes the balance of customers no record of theirs
// names, and whose last balance, read by the ingest's quota gate, shows
// the caps before it, without a caps_until for it (docs/ingest.md, The
// quota gate). Every customer of the partition with usage in the period
// of the record's read time therefore gets a balance as of that time, in
// chunks of Config.FinalChunk, Work's transactions, in key order with a
// cursor (docs/design.md, Exactly-once, 7): the new caps, or, for a change
// scheduled for later, the caps until then and caps_until its
// effective_from.
//
// Every default-plan record applied starts one, whatever it changes: the
// balance shows the plan's name, grants and overdraft as well as its
// caps, so a record that leaves the caps alone changes the balances all
// the same; such records are an operator's (meterline entitlements
// set-default), and a sweep costs at most one balance per customer with
// usage in the period. A second record read while one is going on starts
// it again from the first customer, with the second's read time: the
// customers the first reached got a balance without the second's change.
type sweepState struct {
	active bool
	// since is the read time of the record (the partition's broker time
	// once it was applied): the balances go out as of it, and a customer
	// whose balance went out as of it or later since (balanceOutSince)
	// is skipped.
	since int64
	// period is the start of the period whose customers it reaches.
	period int64
	// cursor is the last customer of the period it reached.
	cursor string
}

// keyDefSweep holds the sweep under way; none when idle.
var keyDefSweep = []byte("D")

func (s *sweepState) encode() []byte {
	b := binary.BigEndian.AppendUint64(nil, uint64(s.since))
	b = binary.BigEndian.AppendUint64(b, uint64(s.period))
	return append(b, s.cursor...)
}

func decodeSweep(v []byte) (sweepState, error) {
	if len(v) < 16 {
		return sweepState{}, errors.New("aggregator: corrupt default-plan sweep state")
	}
	return sweepState{active: true, since: int64(binary.BigEndian.Uint64(v)), period: int64(binary.BigEndian.Uint64(v[8:])),
		cursor: string(v[16:])}, nil
}

// startSweep starts the sweep of a default-plan record read at since, in
// the transaction that applies it, in place of any under way. With no
// customer with usage in the period (a new partition reading its first
// default plan), there is none: Work would commit a transaction for
// nothing.
func (pt *partition) startSweep(tx *stream.Tx, since int64) error {
	e := pt.ent
	start, _ := pt.bounds(max(pt.wm, since))
	cs, _, err := pt.pr.ledger.CustomersWithUsage(pt.ledger(tx), start, "", 1)
	switch {
	case err != nil:
		return err
	case len(cs) > 0:
		e.sweep = sweepState{active: true, since: since, period: start}
		tx.Put(keyDefSweep, e.sweep.encode())
	case e.sweep.active:
		e.sweep = sweepState{}
		tx.Delete(keyDefSweep)
	}
	return nil
}

// sweepChunk emits the balances of the sweep's next chunk of at most
// Config.FinalChunk customers, and about Config.FinalChunkBytes of
// balances (flushBalances: a pending one is no longer pending, and a
// customer goes out once a transaction), and ends the sweep after its last
// customer.
func (pt *partition) sweepChunk(tx *stream.Tx) error {
	s := &pt.ent.sweep
	cs, more, err := pt.pr.ledger.CustomersWithUsage(pt.ledger(tx), s.period, s.cursor, pt.pr.cfg.FinalChunk)
	if err != nil {
		return err
	}
	budget := pt.pr.cfg.FinalChunkBytes
	for i, c := range cs {
		if out, err := pt.balanceOutSince(tx, c, s.since); err != nil {
			return err
		} else if out {
			continue
		}
		pt.ent.emitNow[c] = max(pt.ent.emitNow[c], s.since)
		size, err := pt.balanceBytes(tx, c)
		if err != nil {
			return err
		}
		if budget -= size; budget <= 0 && i < len(cs)-1 {
			cs, more = cs[:i+1], true // the rest in the next chunk
			break
		}
	}
	if more && len(cs) > 0 {
		s.cursor = cs[len(cs)-1]
		tx.Put(keyDefSweep, s.encode())
	} else {
		*s = sweepState{}
		tx.Delete(keyDefSweep)
	}
	pt.txc.Inc(pt.pr.m.chunks.WithLabelValues("default_plan"))
	return nil
}
