package aggregator

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/meterline/meterline/entitlements"
	"github.com/meterline/meterline/internal/stream"
	"github.com/meterline/meterline/schemas"
)

// Headers of a record of usage.entitlements that the aggregator re-produced
// to its canonical partition (docs/entitlements.md, The aggregator, 1, as
// dedup's: docs/design.md, Event identity and keys).
const (
	// HeaderRerouted marks a re-produced record. Value:
	// "<partition>/<offset>" of the misrouted original.
	HeaderRerouted = "meterline-rerouted"
	// HeaderArrival carries the misrouted original's broker time (epoch
	// ms).
	HeaderArrival = "meterline-arrival"
	// HeaderMoved marks the delete (null value) the aggregator writes
	// after a misrouted customer's record, on the partition where it was
	// found, in the transaction that re-produces it: compaction then
	// removes the original there, and a delete of the customer on its
	// own partition is not undone, once compaction has removed that
	// delete too, by the original read again from the start. Value: the
	// original's offset. Found with a null value on another partition
	// than its customer's, it is skipped.
	HeaderMoved = "meterline-moved"
)

// entRecords handles records of usage.entitlements: each is applied to the
// Ledger (a tick only moves its read time), or rejected, or re-produced to
// its canonical partition; then the gate lets through what can now be
// decided.
func (pt *partition) entRecords(tx *stream.Tx, recs []*kgo.Record) error {
	l := pt.pr.ledger
	pt.ent.restates.reset()
	for _, r := range recs {
		written := r.Timestamp.UnixMilli()
		rec, err := entitlements.ParseRecord(r.Key, r.Value, written)
		switch {
		case err != nil:
			pt.ent.pending.record("rejected")
			if err := pt.reject(tx, r, nil, entitlements.Reason(err), err.Error()); err != nil {
				return err
			}
			if err := pt.restateRejected(tx, r); err != nil {
				return err
			}
		case rec.Key.Reserved == "" && schemas.Partition(r.Key, pt.pr.counts.entitlements) != pt.p:
			canon := schemas.Partition(r.Key, pt.pr.counts.entitlements)
			if IsMovedMark(r) {
				// The aggregator's own delete after a record it moved
				// (HeaderMoved): nothing to move.
				pt.ent.pending.record("moved_mark")
				break
			}
			if _, ok := headerValue(r, HeaderRerouted); ok {
				// Never re-routed twice (docs/entitlements.md, The
				// aggregator, 1): a copy is written to its canonical
				// partition, and the partition count never changes under a
				// state (checkPartitionCounts).
				pt.ent.pending.record("rejected")
				if err := pt.reject(tx, r, nil, schemas.ReasonInvalid, fmt.Sprintf("a record marked %s on partition %d of %s, not its customer's %d: never re-routed twice",
					HeaderRerouted, pt.p, r.Topic, canon)); err != nil {
					return err
				}
				break
			}
			// A client with another partitioner (docs/entitlements.md, The
			// aggregator, 1). It is re-produced now, with the original's
			// coordinates and broker time, and the canonical partition's
			// owner applies it from its new broker time (an effective_from
			// before that is raised to it): events decided there before it
			// was read are never reconsidered. How soon depends on how far
			// behind this partition is read. Read again from the start (a
			// new group, state rebuilt), it is re-produced again; that copy
			// changes nothing (staleCopy).
			tx.Emit(&kgo.Record{Topic: r.Topic, Partition: canon, Key: r.Key, Value: r.Value, Timestamp: pt.pr.now(),
				Headers: []kgo.RecordHeader{
					{Key: HeaderRerouted, Value: fmt.Appendf(nil, "%d/%d", r.Partition, r.Offset)},
					{Key: HeaderArrival, Value: strconv.AppendInt(nil, written, 10)},
				}})
			if r.Value != nil {
				// The original's key is deleted where it was found, so
				// that compaction removes the original there: only its
				// copy stays, on the customer's partition, where a
				// later record or delete of the customer supersedes it
				// for good (HeaderMoved).
				tx.Emit(&kgo.Record{Topic: r.Topic, Partition: pt.p, Key: r.Key, Timestamp: pt.pr.now(),
					Headers: []kgo.RecordHeader{{Key: HeaderMoved, Value: strconv.AppendInt(nil, r.Offset, 10)}}})
			}
			pt.ent.pending.record("rerouted")
			pt.pr.log.Info("entitlements record re-produced to its canonical partition", zap.Int32("partition", pt.p),
				zap.Int32("canonical_partition", canon), zap.Int64("offset", r.Offset))
		case rec.IsTick():
			pt.ent.pending.record("tick")
		default:
			if err := pt.applyEntRecord(tx, r, rec, written); err != nil {
				return err
			}
		}
		if err := l.Advance(pt.ledger(tx), written); err != nil {
			return err
		}
		pt.ent.lastRead, pt.ent.roundRead = written, min(pt.ent.roundRead, written)
	}
	pt.ent.restates.emit(tx)
	rt, err := l.ReadTo(pt.ledger(tx))
	if err != nil {
		return err
	}
	pt.ent.readTo = rt
	pt.pr.m.readTo.WithLabelValues(pt.pl).Set(float64(rt) / 1000)
	return pt.drain(tx)
}

// applyEntRecord applies a record of a customer, or a shared record
// (the default plan, the rate card), read from the partition's
// usage.entitlements, or rejects it when it is invalid: r is the record
// read, rec its parse and written its broker time.
func (pt *partition) applyEntRecord(tx *stream.Tx, r *kgo.Record, rec *entitlements.Record, written int64) (err error) {
	l := pt.pr.ledger
	okey := originKeyOf(rec.Key)
	from, stale, restate, err := pt.staleCopy(tx, r, okey)
	if err != nil {
		return err
	} else if stale {
		pt.ent.pending.record("rerouted_repeat")
		pt.pr.log.Info("re-produced entitlements record not applied: a record of its key that arrived after its original was read",
			zap.Int32("partition", pt.p), zap.Int64("offset", r.Offset), zap.String("key", string(okey[1:])),
			zap.Bool("restated", restate != nil))
		pt.ent.restates.set(okey, restate)
		return nil
	}
	// A record refused for too many versions of its key is refused alike
	// however far the partition has pruned (entitlements.Config.Span):
	// only the versions within W + B + S of its broker time count.
	if err = l.Apply(pt.ledger(tx), rec); err != nil {
		if !errors.Is(err, entitlements.ErrInvalid) {
			return fmt.Errorf("aggregator: partition %d: entitlements offset %d: %w", pt.p, r.Offset, err)
		}
		pt.ent.pending.record("rejected")
		if err := pt.reject(tx, r, nil, schemas.ReasonInvalid, err.Error()); err != nil {
			return err
		}
		return pt.restateRejected(tx, r)
	}
	pt.ent.pending.record("applied")
	pt.ent.restates.set(okey, nil)
	tx.Put(okey, from.encodeWith(r.Value))
	if rec.Key.Reserved == "" {
		// The record counts as read at the latest broker time read from
		// the partition (a broker clock that stepped back puts its own
		// earlier), and so does the balance it changes: as of its own
		// broker time, that balance would show the version before it.
		at, err := l.ReadTo(pt.ledger(tx))
		if err != nil {
			return err
		}
		pt.ent.change(rec.Key.Customer, max(written, at))
		if err := l.PruneCustomer(pt.ledger(tx), rec.Key.Customer, pt.pruneHorizon()); err != nil {
			return err
		}
	} else if err := l.PruneShared(pt.ledger(tx), pt.pruneHorizon()); err != nil {
		return err
	} else if rec.Key.Reserved == schemas.DefaultPlanKey {
		// It counts as read at the latest broker time read, as a
		// customer's record: its customers' balances go out as of it.
		at, err := l.ReadTo(pt.ledger(tx))
		if err != nil {
			return err
		}
		return pt.startSweep(tx, max(written, at))
	}
	return nil
}

// RecordOrigin orders the records of one customer's key by when they
// reached usage.entitlements: the broker time of the original (a copy's
// HeaderArrival, else its own), then the partition and offset of the
// original (ties: the order is arbitrary but the same for every reader).
type RecordOrigin struct {
	Arrival   int64
	Partition int32
	Offset    int64
}

// encodeWith is the value of an originKey: the origin (20 bytes), then
// the value of the record applied (1, then the value; 0: a tombstone).
func (o RecordOrigin) encodeWith(value []byte) []byte {
	b := make([]byte, 0, 21+len(value))
	b = binary.BigEndian.AppendUint64(b, uint64(o.Arrival))
	b = binary.BigEndian.AppendUint32(b, uint32(o.Partition))
	b = binary.BigEndian.AppendUint64(b, uint64(o.Offset))
	if value == nil {
		return append(b, 0)
	}
	return append(append(b, 1), value...)
}

// After reports whether o is later than p.
func (o RecordOrigin) After(p RecordOrigin) bool {
	switch {
	case o.Arrival != p.Arrival:
		return o.Arrival > p.Arrival
	case o.Partition != p.Partition:
		return o.Partition > p.Partition
	}
	return o.Offset > p.Offset
}

// OriginOf returns the origin of r, a record of usage.entitlements, and
// reports whether r is a copy the aggregator re-produced: its headers
// HeaderRerouted and HeaderArrival (each once, well formed) give the
// original's coordinates and broker time (at most maxArrival). Anything
// else is an ordinary record of its own origin.
//
// A copy's origin is its headers' alone, never capped at r's own broker
// time: every copy of one original (each group that reads it re-produces
// it, at its own time) and every restated record of an origin must order
// alike, and a copy is written after its original by a clock that may be
// behind the original's (another leader, a clock stepped back). Capped, a
// copy made early was older than the last record where a later group's
// was not: the running aggregator changed its decision when a new group
// started (TestDecideRecordModel). So a client that writes the
// headers can claim a later arrival: misrouted records of its customer
// that reached the topic before it are then skipped, nothing else.
func OriginOf(r *kgo.Record) (o RecordOrigin, copied bool) {
	own := RecordOrigin{Arrival: r.Timestamp.UnixMilli(), Partition: r.Partition, Offset: r.Offset}
	rv, ok1 := headerValue(r, HeaderRerouted)
	av, ok2 := headerValue(r, HeaderArrival)
	if !ok1 || !ok2 {
		return own, false
	}
	ps, os, cut := strings.Cut(string(rv), "/")
	p, err1 := strconv.ParseInt(ps, 10, 32)
	off, err2 := strconv.ParseInt(os, 10, 64)
	a, err3 := strconv.ParseInt(string(av), 10, 64)
	if !cut || err1 != nil || err2 != nil || err3 != nil || p < 0 || off < 0 || a < 0 || a > maxArrival {
		return own, false
	}
	return RecordOrigin{Arrival: a, Partition: int32(p), Offset: off}, true
}

// maxArrival is the latest arrival a copy can claim (9999-12-31, epoch
// ms): a record ordered after an origin (DecideRecord) is a millisecond
// later, which must not overflow.
const maxArrival = 253402300799999

// originKey is the state key of the origin and value of the last record
// of a customer's key applied ('o' customer; RecordOrigin.encodeWith).
func originKey(customer string) []byte { return append([]byte{pfxOrigin}, customer...) }

// originKeyOf is the state key of the origin and value of the last record
// of k applied: originKey of a customer's key, 'O' and the key of a shared
// one (written to every partition: each keeps its own).
func originKeyOf(k schemas.EntitlementsKey) []byte {
	if k.Reserved == "" {
		return originKey(k.Customer)
	}
	return append([]byte{pfxSharedOrigin}, k.Reserved...)
}

// IsMovedMark reports whether r is a delete the aggregator wrote after
// moving a misrouted record of r's key (HeaderMoved, a null value). On
// another partition than its customer's it is skipped, by the aggregator
// and `meterline entitlements get`; on the customer's own partition (a
// client wrote it there) it is a delete like any other.
func IsMovedMark(r *kgo.Record) bool {
	_, ok := headerValue(r, HeaderMoved)
	return ok && r.Value == nil
}

// headerValue returns the value of r's header k; a header given twice
// counts as absent (it proves nothing).
func headerValue(r *kgo.Record, k string) (v []byte, ok bool) {
	for _, h := range r.Headers {
		if h.Key == k {
			if ok {
				return nil, false
			}
			v, ok = h.Value, true
		}
	}
	return v, ok
}

// staleCopy returns the origin of r, a customer's record on its canonical
// partition or a shared one (OriginOf), and reports whether r is a stale
// copy: a record the stage re-produced or restated whose original reached
// usage.entitlements no later than the last record of its key applied
// here (okey: originKeyOf). Such a copy is a
// repeat (its misrouted original read again from the start by a new group
// or state rebuilt from scratch, or by a second aggregator), or an older
// version than one already in effect: applied, it would put an old
// version back in effect from its new broker time. It changes nothing but
// the read time. A record without the headers is always applied
// (DecideRecord has the rules).
//
// When the stale copy is older than the last record applied, or claims
// its origin with a lesser value, restate is that record again, to go to
// this partition in the same transaction (restateQueue), marked with its own origin: the last record of the key on the
// partition, which compaction keeps, is then the one in effect, not the
// stale copy (a stage that reads the partition from the start after
// compaction applies it; any other finds its origin equal to the last
// one applied, and skips it without restating it).
//
// The last origin and value of each customer key are kept in the state
// for good, for a misrouted original stays on its compacted partition,
// and can be read again, for as long as it is not replaced there.
func (pt *partition) staleCopy(st stateReader, r *kgo.Record, okey []byte) (o RecordOrigin, stale bool, restate *kgo.Record, err error) {
	last, lastValue, ok, err := pt.lastOrigin(st, okey)
	if err != nil {
		return RecordOrigin{}, false, nil, err
	}
	o, apply, again := DecideRecord(r, last, lastValue, ok)
	if apply || !again {
		return o, !apply, nil, nil
	}
	return last, true, pt.restated(r, last, lastValue), nil
}

// lastOrigin returns the origin and value of the last record of a key
// applied (okey: originKeyOf); ok is false when there is none.
func (pt *partition) lastOrigin(st stateReader, okey []byte) (last RecordOrigin, lastValue []byte, ok bool, err error) {
	v, ok, err := st.Get(okey)
	switch {
	case err != nil || !ok:
		return RecordOrigin{}, nil, false, err
	case len(v) < 21 || v[20] > 1 || v[20] == 0 && len(v) > 21:
		return RecordOrigin{}, nil, false, fmt.Errorf("aggregator: partition %d: corrupt record origin of %q (%d bytes)", pt.p, okey[1:], len(v))
	}
	last = RecordOrigin{Arrival: int64(binary.BigEndian.Uint64(v)), Partition: int32(binary.BigEndian.Uint32(v[8:])),
		Offset: int64(binary.BigEndian.Uint64(v[12:]))}
	if v[20] == 1 {
		lastValue = v[21:]
	}
	return last, lastValue, true, nil
}

// restated is the record of r's key in effect, last and lastValue, written
// again to the partition marked with its origin.
func (pt *partition) restated(r *kgo.Record, last RecordOrigin, lastValue []byte) *kgo.Record {
	restate := &kgo.Record{Topic: r.Topic, Partition: pt.p, Key: r.Key, Timestamp: pt.pr.now(), Headers: []kgo.RecordHeader{
		{Key: HeaderRerouted, Value: fmt.Appendf(nil, "%d/%d", last.Partition, last.Offset)},
		{Key: HeaderArrival, Value: strconv.AppendInt(nil, last.Arrival, 10)},
	}}
	if lastValue != nil {
		restate.Value = bytes.Clone(lastValue)
	}
	return restate
}

// restateRejected restates (restateQueue) the record in effect of the key of r, a
// record of usage.entitlements just rejected, when r is a customer's on
// its canonical partition, or a shared one (the default plan, the rate
// card, on any partition), and a record of its key was applied: the
// rejected record leaves it in effect, but would otherwise be the key's
// last record, which compaction keeps and a stage reading the compacted
// topic from the start rejects (applying the default plan instead, or no
// default plan, no rate card). Every other stage skips the restated
// record (the origin and value in effect). A rejected record whose key is
// a tick's or not an entitlements key, or a customer's on another
// partition, or whose value is the one in effect, changes nothing.
func (pt *partition) restateRejected(tx *stream.Tx, r *kgo.Record) error {
	k, err := schemas.ParseEntitlementsKey(r.Key)
	if err != nil || k.Reserved == schemas.TickKey || k.Reserved == "" && schemas.Partition(r.Key, pt.pr.counts.entitlements) != pt.p {
		return nil
	}
	okey := originKeyOf(k)
	last, lastValue, ok, err := pt.lastOrigin(tx, okey)
	if err != nil || !ok || compareValues(r.Value, lastValue) == 0 {
		// The value in effect rejected (a state applied under other
		// rules): restated, it would be rejected again, for ever.
		if err == nil && ok {
			pt.ent.restates.set(okey, nil)
		}
		return err
	}
	pt.ent.restates.set(okey, pt.restated(r, last, lastValue))
	pt.pr.log.Info("rejected entitlements record followed by the record in effect, restated", zap.Int32("partition", pt.p),
		zap.Int64("offset", r.Offset), zap.String("key", string(okey[1:])))
	return nil
}

// DecideRecord decides r, a record of a key on its partition, against the
// last record of the key applied there: its origin last and value
// lastValue (nil: a delete); have is false when there is none yet. It
// returns the origin of the key once r is read, and reports whether r is
// applied and, when it is not, whether the last record is to be written
// again (restate) so that r is not what compaction keeps. The aggregator
// (staleCopy) and `meterline entitlements get` decide by it.
//
//   - r is later than last (OriginOf): applied.
//   - r is not a copy (no headers), but earlier (a broker clock that
//     stepped back): applied, ordered a millisecond after last (the
//     Ledger reads it at the latest broker time read, at least), so that
//     a copy or restated record of last read after it is older.
//   - r is a copy from before last: skipped, last restated.
//   - r is a copy claiming last's origin (its coordinates; its arrival may
//     be earlier, stamped after a broker clock stepped back): the same value (another copy of
//     it: a second aggregator's, a restated one read back) is skipped;
//     otherwise (headers a client wrote or copied, or a stage that
//     applied such a record where another did not: the compacted topic
//     read from the start) the greater value (bytes; a delete least)
//     wins, so that every reader ends with the same one and two stages
//     never restate each other's records for ever. A client gains
//     nothing it could not by writing the record without the headers.
func DecideRecord(r *kgo.Record, last RecordOrigin, lastValue []byte, have bool) (o RecordOrigin, apply, restate bool) {
	o, copied := OriginOf(r)
	switch {
	case !have || o.After(last):
		return o, true, false
	case !copied:
		return RecordOrigin{Arrival: last.Arrival + 1, Partition: o.Partition, Offset: o.Offset}, true, false
	case last.After(o) && (o.Partition != last.Partition || o.Offset != last.Offset):
		return last, false, true
	}
	// A copy claiming last's coordinates, at its time or earlier: a copy
	// stamped after a broker clock stepped back behind last's time has
	// an earlier arrival (OriginOf), and is still a copy of last (restated,
	// it would be restated for as long as the clock is behind).
	switch c := compareValues(r.Value, lastValue); {
	case c == 0:
		return last, false, false
	case c > 0:
		return last, true, false
	}
	return last, false, true
}

// compareValues orders record values: a delete (nil) first, then by bytes.
func compareValues(a, b []byte) int {
	switch {
	case a == nil && b == nil:
		return 0
	case a == nil:
		return -1
	case b == nil:
		return 1
	}
	return bytes.Compare(a, b)
}

// restateQueue holds the restated records (restated) of the records of
// usage.entitlements being handled, one per key: the one due after the
// last record of the key read, none when that record was applied or
// needs none. They are written after the records (emit), so that a run
// of records rejected under one key, which a producer can write at will,
// costs one restated record (as large as the record in effect, up to
// about 530 KB), not one each.
type restateQueue struct {
	recs  map[string]*kgo.Record
	order []string
}

// reset empties q.
func (q *restateQueue) reset() {
	clear(q.recs)
	q.order = q.order[:0]
}

// set makes r the restated record due for the key okey (originKeyOf);
// nil: none.
func (q *restateQueue) set(okey []byte, r *kgo.Record) {
	if r == nil {
		if q.recs != nil {
			delete(q.recs, string(okey))
		}
		return
	}
	if q.recs == nil {
		q.recs = map[string]*kgo.Record{}
	}
	if _, ok := q.recs[string(okey)]; !ok {
		q.order = append(q.order, string(okey))
	}
	q.recs[string(okey)] = r
}

// emit writes the restated records due, in the order their keys first
// needed one, and empties q.
func (q *restateQueue) emit(tx *stream.Tx) {
	for _, k := range q.order {
		if r, ok := q.recs[k]; ok {
			tx.Emit(r)
			delete(q.recs, k)
		}
	}
	q.order = q.order[:0]
}
