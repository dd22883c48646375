package aggregator

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/meterline/meterline/internal/fault"
	"github.com/meterline/meterline/internal/stream"
	"github.com/meterline/meterline/schemas"
)

// State keys. P is a period start (8 bytes big-endian, so keys sort by
// period); K is the aggregate key: the framed customer, meter and group
// name/value pairs.
//
//	'a' P K          open aggregate (aggState)
//	'f' P K          final aggregate's working state, kept until end + W
//	'u' P framed(K) framed(value)  a value UNIQUE_COUNT has seen in P
//	'p' P seq        a late event of P waiting for P's FINAL (its record)
//	'F' P            P is final in this partition
//	'w' source       latest watermark from a dedup source partition
//	'n'              number of dedup source partitions
//	'c'              sequence counter for 'p' keys
const (
	pfxOpen    = 'a'
	pfxFinal   = 'f'
	pfxUnique  = 'u'
	pfxPending = 'p'
	pfxMarker  = 'F'
	pfxSource  = 'w'
)

var (
	keySources = []byte("n")
	keySeq     = []byte("c")
)

func periodKey(prefix byte, start int64, rest ...[]byte) []byte {
	k := make([]byte, 9, 9+32)
	k[0] = prefix
	binary.BigEndian.PutUint64(k[1:], uint64(start))
	for _, r := range rest {
		k = append(k, r...)
	}
	return k
}

// aggState is an aggregate's working state.
type aggState struct {
	Revision int64
	Value    int64
	Count    int64
	FirstET  int64
	LastET   int64
	LatestET int64  // LATEST: event_time of Value
	LatestID string // LATEST: tie-break between equal event times
}

func (s *aggState) encode() []byte {
	b := make([]byte, 0, 48+len(s.LatestID))
	for _, v := range []int64{s.Revision, s.Value, s.Count, s.FirstET, s.LastET, s.LatestET} {
		b = binary.AppendVarint(b, v)
	}
	return append(b, s.LatestID...)
}

func decodeState(b []byte) (*aggState, error) {
	var vals [6]int64
	for i := range vals {
		v, n := binary.Varint(b)
		if n <= 0 {
			return nil, errors.New("aggregator: corrupt aggregate state")
		}
		vals[i], b = v, b[n:]
	}
	return &aggState{Revision: vals[0], Value: vals[1], Count: vals[2], FirstET: vals[3], LastET: vals[4],
		LatestET: vals[5], LatestID: string(b)}, nil
}

type processor struct {
	cfg    Config
	log    *zap.Logger
	counts partitionCountsT
	m      *metrics
	now    func() time.Time
}

type partition struct {
	pr      *processor
	p       int32
	pl      string
	sources []int64 // latest watermark per dedup source partition; 0: none
	wm      int64   // partition watermark: min over sources
	dirty   map[string]struct{}
	keys    int
	finals  map[int64]struct{} // periods final in this partition
	// open caches the decoded state of OPEN aggregates (keyed like the
	// state) across transactions, so that an event of a busy key costs no
	// Pebble read and no decode. It always equals the state as this
	// partition's transactions left it, plus the changes of the open
	// transaction to dirty keys, which reach the transaction (tx.Put) only
	// in Flush or materialize. An aborted transaction clears it;
	// finalization and overflow (maxCachedOpen) materialize, then clear it.
	open map[string]*aggState
	// stale: a transaction this partition took part in was aborted, so
	// sources, wm and keys (in memory, advanced by its records) may be
	// ahead of the committed state. Process reloads them from the state
	// before the re-consumed records are handled.
	stale bool
}

// stateReader is what Open (restored state) and a transaction both offer.
type stateReader interface {
	Get(k []byte) ([]byte, bool, error)
	Scan(lo, hi []byte, fn func(k, v []byte) error) error
}

// Open loads the watermarks from the restored state.
func (pr *processor) Open(p int32, st *stream.PartitionState) (stream.Partition, error) {
	pt := &partition{pr: pr, p: p, pl: strconv.Itoa(int(p)), dirty: map[string]struct{}{}, open: map[string]*aggState{}}
	if err := pt.load(st); err != nil {
		return nil, err
	}
	pt.publish()
	return pt, nil
}

// load sets the in-memory watermarks and key count from the state.
func (pt *partition) load(st stateReader) error {
	pt.sources, pt.keys, pt.finals = nil, 0, map[int64]struct{}{}
	if err := st.Scan([]byte{pfxMarker}, []byte{pfxMarker + 1}, func(k, _ []byte) error {
		pt.finals[int64(binary.BigEndian.Uint64(k[1:9]))] = struct{}{}
		return nil
	}); err != nil {
		return err
	}
	if v, ok, err := st.Get(keySources); err != nil {
		return err
	} else if ok {
		pt.sources = make([]int64, binary.BigEndian.Uint32(v))
	}
	err := st.Scan([]byte{pfxSource}, []byte{pfxSource + 1}, func(k, v []byte) error {
		s := int(binary.BigEndian.Uint32(k[1:]))
		if s < len(pt.sources) {
			pt.sources[s] = int64(binary.BigEndian.Uint64(v))
		}
		return nil
	})
	if err != nil {
		return err
	}
	pt.wm = minWatermark(pt.sources)
	for _, pfx := range []byte{pfxOpen, pfxFinal} {
		if err := st.Scan([]byte{pfx}, []byte{pfx + 1}, func(_, _ []byte) error { pt.keys++; return nil }); err != nil {
			return err
		}
	}
	return nil
}

func minWatermark(s []int64) int64 {
	if len(s) == 0 {
		return 0
	}
	m := s[0]
	for _, v := range s[1:] {
		if v < m {
			m = v
		}
	}
	return m
}

func (pt *partition) publish() {
	pt.pr.m.keys.WithLabelValues(pt.pl).Set(float64(pt.keys))
	if pt.wm > 0 {
		pt.pr.m.watermark.WithLabelValues(pt.pl).Set(float64(pt.wm) / 1000)
	}
}

// Close implements stream.Partition.
func (pt *partition) Close() {
	pt.pr.m.keys.DeleteLabelValues(pt.pl)
	pt.pr.m.watermark.DeleteLabelValues(pt.pl)
}

// Punctuate implements stream.Partition; the aggregator is driven by the
// watermark records in its input, never by a timer.
func (pt *partition) Punctuate(*stream.Tx) error { return nil }

// Process implements stream.Partition.
func (pt *partition) Process(tx *stream.Tx, recs []*kgo.Record) error {
	if pt.stale {
		// After an aborted transaction the input is re-consumed from the
		// committed offset. Without this reload, a re-consumed watermark
		// record would compare against the aborted transaction's in-memory
		// watermark, look old, and never decide the FINAL it decided
		// before (nor persist the source watermark).
		if err := pt.load(tx); err != nil {
			return err
		}
		pt.stale = false
	}
	if len(pt.open) > maxCachedOpen {
		pt.materialize(tx)
		clear(pt.open)
	}
	for _, r := range recs {
		if err := pt.handle(tx, r); err != nil {
			return err
		}
	}
	pt.publish()
	return nil
}

// Abort forgets the aggregates an aborted transaction changed, and marks
// the in-memory watermarks for a reload from the committed state.
func (pt *partition) Abort() {
	clear(pt.dirty)
	clear(pt.open)
	pt.stale = true
}

// maxCachedOpen bounds the decoded OPEN aggregates kept per partition
// (about 150 bytes each).
const maxCachedOpen = 1 << 15

// Flush emits one OPEN revision per aggregate this transaction changed.
func (pt *partition) Flush(tx *stream.Tx) error {
	keys := make([]string, 0, len(pt.dirty))
	for k := range pt.dirty {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		st, ok, err := pt.loadOpen(tx, []byte(k))
		if err != nil {
			return err
		}
		if !ok {
			continue // finalized in this transaction
		}
		st.Revision++
		tx.Put([]byte(k), st.encode())
		if err := pt.emitAggregate(tx, []byte(k), st, schemas.StatusOpen); err != nil {
			return err
		}
	}
	clear(pt.dirty)
	return nil
}

func (pt *partition) handle(tx *stream.Tx, r *kgo.Record) error {
	msg, err := schemas.Decode(r.Value)
	if err != nil {
		reason := schemas.ReasonUndecodable
		if errors.Is(err, schemas.ErrUnknownSchema) {
			reason = schemas.ReasonUnknownSchema
		}
		pt.reject(tx, r, nil, reason, err.Error())
		return nil
	}
	switch m := msg.(type) {
	case *schemas.Watermark:
		return pt.watermark(tx, m)
	case *schemas.DedupedEvent:
		return pt.event(tx, r, m)
	default:
		pt.reject(tx, r, nil, schemas.ReasonInvalid, fmt.Sprintf("record is a %s, not a DedupedEvent or Watermark", msg.Kind()))
		return nil
	}
}

func (pt *partition) watermark(tx *stream.Tx, w *schemas.Watermark) error {
	n := int(w.SourcePartitions)
	if n <= 0 || w.SourcePartition < 0 || int(w.SourcePartition) >= n {
		return nil // not from a dedup stage we know how to read; ignore
	}
	if n != len(pt.sources) {
		grown := make([]int64, n)
		copy(grown, pt.sources)
		pt.sources = grown
		var v [4]byte
		binary.BigEndian.PutUint32(v[:], uint32(n))
		tx.Put(keySources, v[:])
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
		pt.wm = wm
		if err := pt.finalize(tx); err != nil {
			return err
		}
		return pt.expire(tx)
	}
	return nil
}

func (pt *partition) aggKey(e *schemas.DedupedEvent, m *Meter) []byte {
	parts := []string{e.CustomerID, e.Meter}
	if len(m.GroupBy) > 0 {
		props := schemas.PropertyMap(e.Properties)
		for _, g := range m.GroupBy {
			parts = append(parts, g, props[g])
		}
	}
	return schemas.AppendFramed(nil, parts...)
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
// r is nil for a late event held back for its period's FINAL.
func (pt *partition) event(tx *stream.Tx, r *kgo.Record, e *schemas.DedupedEvent) error {
	c := pt.pr.cfg
	m, declared := c.Meters.Lookup(e.Meter)
	if !declared && c.StrictMeters {
		pt.reject(tx, r, e, schemas.ReasonUnknownMeter, fmt.Sprintf("meter %q is not declared in the meters file", e.Meter))
		return nil
	}
	var uval string
	if m.Aggregation == UniqueCount {
		v, ok := propValue(e, m.Property)
		if !ok {
			pt.reject(tx, r, e, schemas.ReasonInvalid, fmt.Sprintf("properties.%s: missing; meter %s counts its unique values", m.Property, e.Meter))
			return nil
		}
		uval = v
	}
	start, end := c.Period.Bounds(e.EventTime)
	ak := pt.aggKey(e, m)
	final, err := pt.isFinal(tx, start)
	if err != nil {
		return err
	}
	if !final && pt.wm > end+c.Grace.Milliseconds() {
		// DESIGN §3: the period is final once the watermark passed end +
		// grace, whether or not it had aggregates here (no marker: finalize
		// only marks periods with open or pending keys). An event processed
		// now (a re-routed event with its original arrival, a broker clock
		// that stepped back) is an adjustment, not an OPEN aggregate that a
		// later watermark would turn into a second-round FINAL. Mark it, so
		// expire drops the adjustment state at end + W.
		pt.markFinal(tx, start)
		final = true
	}
	lateByArrival := e.IngestTime > end+c.Grace.Milliseconds()
	switch {
	case !lateByArrival && !final:
		return pt.onTime(tx, e, m, start, ak, uval)
	case !final:
		// Late by its own arrival, but the period is not final here yet
		// (another source's watermark lags): its delta against the FINAL
		// value is not known. Hold it; finalize books it right after the
		// FINAL revisions (DESIGN §3: deltas are against the final).
		seq, err := pt.nextSeq(tx)
		if err != nil {
			return err
		}
		var sk [8]byte
		binary.BigEndian.PutUint64(sk[:], uint64(seq))
		tx.Put(periodKey(pfxPending, start, sk[:]), schemas.MustEncode(e))
		return nil
	default:
		return pt.late(tx, e, m, start, end, ak, uval)
	}
}

// isFinal reports whether period start is final in this partition. The
// markers are few (one per period) and kept in memory, loaded with the
// rest of the partition's state and reloaded after an aborted transaction;
// the state key is their durable form.
func (pt *partition) isFinal(_ *stream.Tx, start int64) (bool, error) {
	_, ok := pt.finals[start]
	return ok, nil
}

func (pt *partition) markFinal(tx *stream.Tx, start int64) {
	tx.Put(periodKey(pfxMarker, start), nil)
	pt.finals[start] = struct{}{}
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
	k := periodKey(pfxUnique, start, schemas.AppendFramed(nil, string(ak)), schemas.AppendFramed(nil, value))
	_, seen, err := tx.Get(k)
	if err != nil || seen {
		return false, err
	}
	tx.Put(k, nil)
	return true, nil
}

// apply folds the event into st and returns the change in value.
func (pt *partition) apply(tx *stream.Tx, st *aggState, fresh bool, e *schemas.DedupedEvent, m *Meter, start int64, ak []byte, uval string) (int64, error) {
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
		isNew, err := pt.seeUnique(tx, start, ak, uval)
		if err != nil {
			return 0, err
		}
		if isNew {
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
	return st.Value - before, nil
}

// loadOpen reads an OPEN aggregate through the cache. The state returned
// is the cached one: the caller changes it and writes it with tx.Put.
func (pt *partition) loadOpen(tx *stream.Tx, k []byte) (*aggState, bool, error) {
	if st, ok := pt.open[string(k)]; ok {
		return st, true, nil
	}
	st, ok, err := pt.loadState(tx, k)
	if ok {
		pt.open[string(k)] = st
	}
	return st, ok, err
}

func (pt *partition) onTime(tx *stream.Tx, e *schemas.DedupedEvent, m *Meter, start int64, ak []byte, uval string) error {
	k := periodKey(pfxOpen, start, ak)
	st, ok, err := pt.loadOpen(tx, k)
	if err != nil {
		return err
	}
	if !ok {
		st = &aggState{}
		pt.keys++
		pt.open[string(k)] = st
	}
	if _, err := pt.apply(tx, st, !ok, e, m, start, ak, uval); err != nil {
		return err
	}
	// The state is written once per transaction, by Flush (or earlier by
	// materialize), not once per event.
	if _, ok := pt.dirty[string(k)]; !ok {
		pt.dirty[string(k)] = struct{}{}
	}
	return nil
}

// materialize writes the cached state of every aggregate this transaction
// changed into the transaction, for a reader of the state itself (tx.Scan
// in finalizePeriod) or before the cache is dropped. The keys stay dirty:
// Flush still emits their OPEN revisions.
func (pt *partition) materialize(tx *stream.Tx) {
	for k := range pt.dirty {
		if st, ok := pt.open[k]; ok {
			tx.Put([]byte(k), st.encode())
		}
	}
}

// late books an event of a final period as an adjustment: its delta is
// measured against the period's working state (the FINAL value plus the
// adjustments before it), which it then updates.
func (pt *partition) late(tx *stream.Tx, e *schemas.DedupedEvent, m *Meter, start, end int64, ak []byte, uval string) error {
	k := periodKey(pfxFinal, start, ak)
	st, ok, err := pt.loadState(tx, k)
	if err != nil {
		return err
	}
	if !ok {
		st = &aggState{} // no FINAL for this key: the final value was 0
		pt.keys++
	}
	delta, err := pt.apply(tx, st, !ok, e, m, start, ak, uval)
	if err != nil {
		return err
	}
	tx.Put(k, st.encode())
	bStart, bEnd := pt.pr.cfg.Period.Bounds(e.IngestTime)
	parts, _ := schemas.SplitFramed(ak)
	adj := &schemas.Adjustment{
		EventID: e.EventID, CustomerID: e.CustomerID, Meter: e.Meter, Group: groupOf(parts),
		Aggregation: string(m.Aggregation), OriginalPeriodStart: start, OriginalPeriodEnd: end,
		BookedPeriodStart: bStart, BookedPeriodEnd: bEnd, Delta: delta, Quantity: e.Quantity,
		EventTime: e.EventTime, IngestTime: e.IngestTime,
	}
	key := schemas.Identity{CustomerID: e.CustomerID, Meter: e.Meter, EventID: e.EventID}.Key()
	tx.Emit(&kgo.Record{Topic: pt.pr.cfg.Topics.AdjustmentsTopic(), Partition: schemas.Partition(key, pt.pr.counts.adjustments),
		Key: key, Value: schemas.MustEncode(adj)})
	pt.pr.m.late.WithLabelValues(string(m.Aggregation)).Inc()
	pt.pr.log.Info("late event booked as an adjustment", zap.ByteString("key", key), zap.Int64("delta", delta),
		zap.String("original_period", msTime(start)), zap.String("booked_period", msTime(bStart)))
	return nil
}

func groupOf(parts []string) []schemas.Property {
	var g []schemas.Property
	for i := 2; i+1 < len(parts); i += 2 {
		g = append(g, schemas.Property{Name: parts[i], Value: parts[i+1]})
	}
	return g
}

var errStop = errors.New("stop")

// firstPeriod returns the smallest period start with a key of prefix pfx.
func firstPeriod(tx *stream.Tx, pfx byte) (int64, bool, error) {
	var start int64
	found := false
	err := tx.Scan([]byte{pfx}, []byte{pfx + 1}, func(k, _ []byte) error {
		start, found = int64(binary.BigEndian.Uint64(k[1:9])), true
		return errStop
	})
	if err != nil && !errors.Is(err, errStop) {
		return 0, false, err
	}
	return start, found, nil
}

// finalize emits exactly one FINAL revision per aggregate of every period
// whose end + grace the watermark has passed, marks those periods final,
// and then books the late events that waited for them. State change and
// emission are in the same transaction: a crash before the commit leaves
// neither, and the watermark decides again after the restart.
func (pt *partition) finalize(tx *stream.Tx) error {
	grace := pt.pr.cfg.Grace.Milliseconds()
	// The scans below read the transaction: it must hold the aggregates
	// changed so far.
	pt.materialize(tx)
	for {
		s1, ok1, err := firstPeriod(tx, pfxOpen)
		if err != nil {
			return err
		}
		s2, ok2, err := firstPeriod(tx, pfxPending)
		if err != nil {
			return err
		}
		if !ok1 && !ok2 {
			return nil
		}
		start := s1
		if !ok1 || (ok2 && s2 < s1) {
			start = s2
		}
		_, end := pt.pr.cfg.Period.Bounds(start)
		if pt.wm <= end+grace {
			return nil
		}
		if err := pt.finalizePeriod(tx, start, end); err != nil {
			return err
		}
	}
}

func (pt *partition) finalizePeriod(tx *stream.Tx, start, end int64) error {
	clear(pt.open) // the period's OPEN aggregates move to FINAL (finalize materialized them)
	lo, hi := periodKey(pfxOpen, start), periodKey(pfxOpen, start+1)
	type kv struct{ k, v []byte }
	var open []kv
	if err := tx.Scan(lo, hi, func(k, v []byte) error {
		open = append(open, kv{append([]byte{}, k...), append([]byte{}, v...)})
		return nil
	}); err != nil {
		return err
	}
	for _, o := range open {
		st, err := decodeState(o.v)
		if err != nil {
			return err
		}
		st.Revision++
		if err := pt.emitAggregate(tx, o.k, st, schemas.StatusFinal); err != nil {
			return err
		}
		tx.Delete(o.k)
		fk := append([]byte{pfxFinal}, o.k[1:]...)
		tx.Put(fk, st.encode())
		delete(pt.dirty, string(o.k))
	}
	pt.markFinal(tx, start)
	// Guarantee: the FINAL revisions and the state move are in the open
	// transaction only; a crash here aborts both and the watermark decides
	// again after the restart (exactly one FINAL per key).
	fault.Hit(fault.FinalDecided)
	if len(open) > 0 {
		pt.pr.m.finalDelay.Observe(pt.pr.now().Sub(time.UnixMilli(end + pt.pr.cfg.Grace.Milliseconds())).Seconds())
		pt.pr.log.Info("period finalized", zap.Int32("partition", pt.p), zap.String("period_start", msTime(start)),
			zap.Int("aggregates", len(open)), zap.String("watermark", msTime(pt.wm)))
	}
	// Late events that waited for this FINAL, in arrival order of their
	// processing.
	var pending []kv
	if err := tx.Scan(periodKey(pfxPending, start), periodKey(pfxPending, start+1), func(k, v []byte) error {
		pending = append(pending, kv{append([]byte{}, k...), append([]byte{}, v...)})
		return nil
	}); err != nil {
		return err
	}
	for _, p := range pending {
		var e schemas.DedupedEvent
		if err := schemas.DecodeInto(p.v, &e); err != nil {
			return fmt.Errorf("aggregator: pending late event: %w", err)
		}
		tx.Delete(p.k)
		if err := pt.event(tx, nil, &e); err != nil {
			return err
		}
	}
	return nil
}

// expire drops the state of periods whose end + W the watermark passed: no
// event for them can arrive any more (dedup rejects event times older than
// W before arrival). Deletions are written to the changelog (tombstones), so
// the compacted changelog does not grow without bound.
func (pt *partition) expire(tx *stream.Tx) error {
	w := pt.pr.cfg.Window.Milliseconds()
	for {
		start, ok, err := firstPeriod(tx, pfxMarker)
		if err != nil || !ok {
			return err
		}
		_, end := pt.pr.cfg.Period.Bounds(start)
		if pt.wm < end+w {
			return nil
		}
		for _, pfx := range []byte{pfxFinal, pfxUnique} {
			var ks [][]byte
			if err := tx.Scan(periodKey(pfx, start), periodKey(pfx, start+1), func(k, _ []byte) error {
				ks = append(ks, append([]byte{}, k...))
				return nil
			}); err != nil {
				return err
			}
			for _, k := range ks {
				tx.Delete(k)
				if pfx == pfxFinal {
					pt.keys--
				}
			}
		}
		tx.Delete(periodKey(pfxMarker, start))
		delete(pt.finals, start)
	}
}

func (pt *partition) emitAggregate(tx *stream.Tx, k []byte, st *aggState, status schemas.AggregateStatus) error {
	start := int64(binary.BigEndian.Uint64(k[1:9]))
	_, end := pt.pr.cfg.Period.Bounds(start)
	parts, err := schemas.SplitFramed(k[9:])
	if err != nil || len(parts) < 2 {
		return fmt.Errorf("aggregator: corrupt aggregate key %q", k)
	}
	m, _ := pt.pr.cfg.Meters.Lookup(parts[1])
	agg := &schemas.Aggregate{
		CustomerID: parts[0], Meter: parts[1], Group: groupOf(parts), Aggregation: string(m.Aggregation),
		PeriodStart: start, PeriodEnd: end, Revision: st.Revision, Status: status, Value: st.Value,
		EventCount: st.Count, FirstEventTime: st.FirstET, LastEventTime: st.LastET, UpdatedAt: pt.wm,
	}
	keyParts := append([]string{parts[0], parts[1], strconv.FormatInt(start, 10)}, parts[2:]...)
	key := schemas.AppendFramed(nil, keyParts...)
	tx.Emit(&kgo.Record{Topic: pt.pr.cfg.Topics.AggregatesTopic(), Partition: schemas.Partition(key, pt.pr.counts.aggregates),
		Key: key, Value: schemas.MustEncode(agg)})
	pt.pr.m.emitted.WithLabelValues(string(status)).Inc()
	return nil
}

func (pt *partition) reject(tx *stream.Tx, r *kgo.Record, e *schemas.DedupedEvent, reason, detail string) {
	rej := &schemas.Rejected{Reason: reason, Detail: detail, Stage: "aggregator"}
	if r != nil {
		rej.SourceTopic, rej.SourcePartition, rej.SourceOffset = r.Topic, r.Partition, r.Offset
		rej.SourceTimestamp, rej.RawKey, rej.RawValue = r.Timestamp.UnixMilli(), r.Key, r.Value
	}
	if e != nil {
		rej.CustomerID, rej.Meter, rej.EventID = e.CustomerID, e.Meter, e.EventID
		if r == nil {
			rej.RawValue = schemas.MustEncode(e)
		}
	}
	key := rej.RawKey
	part := pt.p % pt.pr.counts.rejected
	if len(key) > 0 {
		part = schemas.Partition(key, pt.pr.counts.rejected)
	}
	tx.Emit(&kgo.Record{Topic: pt.pr.cfg.Topics.RejectedTopic(), Partition: part, Key: key, Value: schemas.MustEncode(rej)})
	pt.pr.m.rejected.WithLabelValues("aggregator", reason).Inc()
	pt.pr.log.Info("record rejected", zap.String("reason", reason), zap.String("detail", detail),
		zap.ByteString("key", key))
}

func msTime(ms int64) string { return time.UnixMilli(ms).UTC().Format(time.RFC3339Nano) }
