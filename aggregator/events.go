package aggregator

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/meterline/meterline/internal/stream"
	"github.com/meterline/meterline/schemas"
)

// Event handling: each record of usage.deduped is an event, aggregated into
// its OPEN aggregate or booked as an adjustment (docs/design.md, Time), or
// a watermark, which decides periods final (finalize.go).

// dispatch handles r, already decoded in pt.ev when decoded (gateTime).
func (pt *partition) dispatch(tx *stream.Tx, r *kgo.Record, decoded bool) error {
	if decoded {
		return pt.handleDecoded(tx, r)
	}
	return pt.handle(tx, r)
}

func (pt *partition) handle(tx *stream.Tx, r *kgo.Record) error {
	// The common case, a DedupedEvent, is decoded into the partition's
	// reused event (it does not outlive the call: what is kept is copied or
	// encoded). Anything else, or a record that fails to decode, goes
	// through Decode, which says what it is or why it is undecodable.
	pt.ev = schemas.DedupedEvent{}
	if schemas.DecodeInto(r.Value, &pt.ev) == nil {
		return pt.handleDecoded(tx, r)
	}
	msg, err := schemas.Decode(r.Value)
	if err != nil {
		return pt.rejectUndecodable(tx, r, err)
	}
	switch m := msg.(type) {
	case *schemas.Watermark:
		if pt.tooFarAhead(r, m.Watermark) {
			return pt.rejectTooFarAhead(tx, r, nil, "watermark", m.Watermark)
		}
		tx.TimeRecord(r)
		return pt.watermark(tx, m)
	case *schemas.DedupedEvent:
		if pt.tooFarAhead(r, m.IngestTime) {
			return pt.rejectTooFarAhead(tx, r, m, "ingest_time", m.IngestTime)
		}
		if pt.holds(m) {
			pt.hold(tx, r, m)
			return nil
		}
		return pt.event(tx, r, m, false)
	default:
		return pt.reject(tx, r, nil, schemas.ReasonInvalid, fmt.Sprintf("record is a %s, not a DedupedEvent or Watermark", msg.Kind()))
	}
}

// handleDecoded is handle of a record that DecodeInto decoded into pt.ev.
func (pt *partition) handleDecoded(tx *stream.Tx, r *kgo.Record) error {
	if pt.tooFarAhead(r, pt.ev.IngestTime) {
		return pt.rejectTooFarAhead(tx, r, &pt.ev, "ingest_time", pt.ev.IngestTime)
	}
	if pt.holds(&pt.ev) {
		pt.hold(tx, r, &pt.ev)
		return nil
	}
	return pt.event(tx, r, &pt.ev, false)
}

func (pt *partition) rejectUndecodable(tx *stream.Tx, r *kgo.Record, err error) error {
	reason := schemas.ReasonUndecodable
	if errors.Is(err, schemas.ErrUnknownSchema) {
		reason = schemas.ReasonUnknownSchema
	}
	return pt.reject(tx, r, nil, reason, err.Error())
}

func (pt *partition) watermark(tx *stream.Tx, w *schemas.Watermark) error {
	// The number of sources is usage.events' partition count from the
	// cluster's metadata, never the record's claim: a record that disagrees
	// is counted, logged and ignored (docs/design.md, Time).
	n := pt.pr.counts.events
	switch {
	case w.SourcePartitions != n:
		pt.ignoreWatermark(w, "source_partitions")
		return nil
	case w.SourcePartition < 0 || w.SourcePartition >= n:
		pt.ignoreWatermark(w, "source_partition")
		return nil
	}
	if err := pt.checkDedupTimes(w); err != nil {
		return err
	}
	s := w.SourcePartition
	if w.Watermark <= pt.sources[s] {
		return nil
	}
	pt.sources[s] = w.Watermark
	k := []byte{pfxSource, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(k[1:], uint32(s))
	var v [8]byte
	binary.BigEndian.PutUint64(v[:], uint64(w.Watermark))
	tx.Put(k, v[:])
	if wm := minWatermark(pt.sources); wm > pt.wm {
		// The held events it passes are decided first, as they would
		// have been read before it had dedup kept up (entorder.go).
		return pt.advanceTo(tx, wm)
	}
	return nil
}

// checkDedupTimes refuses a watermark record that states a dedup W, B or
// S longer than the aggregator's own, before anything of the record counts
// (its watermark could finalize a period or expire state). The working
// state of a final period is dropped at end + own W + B + S, while dedup
// accepts events for it until end + its W + B: a MAX, UNIQUE_COUNT or
// LATEST adjustment in between would be measured against nothing, and a
// re-routed event that arrived in it up to its S before its event_time
// could be booked into a period whose lines are forgotten. The
// entitlements history is pruned at wm − (own W + B + S), while dedup
// accepts a re-routed event that arrived up to its W + B + S before: it
// would be decided and priced against versions already gone. Each
// parameter is checked on its own (a longer one of the aggregator does
// not make up for a shorter other), and every shortfall is reported at
// once, naming the flag to set. 0 is not stated (an earlier schema).
func (pt *partition) checkDedupTimes(w *schemas.Watermark) error {
	c := &pt.pr.cfg
	var errs []error
	for _, d := range []struct {
		name, flag string
		stated     int64
		own        time.Duration
		err        error
	}{
		{"W", "--window", w.WindowMs, c.Window, ErrWindowTooShort},
		{"expiry bucket B", "--bucket", w.BucketMs, c.Bucket, ErrBucketTooShort},
		{"skew S", "--skew", w.SkewMs, c.Skew, ErrSkewTooShort},
	} {
		if d.stated <= d.own.Milliseconds() {
			continue
		}
		theirs := statedDuration(d.stated)
		errs = append(errs, fmt.Errorf("%w: dedup's %s is %s (watermark record of usage.events partition %d), the aggregator's %s; "+
			"run the aggregator with %s %s or more (partition %d is processed no further)",
			d.err, d.name, theirs, w.SourcePartition, d.own, d.flag, theirs, pt.p))
	}
	return errors.Join(errs...)
}

// statedDuration formats a duration a record states in milliseconds; one
// too large for a time.Duration (a corrupt record) is shown in
// milliseconds rather than wrapped.
func statedDuration(ms int64) string {
	if ms > math.MaxInt64/int64(time.Millisecond) {
		return fmt.Sprintf("%dms", ms)
	}
	return (time.Duration(ms) * time.Millisecond).String()
}

// ignoredLogEvery spaces the log lines of ignored watermark records of one
// partition (every dedup partition sends one per tick): the metric counts
// each record, the log says it is happening and what the records claim.
const ignoredLogEvery = time.Minute

// ignoreWatermark counts a watermark record that disagrees with the
// cluster's metadata and logs it (at most once a minute per partition,
// with the number of records ignored since the last line).
func (pt *partition) ignoreWatermark(w *schemas.Watermark, reason string) {
	pt.txc.Inc(pt.pr.m.wmIgnored.WithLabelValues(reason))
	pt.wmIgnored++
	// Wall time spaces log lines only; it decides nothing.
	now := pt.pr.now()
	if now.Sub(pt.wmIgnoredLogAt) < ignoredLogEvery {
		return
	}
	pt.pr.log.Warn("watermark record ignored: it disagrees with the partition count of usage.events in the cluster's metadata",
		zap.Int32("partition", pt.p), zap.String("reason", reason), zap.Int32("source_partition", w.SourcePartition),
		zap.Int32("source_partitions", w.SourcePartitions), zap.Int32("events_partitions", pt.pr.counts.events),
		zap.Int("ignored_since_last_line", pt.wmIgnored))
	pt.wmIgnoredLogAt, pt.wmIgnored = now, 0
}

func propValue(e *schemas.DedupedEvent, name string) (string, bool) {
	for _, p := range e.Properties {
		if p.Name == name {
			return p.Value, true
		}
	}
	return "", false
}

// event aggregates one event, or books it as an adjustment when it is late.
// queued: the event comes from its period's queue ('p'), behind the
// period's FINAL revisions; r is nil then.
func (pt *partition) event(tx *stream.Tx, r *kgo.Record, e *schemas.DedupedEvent, queued bool) error {
	c := &pt.pr.cfg
	if e.Quantity < 0 {
		// Dedup rejects these; a record of usage.deduped is still not
		// trusted to keep a sum from going down or wrapping.
		return pt.reject(tx, r, e, schemas.ReasonInvalid, fmt.Sprintf("quantity: must not be negative (got %d)", e.Quantity))
	}
	if field, t, ok := unplaceable(e); ok {
		// Dedup writes none (both are near a broker time); a period of
		// such a time would not order with the others in the state, or
		// would end past 64 bits and look final to any watermark.
		return pt.reject(tx, r, e, schemas.ReasonInvalid, fmt.Sprintf("%s: %d ms is not between %s and %s",
			field, t, msTime(0), msTime(maxPlaceable)))
	}
	m, declared := c.Meters.Lookup(e.Meter)
	if !declared && c.StrictMeters {
		return pt.reject(tx, r, e, schemas.ReasonUnknownMeter, fmt.Sprintf("meter %q is not declared in the meters file", e.Meter))
	}
	var uval string
	if m.Aggregation == UniqueCount {
		v, ok := propValue(e, m.Property)
		if !ok {
			return pt.reject(tx, r, e, schemas.ReasonInvalid, fmt.Sprintf("properties.%s: missing; meter %s counts its unique values", m.Property, e.Meter))
		}
		uval = v
	}
	if pt.ent != nil && !queued {
		// Decided once, here, in input order (docs/entitlements.md, The
		// aggregator, 3); an event queued behind its period's FINALs was
		// decided when it was queued. Its OPEN aggregate is looked up
		// first: it links its customer's entry of accounts (seedHeld),
		// which the decision then finds with no lookup of its own, and
		// placeAt takes it.
		start, end := pt.bounds(e.EventTime)
		k := pt.openKey(start, e, m)
		a := pt.open[string(k)]
		pt.ent.seedHeld(e.CustomerID, a)
		ch, ok, err := pt.decideEvent(tx, r, e, m)
		if !ok || err != nil {
			return err
		}
		// The charge reaches the transaction only if the aggregate takes
		// the event: one it refuses (a sum that would wrap, an event that
		// cannot be queued) consumes nothing (docs/entitlements.md, Plans
		// and caps).
		pt.refused, pt.queued = false, nil
		if err := pt.placeAt(tx, r, e, m, queued, uval, start, end, k[openKeyHead:], k, a); err != nil || pt.refused {
			return err
		}
		if err := ch.commit(); err != nil {
			return err
		}
		if pt.queued != nil {
			// Queued behind its period's FINALs, charged now: its
			// booking may still refuse it (a sum that would wrap, a
			// meter no longer declared), and then refunds this charge
			// and counts the refund (bookChunk). Kept also when it is
			// nothing, so that the refund is counted.
			tx.Put(pt.queued, ch.d.AppendCharge(nil))
		}
		return nil
	}
	return pt.place(tx, r, e, m, queued, uval)
}

// maxPlaceable bounds the times of an event the aggregator places in a
// period: 10000-01-01T00:00Z, so that every period end is representable.
var maxPlaceable = time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC).UnixMilli()

// unplaceable returns the field of e, and its time, that no period can
// hold: one before 1970 (period keys order as unsigned numbers) or from
// maxPlaceable on.
func unplaceable(e *schemas.DedupedEvent) (string, int64, bool) {
	for _, f := range [...]struct {
		name string
		t    int64
	}{{"event_time", e.EventTime}, {"ingest_time", e.IngestTime}} {
		if f.t < 0 || f.t >= maxPlaceable {
			return f.name, f.t, true
		}
	}
	return "", 0, false
}

// place counts an event in its OPEN aggregate, queues it behind its
// period's FINAL revisions, or books it as an adjustment (placeAt).
func (pt *partition) place(tx *stream.Tx, r *kgo.Record, e *schemas.DedupedEvent, m *Meter, queued bool, uval string) error {
	start, end := pt.bounds(e.EventTime)
	// ak is a scratch buffer: valid until the next event.
	pt.akBuf = appendAggKey(pt.akBuf[:0], e, m)
	return pt.placeAt(tx, r, e, m, queued, uval, start, end, pt.akBuf, nil, nil)
}

// openKey returns the state key of the OPEN aggregate of e in the period
// starting at start ('a' P K): a scratch buffer, valid until the next
// event.
func (pt *partition) openKey(start int64, e *schemas.DedupedEvent, m *Meter) []byte {
	k := append(pt.okBuf[:0], pfxOpen)
	k = binary.BigEndian.AppendUint64(k, uint64(start))
	pt.okBuf = appendAggKey(k, e, m)
	return pt.okBuf
}

// openKeyHead is the length of an OPEN aggregate's state key before its
// aggregate key K (openKey).
const openKeyHead = 1 + 8

// placeAt counts an event in its OPEN aggregate, queues it behind its
// period's FINAL revisions, or books it as an adjustment. [start, end) is
// the event's period and ak its aggregate key K; k is the state key of
// its OPEN aggregate (openKey; nil: not made yet) and a that aggregate if
// the caller looked it up (nil: not looked up, or none).
func (pt *partition) placeAt(tx *stream.Tx, r *kgo.Record, e *schemas.DedupedEvent, m *Meter, queued bool, uval string,
	start, end int64, ak, k []byte, a *openAgg) error {
	c := &pt.pr.cfg
	if queued {
		return pt.late(tx, r, e, m, start, end, ak, uval)
	}
	ps := pt.finals[start]
	if ps == nil && (pt.wm > end+c.Grace.Milliseconds() || pt.finalBefore(start)) {
		// The period is final (docs/design.md, Time) once the watermark
		// passed end + grace, whether or not it had aggregates here (no
		// marker: finalize only decides periods with open or queued keys);
		// so is one before a period final here, whatever the grace now
		// (finalBefore).
		// An event processed now (a re-routed event with its original
		// arrival, a broker clock that stepped back) is an adjustment, not
		// an OPEN aggregate that a later watermark would turn into a
		// second-round FINAL. Mark it, so that its state expires
		// (expiresAt).
		ps = pt.markFinal(tx, start)
	}
	switch {
	case ps == nil && e.IngestTime <= end+c.Grace.Milliseconds():
		return pt.onTime(tx, r, e, m, start, ak, k, a, uval)
	case ps == nil || ps.phase == phaseEmit || ps.phase == phaseBook:
		// Late by its own arrival while the period is not final here yet
		// (another source's watermark lags): its delta against the FINAL
		// value is not known yet. Or the period is final and its FINAL
		// revisions are still going out in chunks: the event is an
		// adjustment, booked behind them and behind the events queued
		// before it (docs/design.md, Time: deltas are against the final, in
		// order).
		v, err := encode(e)
		if err != nil {
			return pt.reject(tx, r, e, schemas.ReasonInvalid, "the event cannot be queued for its adjustment: "+err.Error())
		}
		seq, err := pt.nextSeq(tx)
		if err != nil {
			return err
		}
		var sk [8]byte
		binary.BigEndian.PutUint64(sk[:], uint64(seq))
		tx.Put(periodKey(pfxPending, start, sk[:]), v)
		if r != nil {
			tx.Put(periodKey(pfxQueuedSource, start, sk[:]), encodeGateRecord(&kgo.Record{Offset: r.Offset, Timestamp: r.Timestamp, Key: r.Key}))
		}
		pt.queued = periodKey(pfxCharge, start, sk[:])
		return nil
	default:
		return pt.late(tx, r, e, m, start, end, ak, uval)
	}
}

func (pt *partition) nextSeq(tx *stream.Tx) (int64, error) {
	v, ok, err := tx.Get(keySeq)
	if err != nil {
		return 0, err
	}
	var n int64
	if ok {
		n = int64(binary.BigEndian.Uint64(v))
	}
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(n+1))
	tx.Put(keySeq, b[:])
	return n, nil
}

func (pt *partition) loadState(tx *stream.Tx, k []byte) (*aggState, bool, error) {
	v, ok, err := tx.Get(k)
	if err != nil || !ok {
		return nil, false, err
	}
	st, err := decodeState(v)
	return st, err == nil, err
}

// seeUnique records value for UNIQUE_COUNT in the period and reports
// whether it is new.
func (pt *partition) seeUnique(tx *stream.Tx, start int64, ak []byte, value string) (bool, error) {
	isNew, err := pt.uniqueIsNew(tx, start, ak, value)
	if isNew {
		tx.Put(pt.uBuf, nil)
	}
	return isNew, err
}

// uniqueIsNew reports whether value is new for UNIQUE_COUNT in the period,
// recording nothing; its state key is left in pt.uBuf.
func (pt *partition) uniqueIsNew(tx *stream.Tx, start int64, ak []byte, value string) (bool, error) {
	k := append(pt.uBuf[:0], pfxUnique)
	k = binary.BigEndian.AppendUint64(k, uint64(start))
	k = appendFramed(k, ak)
	k = appendFramed(k, value)
	pt.uBuf = k
	_, seen, err := tx.Get(k)
	return err == nil && !seen, err
}

// seeUniqueOpen is seeUnique for an OPEN aggregate, through its seen set.
func (pt *partition) seeUniqueOpen(tx *stream.Tx, a *openAgg, ak []byte, value string) (bool, error) {
	if _, ok := a.seen[value]; ok {
		return false, nil
	}
	isNew, err := pt.seeUnique(tx, a.start, ak, value)
	if err != nil {
		return false, err
	}
	if pt.nSeen < maxCachedSeen {
		if a.seen == nil {
			a.seen = map[string]struct{}{}
		}
		a.seen[strings.Clone(value)] = struct{}{}
		pt.nSeen++
	}
	return isNew, nil
}

// overflows reports whether folding e (quantity ≥ 0) into st would wrap
// a 64-bit value: st's SUM, or its event count (which COUNT and
// UNIQUE_COUNT values never exceed). MAX and LATEST take a quantity as it
// is, and a delta of two values in [0, MaxInt64] cannot wrap either.
func overflows(st *aggState, e *schemas.DedupedEvent, m *Meter) bool {
	return st.Count == math.MaxInt64 || (m.Aggregation == Sum && e.Quantity > math.MaxInt64-st.Value)
}

// rejectOverflow rejects an event that would wrap its aggregate
// (docs/design.md, Bad input: invalid, and counted in no aggregate).
func (pt *partition) rejectOverflow(tx *stream.Tx, r *kgo.Record, e *schemas.DedupedEvent, m *Meter, start int64, st *aggState) error {
	what := "the " + string(m.Aggregation) + " of its aggregate"
	if st.Count == math.MaxInt64 {
		what = "the event count of its aggregate"
	}
	return pt.reject(tx, r, e, schemas.ReasonInvalid, fmt.Sprintf(
		"quantity: %d would overflow %s (%s/%s, period %s: value %d, %d events); sums never wrap",
		e.Quantity, what, e.CustomerID, e.Meter, msTime(start), st.Value, st.Count))
}

// apply folds the event into st and returns the change in value. For
// UNIQUE_COUNT, newUnique tells whether the event's value is new in the
// period.
func apply(st *aggState, fresh bool, e *schemas.DedupedEvent, m *Meter, newUnique bool) int64 {
	before := st.Value
	switch m.Aggregation {
	case Sum:
		st.Value += e.Quantity
	case Count:
		st.Value++
	case Max:
		if fresh || e.Quantity > st.Value {
			st.Value = e.Quantity
		}
	case UniqueCount:
		if newUnique {
			st.Value++
		}
	case Latest:
		if fresh || e.EventTime > st.LatestET || (e.EventTime == st.LatestET && e.EventID > st.LatestID) {
			st.Value, st.LatestET, st.LatestID = e.Quantity, e.EventTime, e.EventID
		}
	}
	st.Count++
	if fresh || e.EventTime < st.FirstET {
		st.FirstET = e.EventTime
	}
	if fresh || e.EventTime > st.LastET {
		st.LastET = e.EventTime
	}
	return st.Value - before
}

// onTime counts an event in its OPEN aggregate, of aggregate key ak and
// state key k (nil: made from ak): a if not nil, else looked up
// (openAggregate).
func (pt *partition) onTime(tx *stream.Tx, r *kgo.Record, e *schemas.DedupedEvent, m *Meter, start int64, ak, k []byte, a *openAgg, uval string) error {
	if k == nil {
		k = append(pt.okBuf[:0], pfxOpen)
		k = binary.BigEndian.AppendUint64(k, uint64(start))
		k = append(k, ak...)
		pt.okBuf = k
	}
	fresh := false
	if a == nil {
		var err error
		if a, fresh, err = pt.openAggregate(tx, k, start); err != nil {
			return err
		}
	}
	if pt.ent != nil {
		pt.ent.linkHeld(a, e.CustomerID)
	}
	if !fresh && overflows(&a.st, e, m) {
		return pt.rejectOverflow(tx, r, e, m, start, &a.st)
	}
	if fresh {
		pt.recordDef(tx, start, e.Meter, m)
	}
	isNew := false
	if m.Aggregation == UniqueCount {
		var err error
		if isNew, err = pt.seeUniqueOpen(tx, a, ak, uval); err != nil {
			return err
		}
	}
	apply(&a.st, fresh, e, m, isNew)
	// The state is written once per transaction, by Flush (or earlier by
	// materialize), not once per event.
	if !a.dirty {
		a.dirty = true
		pt.dirty = append(pt.dirty, a)
	}
	return nil
}

// late books an event of a final period as an adjustment: its delta is
// measured against the period's working state (the FINAL value plus the
// adjustments before it), which it then updates.
func (pt *partition) late(tx *stream.Tx, r *kgo.Record, e *schemas.DedupedEvent, m *Meter, start, end int64, ak []byte, uval string) error {
	k := periodKey(pfxFinal, start, ak)
	st, ok, err := pt.loadState(tx, k)
	if err != nil {
		return err
	}
	if ok && overflows(st, e, m) {
		return pt.rejectOverflow(tx, r, e, m, start, st)
	}
	if !ok {
		st = &aggState{} // no FINAL for this key: the final value was 0
	}
	isNew := false
	if m.Aggregation == UniqueCount {
		if isNew, err = pt.uniqueIsNew(tx, start, ak, uval); err != nil {
			return err
		}
	}
	// st is this call's copy: nothing of the event is in the transaction
	// until its adjustment is encoded.
	delta := apply(st, !ok, e, m, isNew)
	bStart, bEnd := pt.bounds(e.IngestTime)
	parts, _ := schemas.SplitFramed(ak)
	adj := &schemas.Adjustment{
		EventID: e.EventID, CustomerID: e.CustomerID, Meter: e.Meter, Group: groupOf(parts),
		Aggregation: string(m.Aggregation), OriginalPeriodStart: start, OriginalPeriodEnd: end,
		BookedPeriodStart: bStart, BookedPeriodEnd: bEnd, Delta: delta, Quantity: e.Quantity,
		EventTime: e.EventTime, IngestTime: e.IngestTime,
	}
	v, err := encode(adj)
	if err != nil {
		return pt.reject(tx, r, e, schemas.ReasonInvalid, "the event's adjustment cannot be encoded: "+err.Error())
	}
	if isNew {
		tx.Put(pt.uBuf, nil) // uniqueIsNew's key
	}
	if !ok {
		pt.keys++
		pt.recordDef(tx, start, e.Meter, m)
	}
	tx.Put(k, st.encode())
	if err := pt.bookLine(tx, bStart, ak, e.Meter, m); err != nil {
		return err
	}
	key := schemas.Identity{CustomerID: e.CustomerID, Meter: e.Meter, EventID: e.EventID}.Key()
	tx.Emit(&kgo.Record{Topic: pt.pr.cfg.Topics.AdjustmentsTopic(), Partition: schemas.Partition(key, pt.pr.counts.adjustments),
		Key: key, Value: v})
	pt.txc.Inc(pt.pr.m.late.WithLabelValues(string(m.Aggregation)))
	pt.pr.log.Info("late event booked as an adjustment", zap.ByteString("key", key), zap.Int64("delta", delta),
		zap.String("original_period", msTime(start)), zap.String("booked_period", msTime(bStart)))
	return nil
}
