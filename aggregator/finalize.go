package aggregator

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/meterline/meterline/internal/fault"
	"github.com/meterline/meterline/internal/stream"
	"github.com/meterline/meterline/schemas"
)

// Finalization and expiry of a period (docs/design.md, Time;
// docs/design.md, Exactly-once, 7).
//
// The decision is one transaction: the one whose watermark passes the
// period's end + grace writes the period's marker ('F' P) in phase emit,
// with that watermark. The values its FINAL revisions carry are the
// period's OPEN states ('a' P K) as of that transaction, already in state;
// from then on no event changes them: every event for the period is an
// adjustment, queued ('p' P seq) behind the FINALs and booked in order.
//
// The work that scales with state is done in chunks of at most
// Config.FinalChunk keys, one chunk per transaction (stream.Worker), each
// advancing a cursor kept in the marker in the same transaction:
//
//	emit    FINAL revision of each 'a' P K after the cursor, its state
//	        moved to 'f' P K (the working state adjustments measure
//	        against); then
//	book    the queued events of P after the cursor, as adjustments; then
//	done    the marker's value is empty (what earlier versions wrote);
//	expire  once the watermark reaches end + W + B + S (expiresAt):
//	        tombstones for 'f' P and 'u' P keys after the cursor, then
//	        for the period's meter definitions ('M' P, meterdef.go)
//	        and the marker.
//
// A crash between chunks leaves the cursor of the last committed chunk: the
// next chunk goes on after it, so every key gets exactly one FINAL.

// The phases of a period's marker.
const (
	phaseDone   byte = 0 // an empty value
	phaseEmit   byte = 'e'
	phaseBook   byte = 'b'
	phaseExpire byte = 'x'
)

// periodState is a period's marker: final in this partition, and how far
// its chunked work got.
type periodState struct {
	phase byte
	// decidedAt is the watermark that decided the period final: the
	// updated_at of its FINAL revisions, whichever transaction emits them.
	decidedAt int64
	// emitted counts the FINAL revisions emitted so far, chunks the
	// chunks of the current phase (for the log).
	emitted, chunks int64
	// cursor is the last state key the phase handled; nil: none yet.
	cursor []byte
}

func (ps *periodState) encode() []byte {
	if ps.phase == phaseDone && ps.decidedAt == 0 {
		return nil
	}
	b := make([]byte, 0, 1+3*binary.MaxVarintLen64+len(ps.cursor))
	b = append(b, ps.phase)
	b = binary.AppendVarint(b, ps.decidedAt)
	b = binary.AppendVarint(b, ps.emitted)
	b = binary.AppendVarint(b, ps.chunks)
	return append(b, ps.cursor...)
}

func decodePeriodState(v []byte) (*periodState, error) {
	if len(v) == 0 {
		return &periodState{phase: phaseDone}, nil
	}
	ps := &periodState{phase: v[0]}
	switch ps.phase {
	case phaseEmit, phaseBook, phaseExpire, phaseDone: // done: with its decidedAt
	default:
		return nil, fmt.Errorf("aggregator: corrupt period marker: phase %q", v[0])
	}
	var vals [3]int64
	b, ok := readVarints(v[1:], vals[:])
	if !ok {
		return nil, errors.New("aggregator: corrupt period marker")
	}
	ps.decidedAt, ps.emitted, ps.chunks = vals[0], vals[1], vals[2]
	if len(b) > 0 {
		ps.cursor = bytes.Clone(b)
	}
	return ps, nil
}

func (pt *partition) putMarker(tx *stream.Tx, start int64, ps *periodState) {
	tx.Put(periodKey(pfxMarker, start), ps.encode())
}

// markFinal marks period start final with nothing to emit: the watermark
// passed its end + grace, or a later period is final here
// (finalBefore), and it had no aggregate and no queued event here
// (finalize decides those that have).
func (pt *partition) markFinal(tx *stream.Tx, start int64) *periodState {
	ps := &periodState{phase: phaseDone, decidedAt: pt.wm}
	pt.putFinal(start, ps)
	pt.putMarker(tx, start, ps)
	return ps
}

// putFinal records ps as period start's marker in finals.
func (pt *partition) putFinal(start int64, ps *periodState) {
	pt.finals[start] = ps
	if !pt.hasFinal || start > pt.lastFinal {
		pt.lastFinal, pt.hasFinal = start, true
	}
}

// dropFinal forgets period start's marker (its state expired).
func (pt *partition) dropFinal(start int64) {
	delete(pt.finals, start)
	if start != pt.lastFinal {
		return
	}
	pt.hasFinal = false
	for s := range pt.finals {
		if !pt.hasFinal || s > pt.lastFinal {
			pt.lastFinal, pt.hasFinal = s, true
		}
	}
}

// finalBefore reports whether period start, not final here, comes before
// a period that is: it was final by the rule (its end + grace passed)
// when that one was decided, so it stays final, whatever grace runs now
// (docs/design.md, Time: a longer --grace leaves final the periods
// already final). finalize looks for undecided periods only after the
// latest final one (finalLow): an OPEN aggregate, queued event or line of
// such a period would never be decided.
func (pt *partition) finalBefore(start int64) bool {
	return pt.hasFinal && start < pt.lastFinal
}

// finalLow returns the lowest state key of prefix pfx that a period not
// final yet can have: none below the latest final period, whose decision
// decided every earlier period with keys (finalize runs on every advance
// of the watermark, lowest period first), and every period before it is
// final (finalBefore). Scans start there, not at the prefix, so they do
// not walk the tombstones a finished period left.
func (pt *partition) finalLow(pfx byte) []byte {
	if !pt.hasFinal {
		return []byte{pfx}
	}
	return periodKey(pfx, pt.lastFinal+1)
}

// firstPeriodFrom returns the smallest period start with a key of prefix pfx
// at or after lo.
func firstPeriodFrom(tx stateReader, pfx byte, lo []byte) (int64, bool, error) {
	var start int64
	found := false
	err := tx.Scan(lo, []byte{pfx + 1}, func(k, _ []byte) error {
		start, found = int64(binary.BigEndian.Uint64(k[1:9])), true
		return errStop
	})
	if err != nil && !errors.Is(err, errStop) {
		return 0, false, err
	}
	return start, found, nil
}

// finalize decides final every period with OPEN aggregates or queued events
// whose end + grace the watermark has passed, lowest first. It emits
// nothing: the FINAL revisions go out in chunks (Work).
func (pt *partition) finalize(tx *stream.Tx) error {
	grace := pt.pr.cfg.Grace.Milliseconds()
	// The scans below read the transaction: it must hold the aggregates
	// changed so far, and the decision freezes their values.
	pt.materialize(tx)
	for {
		start, ok, err := pt.firstUndecided(tx)
		if err != nil || !ok {
			return err
		}
		_, end := pt.bounds(start)
		if pt.wm <= end+grace {
			return nil
		}
		pt.decide(tx, start)
	}
}

// undecidedPfx are the prefixes of the state keys that make a period not
// final yet wait for its decision: OPEN aggregates, queued events, and
// lines adjustments were booked into.
var undecidedPfx = [...]byte{pfxOpen, pfxPending, pfxLine}

// firstUndecided returns the lowest period not final yet with a key of
// undecidedPfx.
func (pt *partition) firstUndecided(tx stateReader) (int64, bool, error) {
	var start int64
	found := false
	for _, pfx := range undecidedPfx {
		s, ok, err := firstPeriodFrom(tx, pfx, pt.finalLow(pfx))
		if err != nil {
			return 0, false, err
		}
		if ok && (!found || s < start) {
			start, found = s, true
		}
	}
	return start, found, nil
}

// undecidedDue reports whether st, as opened, holds OPEN aggregates or
// queued events of a period that is not decided final although the
// watermark passed its end + the configured grace: never, unless the state
// was built with a longer grace (--grace shortened across a restart), since
// the transaction that moves the watermark decides every period it passes
// (finalize). Left so, such a period would be final by the rule of
// docs/design.md, Time, without its FINAL revisions: an event of it would
// mark it final with nothing to emit (place), and its aggregates would
// never get one.
func (pt *partition) undecidedDue(st stateReader) (bool, error) {
	grace := pt.pr.cfg.Grace.Milliseconds()
	for _, pfx := range undecidedPfx {
		// finalize decides the lowest period first: the lowest tells.
		s, ok, err := firstPeriodFrom(st, pfx, pt.finalLow(pfx))
		if err != nil {
			return false, err
		}
		if _, end := pt.pr.cfg.Period.Bounds(s); ok && pt.wm > end+grace {
			return true, nil
		}
	}
	return false, nil
}

// decideLoaded decides final, in the first transaction this partition
// takes part in after its state was opened or reloaded, the periods
// undecidedDue finds (finalize: none unless the state was built with a
// longer grace).
func (pt *partition) decideLoaded(tx *stream.Tx) error {
	if !pt.decideDue {
		return nil
	}
	pt.decideDue = false
	return pt.finalize(tx)
}

// decide records in the open transaction that period start is final: its
// OPEN states are the values of its FINAL revisions (materialized), and
// its aggregates leave the cache, so that Flush emits no OPEN revision of
// them and no event changes them.
func (pt *partition) decide(tx *stream.Tx, start int64) {
	for k, a := range pt.open {
		if a.start == start {
			a.dirty = false
			pt.drop(k, a)
		}
	}
	ps := &periodState{phase: phaseEmit, decidedAt: pt.wm}
	pt.putFinal(start, ps)
	pt.putMarker(tx, start, ps)
	// Guarantee: the decision is in the open transaction only; a crash
	// here aborts it and the watermark decides again after the restart
	// (exactly one FINAL per key).
	fault.Hit(fault.FinalDecided)
	pt.pr.log.Info("period decided final; its FINAL revisions follow in chunks", zap.Int32("partition", pt.p),
		zap.String("period_start", msTime(start)), zap.String("watermark", msTime(pt.wm)),
		zap.Int("chunk", pt.pr.cfg.FinalChunk))
}

// expiresAt returns when, in watermark time, the state of a final period
// ending at end expires: end + W + B + S (Config.Bucket, Config.Skew).
// Dedup accepts no event of the period once its own watermark reaches
// end + W + B, a re-routed one with its original arrival included
// (dedup's rejection of a copy it could not recognise, judged by whole
// buckets), so no event is measured against working state already
// dropped. An event is booked into the period of its arrival, which can
// be up to S before its event_time: the period's lines ('l' P K, and the
// FINALs its 'f' P K keys record) are read by the adjustments booked into
// it (bookLine) until the watermark reaches end + W + B + S, the
// pruneHorizon's bound. Dropped earlier, such an adjustment would give a
// line that had its FINAL a second one, of value 0.
func (pt *partition) expiresAt(end int64) int64 {
	c := &pt.pr.cfg
	return end + c.Window.Milliseconds() + c.Bucket.Milliseconds() + c.Skew.Milliseconds()
}

// HasWork implements stream.Worker: a period of this partition has FINAL
// revisions to emit, queued events to book, or state to expire.
func (pt *partition) HasWork() bool {
	if pt.stale || pt.decideDue {
		// Work reloads the committed state, and decides then; or decides
		// the periods its loaded state left due (decideLoaded).
		return true
	}
	_, ps := pt.nextWork()
	return ps != nil || pt.entHasWork()
}

// nextWork returns the period whose chunked work goes next, or nil: the
// lowest one with FINAL revisions or queued adjustments to go out (what a
// bill waits for), else the lowest one to expire.
func (pt *partition) nextWork() (int64, *periodState) {
	var best int64
	var found *periodState
	rank := func(ps *periodState) int { // lower goes first
		if ps.phase == phaseEmit || ps.phase == phaseBook {
			return 0
		}
		return 1
	}
	for s, ps := range pt.finals {
		if ps.phase == phaseDone {
			if _, end := pt.pr.cfg.Period.Bounds(s); pt.wm < pt.expiresAt(end) {
				continue
			}
		}
		if found == nil || rank(ps) < rank(found) || (rank(ps) == rank(found) && s < best) {
			best, found = s, ps
		}
	}
	return best, found
}

// Work implements stream.Worker: one chunk of the lowest period's work,
// at most Config.FinalChunk keys, in tx.
func (pt *partition) Work(tx *stream.Tx) error {
	pt.publishEnt()
	if pt.stale {
		if err := pt.load(tx); err != nil {
			return err
		}
		pt.stale, pt.decideDue = false, true // as in Process
	}
	// A chunk may write a meter's first state key of a period (an
	// adjustment's working state): what state built before definitions
	// were recorded holds is recorded first; and new state's first keys,
	// if this is its first transaction to commit (the one before it
	// aborted).
	pt.writeFirst(tx)
	if err := pt.decideLoaded(tx); err != nil {
		return err
	}
	if pt.ent != nil {
		// The transaction commits this partition's offsets (stream.Worker):
		// the group generation fences it (flushBalances).
		pt.ent.fenced = true
	}
	start, ps := pt.nextWork()
	if ps == nil {
		if pt.entHasWork() {
			err := pt.entWork(tx) // a release in chunks among it
			pt.publishHold()
			return err
		}
		return nil
	}
	if ps.chunks > 0 {
		// Guarantee: the previous chunk of this phase is committed with
		// its cursor (one chunk per transaction); a crash here goes on
		// from that cursor after the restart.
		fault.Hit(fault.BetweenChunks)
	}
	var err error
	switch ps.phase {
	case phaseEmit:
		err = pt.emitChunk(tx, start, ps)
	case phaseBook:
		err = pt.bookChunk(tx, start, ps, pt.pr.cfg.FinalChunk, pt.pr.cfg.FinalChunkBytes)
	default: // done, with the watermark at end + W + B + S; or expiring
		err = pt.expireChunk(tx, start, ps)
	}
	pt.publish()
	pt.refreshFinalDue(tx, true)
	return err
}

// errStop ends a scan early.
var errStop = errors.New("stop")

type kv struct{ k, v []byte }

// scanChunk returns copies of up to n live keys of [lo, hi) after the
// cursor (or from lo), in key order.
func scanChunk(tx *stream.Tx, lo, hi, cursor []byte, n int) ([]kv, error) {
	out, _, err := scanChunkBytes(tx, lo, hi, cursor, n, -1)
	return out, err
}

// scanChunkBytes is scanChunk that also stops after the key whose bytes
// (keys and values, from the first) reach maxBytes (negative: no bound),
// so that a chunk of keys with large group values stays bounded in bytes
// as well as in keys (Config.FinalChunkBytes). full reports that it
// stopped at a bound: keys may be left after the last one.
func scanChunkBytes(tx *stream.Tx, lo, hi, cursor []byte, n, maxBytes int) (out []kv, full bool, err error) {
	from := lo
	if cursor != nil && bytes.Compare(cursor, lo) >= 0 {
		from = append(bytes.Clone(cursor), 0) // the next key after it
	}
	size := 0
	err = tx.Scan(from, hi, func(k, v []byte) error {
		out = append(out, kv{bytes.Clone(k), bytes.Clone(v)})
		size += len(k) + len(v)
		if len(out) == n || (maxBytes >= 0 && size >= maxBytes) {
			full = true
			return errStop
		}
		return nil
	})
	if err != nil && !errors.Is(err, errStop) {
		return nil, false, err
	}
	return out, full, nil
}

// kvBytes returns the bytes of the keys and values of kvs.
func kvBytes(kvs []kv) int {
	n := 0
	for _, o := range kvs {
		n += len(o.k) + len(o.v)
	}
	return n
}

// emitChunk emits the FINAL revision of up to FinalChunk OPEN aggregates
// of the period after the cursor, and moves their state to the final
// working state; then, in key order after them, a FINAL revision of value
// 0 for each line an adjustment was booked into ('l' P K) that has no
// aggregate of its own; when none is left, the queued events are next.
func (pt *partition) emitChunk(tx *stream.Tx, start int64, ps *periodState) error {
	n, budget := pt.pr.cfg.FinalChunk, pt.pr.cfg.FinalChunkBytes
	// The keys handled in this chunk: OPEN aggregates, then lines, in
	// key order, at most n of them and about budget bytes.
	done, full := 0, false
	for _, pfx := range []byte{pfxOpen, pfxLine} {
		var keys []kv
		var err error
		keys, full, err = scanChunkBytes(tx, periodKey(pfx, start), periodKey(pfx, start+1), ps.cursor, n-done, budget)
		if err != nil {
			return err
		}
		emitted, err := pt.emitFinals(tx, keys, ps.decidedAt)
		if err != nil {
			return err
		}
		ps.emitted += int64(emitted)
		done += len(keys)
		budget -= kvBytes(keys)
		if len(keys) > 0 {
			ps.cursor = keys[len(keys)-1].k
		}
		if full {
			break
		}
	}
	pt.txc.Inc(pt.pr.m.chunks.WithLabelValues("final"))
	ps.chunks++
	if full {
		pt.putMarker(tx, start, ps)
		return nil
	}
	// Every FINAL of the period is out.
	_, end := pt.bounds(start)
	if ps.emitted > 0 {
		pt.finalDelays = append(pt.finalDelays, pt.pr.now().Sub(time.UnixMilli(end+pt.pr.cfg.Grace.Milliseconds())).Seconds())
	}
	pt.pr.log.Info("period finalized", zap.Int32("partition", pt.p), zap.String("period_start", msTime(start)),
		zap.Int64("aggregates", ps.emitted), zap.Int64("transactions", ps.chunks), zap.String("decided_at", msTime(ps.decidedAt)))
	ps.phase, ps.cursor, ps.chunks = phaseBook, nil, 0
	// What is left of this transaction's chunk books queued events.
	return pt.bookChunk(tx, start, ps, n-done, budget)
}

// emitFinals emits the FINAL revisions of keys, all of one prefix: of an
// OPEN aggregate ('a' P K), whose state moves to the final working state
// ('f' P K); of a line adjustments were booked into ('l' P K), value 0,
// unless K has a FINAL of its own ('f' P K). It returns how many it
// emitted.
func (pt *partition) emitFinals(tx *stream.Tx, keys []kv, decidedAt int64) (int, error) {
	// Emitted records are the producer's until their promise: one each.
	recs := make([]kgo.Record, len(keys))
	emitted := 0
	for _, o := range keys {
		fk := append([]byte{pfxFinal}, o.k[1:]...)
		st := &aggState{} // a line's: no usage of its own in the period
		if o.k[0] == pfxOpen {
			var err error
			if st, err = decodeState(o.v); err != nil {
				return emitted, err
			}
		} else if own, err := hasFinal(tx, fk); err != nil {
			return emitted, err
		} else if own {
			continue
		}
		st.Revision++
		out, err := pt.aggOutput(o.k)
		if err != nil {
			return emitted, err
		}
		if _, err := pt.emitRevision(tx, &recs[emitted], nil, &out, decidedAt, st, schemas.StatusFinal); err != nil {
			return emitted, err
		}
		emitted++
		if o.k[0] == pfxOpen {
			tx.Delete(o.k)
			tx.Put(fk, st.encode())
		}
	}
	pt.txc.Add(pt.pr.m.emittedFinal, float64(emitted))
	return emitted, nil
}

// hasFinal reports whether the final working state fk ('f' P K) is that of
// an aggregate that had its FINAL revision: one an adjustment of P made
// (late, no FINAL for the key) has revision 0.
func hasFinal(tx *stream.Tx, fk []byte) (bool, error) {
	v, ok, err := tx.Get(fk)
	if err != nil || !ok {
		return false, err
	}
	st, err := decodeState(v)
	return err == nil && st.Revision > 0, err
}

// bookLine sees to it that the line of aggregate key ak in period b, which
// an adjustment of meter m is booked into, has a FINAL revision in this
// partition: with b's FINAL revisions ('l' b ak, emitFinals) unless they
// already went past the line; else now, value 0, unless the line has a
// FINAL of its own. A FINAL revision thus says, line by line, that the
// partition that books into the line decided its period final
// (docs/design.md, Time).
func (pt *partition) bookLine(tx *stream.Tx, b int64, ak []byte, meter string, m *Meter) error {
	lk := periodKey(pfxLine, b, ak)
	if _, ok, err := tx.Get(lk); err != nil || ok {
		return err
	}
	pt.recordDef(tx, b, meter, m)
	tx.Put(lk, nil)
	ps := pt.finals[b]
	_, end := pt.bounds(b)
	if (ps == nil && pt.wm <= end+pt.pr.cfg.Grace.Milliseconds() && !pt.finalBefore(b)) ||
		(ps != nil && ps.phase == phaseEmit && (ps.cursor == nil || bytes.Compare(lk, ps.cursor) > 0)) {
		return nil // b's FINAL revisions are still to reach it
	}
	// b is final here and its FINALs are out (an adjustment booked into a
	// final period: docs/design.md, Time).
	if own, err := hasFinal(tx, periodKey(pfxFinal, b, ak)); err != nil || own {
		return err
	}
	if ps == nil {
		pt.markFinal(tx, b) // so that the line expires with the period
	}
	out, err := pt.aggOutput(lk)
	if err != nil {
		return err
	}
	// As of the watermark that decided b final, as b's other FINAL
	// revisions, however far they had got when this event came; a
	// period marked done before its decision was kept has none.
	decidedAt := pt.wm
	if ps != nil && ps.decidedAt != 0 {
		decidedAt = ps.decidedAt
	}
	_, err = pt.emitRevision(tx, new(kgo.Record), nil, &out, decidedAt, &aggState{Revision: 1}, schemas.StatusFinal)
	pt.txc.Add(pt.pr.m.emittedFinal, 1)
	return err
}

// bookChunk books up to n events of the period queued behind its
// FINAL revisions (late by arrival while it was open, or processed while
// its FINALs were going out), about maxBytes of them at most
// (scanChunkBytes), in the order they were queued; when none is left, the
// period is done.
func (pt *partition) bookChunk(tx *stream.Tx, start int64, ps *periodState, n, maxBytes int) error {
	if n <= 0 || maxBytes <= 0 {
		pt.putMarker(tx, start, ps)
		return nil
	}
	queued, full, err := scanChunkBytes(tx, periodKey(pfxPending, start), periodKey(pfxPending, start+1), ps.cursor, n, maxBytes)
	if err != nil {
		return err
	}
	for _, q := range queued {
		var e schemas.DedupedEvent
		if err := schemas.DecodeInto(q.v, &e); err != nil {
			return fmt.Errorf("aggregator: queued late event: %w", err)
		}
		tx.Delete(q.k)
		// The charge its decision made when it was queued, if any
		// (entitlements only).
		var charge []byte
		charged := false
		if pt.ent != nil {
			ck := append([]byte{pfxCharge}, q.k[1:]...)
			var err error
			if charge, charged, err = tx.Get(ck); err != nil {
				return err
			}
			if charged {
				tx.Delete(ck)
			}
		}
		r, err := pt.queuedSource(tx, q.k, q.v)
		if err != nil {
			return err
		}
		pt.refused = false
		if err := pt.event(tx, r, &e, true); err != nil {
			return err
		}
		if pt.refused && charged {
			// Rejected now, it consumes nothing (docs/entitlements.md,
			// Plans and caps).
			if err := pt.refund(tx, &e, charge); err != nil {
				return err
			}
		}
	}
	if len(queued) > 0 {
		pt.txc.Inc(pt.pr.m.chunks.WithLabelValues("book"))
		ps.chunks++
		ps.cursor = queued[len(queued)-1].k
	}
	if full {
		pt.putMarker(tx, start, ps)
		return nil
	}
	ps.phase, ps.cursor, ps.chunks = phaseDone, nil, 0
	pt.putMarker(tx, start, ps)
	return nil
}

// queuedSource returns the record of usage.deduped that the event queued
// as pending key k (value v) came from, and deletes its 't' key; nil when
// the state does not hold it (queued before it was kept). Its value is the
// event as queued (v).
func (pt *partition) queuedSource(tx *stream.Tx, k, v []byte) (*kgo.Record, error) {
	sk := append([]byte{pfxQueuedSource}, k[1:]...)
	b, ok, err := tx.Get(sk)
	if err != nil || !ok {
		return nil, err
	}
	r, err := decodeGateRecord(b, pt.pr.cfg.Topics.DedupedTopic(), pt.p)
	if err != nil {
		return nil, fmt.Errorf("aggregator: queued late event's record: %w", err)
	}
	tx.Delete(sk)
	r.Value = v
	return r, nil
}

// expireChunk deletes up to FinalChunk keys of the period's final working
// state ('f', then 'u') after the cursor, with tombstones, so that the
// compacted changelog does not keep them; when none is left, the period's
// meter definitions (one key per meter) and the marker.
// No event for the period can arrive any more (expiresAt): dedup rejects
// event times older than W before their arrival, and a re-routed event,
// which keeps its original arrival, once its keys could have expired.
func (pt *partition) expireChunk(tx *stream.Tx, start int64, ps *periodState) error {
	n, budget := pt.pr.cfg.FinalChunk, pt.pr.cfg.FinalChunkBytes
	if ps.phase != phaseExpire {
		ps.phase, ps.cursor, ps.chunks = phaseExpire, nil, 0
	}
	deleted := 0
	for _, pfx := range []byte{pfxFinal, pfxLine, pfxUnique} { // in key order
		if ps.cursor != nil && ps.cursor[0] > pfx {
			continue // this prefix is done
		}
		keys, full, err := scanChunkBytes(tx, periodKey(pfx, start), periodKey(pfx, start+1), ps.cursor, n-deleted, budget)
		if err != nil {
			return err
		}
		for _, o := range keys {
			tx.Delete(o.k)
		}
		if pfx == pfxFinal {
			pt.keys -= len(keys)
		}
		deleted += len(keys)
		budget -= kvBytes(keys)
		if len(keys) > 0 {
			ps.cursor = keys[len(keys)-1].k
		}
		if full {
			pt.txc.Inc(pt.pr.m.chunks.WithLabelValues("expire"))
			ps.chunks++
			pt.putMarker(tx, start, ps)
			return nil
		}
	}
	pt.txc.Inc(pt.pr.m.chunks.WithLabelValues("expire"))
	// One key per meter of the period: deleted with the marker.
	if err := pt.expireDefs(tx, start); err != nil {
		return err
	}
	tx.Delete(periodKey(pfxMarker, start))
	pt.dropFinal(start)
	pt.pr.log.Info("period state expired", zap.Int32("partition", pt.p), zap.String("period_start", msTime(start)),
		zap.Int64("transactions", ps.chunks+1))
	return nil
}
