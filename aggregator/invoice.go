package aggregator

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/internal/stream"
	"github.com/meterline/meterline/schemas"
)

// Invoice bounds (DESIGN §3, §8). The invoice quantity of a line, period B
// and aggregate key K, is K's FINAL value in B plus the deltas of the
// adjustments booked into B for K, which come from any number of earlier
// periods. Each of those is within 64 bits, their sum need not be: an
// event that would take its line's invoice quantity (or the sum of its
// adjustments) outside 64 bits is rejected (invalid), as an event that
// would wrap its aggregate is, so that the sum of a line's rows
// (invoice_lines in ClickHouse) never wraps.
//
// The state keeps, per line with adjustments, 'i' B K (invState): the sum
// of the deltas booked into B for K, and K's FINAL value in B once a late
// event of B is about to change B's working state ('f' B K), which held
// exactly the FINAL value until then. The line's base value, what the
// adjustments add to, is therefore: the recorded FINAL; else the working
// state 'f' B K (the FINAL, unchanged); else the OPEN aggregate 'a' B K
// (B not final yet, or its FINAL not emitted yet: every later change to it
// is checked against the adjustments, onTime); else 0. The keys expire
// with the period (expireChunk); a period that has them is decided final
// like one with aggregates (finalize), so that it expires.

// pfxInvoice: 'i' B K, invState.
const pfxInvoice = 'i'

// invState is a line's adjustments and, once recorded, its FINAL value.
type invState struct {
	adj      int64
	final    int64
	hasFinal bool
}

func (s invState) encode() []byte {
	b := binary.AppendVarint(make([]byte, 0, 2*binary.MaxVarintLen64), s.adj)
	if s.hasFinal {
		b = binary.AppendVarint(b, s.final)
	}
	return b
}

func decodeInvState(b []byte) (invState, error) {
	var s invState
	v, n := binary.Varint(b)
	if n <= 0 {
		return s, errors.New("aggregator: corrupt invoice state")
	}
	s.adj, b = v, b[n:]
	if len(b) == 0 {
		return s, nil
	}
	if v, n = binary.Varint(b); n <= 0 || n != len(b) {
		return s, errors.New("aggregator: corrupt invoice state")
	}
	s.final, s.hasFinal = v, true
	return s, nil
}

// addOK returns a+b and whether it is within 64 bits.
func addOK(a, b int64) (int64, bool) {
	s := a + b
	return s, (b >= 0) == (s >= a)
}

func (pt *partition) loadInvoice(tx stateReader, start int64, ak []byte) (invState, error) {
	// The key is built in a scratch buffer: an OPEN aggregate loaded
	// into the cache reads it (openAggregate).
	k := append(pt.ikBuf[:0], pfxInvoice)
	k = binary.BigEndian.AppendUint64(k, uint64(start))
	k = append(k, ak...)
	pt.ikBuf = k
	v, ok, err := tx.Get(k)
	if err != nil || !ok {
		return invState{}, err
	}
	return decodeInvState(v)
}

// lineBase returns the value the adjustments of line (start, ak) add to
// (see above).
func (pt *partition) lineBase(tx *stream.Tx, start int64, ak []byte, inv invState) (int64, error) {
	if inv.hasFinal {
		return inv.final, nil
	}
	ok := periodKey(pfxOpen, start, ak)
	if a, cached := pt.open[string(ok)]; cached {
		return a.st.Value, nil
	}
	for _, k := range [][]byte{ok, periodKey(pfxFinal, start, ak)} {
		st, found, err := pt.loadState(tx, k)
		if err != nil {
			return 0, err
		}
		if found {
			return st.Value, nil
		}
	}
	return 0, nil
}

// recordFinal records, before a late event changes the working state of
// period start (st as loaded; found: it exists), the FINAL value it held.
func (pt *partition) recordFinal(tx *stream.Tx, start int64, ak []byte, st *aggState, found bool) error {
	inv, err := pt.loadInvoice(tx, start, ak)
	if err != nil || inv.hasFinal {
		return err
	}
	inv.hasFinal = true
	if found {
		inv.final = st.Value
	}
	tx.Put(periodKey(pfxInvoice, start, ak), inv.encode())
	return nil
}

// bookInvoice checks that delta, booked into period bStart for ak, keeps
// the line's adjustments and invoice quantity within 64 bits, and records
// it; ok is false when it would not (nothing is written then).
func (pt *partition) bookInvoice(tx *stream.Tx, bStart int64, ak []byte, delta int64) (inv invState, base int64, ok bool, err error) {
	if inv, err = pt.loadInvoice(tx, bStart, ak); err != nil {
		return inv, 0, false, err
	}
	if base, err = pt.lineBase(tx, bStart, ak, inv); err != nil {
		return inv, 0, false, err
	}
	adj, ok1 := addOK(inv.adj, delta)
	_, ok2 := addOK(base, adj)
	if !ok1 || !ok2 {
		return inv, base, false, nil
	}
	if delta == 0 {
		return inv, base, true, nil
	}
	inv.adj = adj
	tx.Put(periodKey(pfxInvoice, bStart, ak), inv.encode())
	if a, cached := pt.open[string(periodKey(pfxOpen, bStart, ak))]; cached {
		a.adj = adj
	}
	if _, end := pt.bounds(bStart); pt.finals[bStart] == nil && pt.wm > end+pt.pr.cfg.Grace.Milliseconds() {
		// Booked into a period final by the watermark that has no marker
		// here (an event that kept an old arrival): marked, so that its
		// key expires with it.
		pt.markFinal(tx, bStart)
	}
	return inv, base, true, nil
}

// rejectInvoiceOverflow rejects an event whose contribution to the invoice
// line of period bStart would take it outside 64 bits.
func (pt *partition) rejectInvoiceOverflow(tx *stream.Tx, r *kgo.Record, e *schemas.DedupedEvent, m *Meter, bStart int64, base, adj, change int64) error {
	return pt.reject(tx, r, e, schemas.ReasonInvalid, fmt.Sprintf(
		"quantity: %d would overflow the invoice quantity of %s/%s for period %s (value %d, adjustments %d, change %d); sums never wrap",
		e.Quantity, e.CustomerID, e.Meter, msTime(bStart), base, adj, change))
}

// checkOpenInvoice rejects an on-time event that would take its OPEN
// aggregate a, plus the adjustments booked into its period for its key
// (a.adj), outside 64 bits; rejected reports it. Nothing of the event is
// recorded before (a fresh aggregate leaves the cache again).
func (pt *partition) checkOpenInvoice(tx *stream.Tx, r *kgo.Record, e *schemas.DedupedEvent, m *Meter, a *openAgg, fresh bool, ak []byte, uval string) (bool, error) {
	isNew := false
	if m.Aggregation == UniqueCount {
		if _, seen := a.seen[uval]; !seen {
			var err error
			if isNew, err = pt.uniqueIsNew(tx, a.start, ak, uval); err != nil {
				return false, err
			}
		}
	}
	next := a.st
	apply(&next, fresh, e, m, isNew)
	if _, ok := addOK(next.Value, a.adj); ok {
		return false, nil
	}
	if fresh {
		pt.drop(string(a.key), a)
		pt.keys--
	}
	return true, pt.rejectInvoiceOverflow(tx, r, e, m, a.start, a.st.Value, a.adj, next.Value-a.st.Value)
}
