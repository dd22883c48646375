package aggregator

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
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

func (s *aggState) encode() []byte { return s.appendTo(make([]byte, 0, 48+len(s.LatestID))) }

// appendTo appends the encoded state to b.
func (s *aggState) appendTo(b []byte) []byte {
	b = binary.AppendVarint(b, s.Revision)
	b = binary.AppendVarint(b, s.Value)
	b = binary.AppendVarint(b, s.Count)
	b = binary.AppendVarint(b, s.FirstET)
	b = binary.AppendVarint(b, s.LastET)
	b = binary.AppendVarint(b, s.LatestET)
	return append(b, s.LatestID...)
}

// aggOut is what every revision of one aggregate shares: its record key
// and partition in the aggregates topic, and the encoded head of its
// Aggregate message (schemas.AppendAggregateHead).
type aggOut struct {
	key  []byte
	part int32
	head []byte
}

// openAgg is a cached OPEN aggregate: its state key, period and decoded
// state, what its revisions share (out), made once when it is loaded, and
// the UNIQUE_COUNT values it is known to have seen.
type openAgg struct {
	key   []byte // 'a' P K
	start int64
	st    aggState
	out   aggOut
	// dirty: changed by the open transaction and listed in
	// partition.dirty; Flush writes the state and emits the revision.
	dirty bool
	// seen holds values of the meter's UNIQUE_COUNT property whose 'u' key
	// exists in the committed state or the open transaction: facts that
	// only an abort (which drops the cache) or the period's expiry (long
	// after its aggregates left the cache at FINAL) undo.
	seen map[string]struct{}
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
	cfg             Config
	aggregatesTopic string // cfg.Topics.AggregatesTopic(), made once
	log             *zap.Logger
	counts          partitionCountsT
	m               *metrics
	now             func() time.Time
}

type partition struct {
	pr      *processor
	p       int32
	pl      string
	sources []int64 // latest watermark per dedup source partition; 0: none
	wm      int64   // partition watermark: min over sources
	keys    int
	finals  map[int64]struct{} // periods final in this partition
	// open caches OPEN aggregates (keyed by their state key) across
	// transactions, so that an event of a busy key costs no Pebble read, no
	// decode and no key split. Each equals the state as this partition's
	// transactions left it, plus the changes of the open transaction to
	// dirty aggregates, which reach the transaction (tx.Put) only in Flush
	// or materialize. An aborted transaction clears it; a period's FINAL
	// drops the period's aggregates; overflow (maxCachedOpen) drops clean
	// ones.
	open map[string]*openAgg
	// dirty lists the aggregates the open transaction changed, in the
	// order it first changed them; Flush emits their revisions in that
	// order.
	dirty []*openAgg
	nSeen int // values in the seen sets of open, at most maxCachedSeen
	// Scratch buffers: the aggregate key K of the event being handled, its
	// state key, a unique-value key and an encoded state (tx.Put copies).
	akBuf, okBuf, uBuf, stBuf []byte
	// The period of the last Bounds call: events arrive in runs of one
	// period.
	bStart, bEnd int64
	bOK          bool
	ev           schemas.DedupedEvent // the event being handled, reused
	keysGauge    prometheus.Gauge
	wmGauge      prometheus.Gauge // nil until the first watermark
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
	pt := &partition{pr: pr, p: p, pl: strconv.Itoa(int(p)), open: map[string]*openAgg{}}
	pt.keysGauge = pr.m.keys.WithLabelValues(pt.pl)
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
	pt.keysGauge.Set(float64(pt.keys))
	if pt.wm > 0 {
		if pt.wmGauge == nil {
			pt.wmGauge = pt.pr.m.watermark.WithLabelValues(pt.pl)
		}
		pt.wmGauge.Set(float64(pt.wm) / 1000)
	}
}

// bounds is cfg.Period.Bounds, remembering the last period.
func (pt *partition) bounds(ms int64) (start, end int64) {
	if pt.bOK && ms >= pt.bStart && ms < pt.bEnd {
		return pt.bStart, pt.bEnd
	}
	pt.bStart, pt.bEnd = pt.pr.cfg.Period.Bounds(ms)
	pt.bOK = true
	return pt.bStart, pt.bEnd
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
	if len(pt.open) > maxCachedOpen+len(pt.dirty) {
		pt.evictClean()
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
	pt.dirty = pt.dirty[:0]
	clear(pt.open)
	pt.nSeen = 0
	pt.stale = true
}

// maxCachedOpen bounds the clean OPEN aggregates kept per partition (about
// 300 bytes each); maxCachedSeen the UNIQUE_COUNT values they remember.
const (
	maxCachedOpen = 1 << 15
	maxCachedSeen = 1 << 16
)

// evictClean drops the aggregates the open transaction did not change.
func (pt *partition) evictClean() {
	for k, a := range pt.open {
		if !a.dirty {
			pt.drop(k, a)
		}
	}
}

func (pt *partition) drop(k string, a *openAgg) {
	delete(pt.open, k)
	pt.nSeen -= len(a.seen)
}

// Flush emits one OPEN revision per aggregate this transaction changed, and
// writes its state. The revisions' values share one buffer, and their
// records one slice.
func (pt *partition) Flush(tx *stream.Tx) error {
	n, size := 0, 0
	for _, a := range pt.dirty {
		if a.dirty {
			n++
			size += len(a.out.head) + schemas.AggregateTailMax
		}
	}
	if n == 0 {
		pt.dirty = pt.dirty[:0]
		return nil
	}
	recs := make([]kgo.Record, n)
	buf := make([]byte, 0, size)
	i := 0
	for _, a := range pt.dirty {
		if !a.dirty {
			continue // finalized in this transaction
		}
		a.dirty = false
		a.st.Revision++
		pt.stBuf = a.st.appendTo(pt.stBuf[:0])
		tx.Put(a.key, pt.stBuf)
		var err error
		if buf, err = pt.emitRevision(tx, &recs[i], buf, &a.out, a.start, &a.st, schemas.StatusOpen); err != nil {
			return err
		}
		i++
	}
	pt.pr.m.emittedOpen.Add(float64(n))
	clear(pt.dirty)
	pt.dirty = pt.dirty[:0]
	return nil
}

func (pt *partition) handle(tx *stream.Tx, r *kgo.Record) error {
	// The common case, a DedupedEvent, is decoded into the partition's
	// reused event (it does not outlive the call: what is kept is copied or
	// encoded). Anything else, or a record that fails to decode, goes
	// through Decode, which says what it is or why it is undecodable.
	pt.ev = schemas.DedupedEvent{}
	if schemas.DecodeInto(r.Value, &pt.ev) == nil {
		return pt.event(tx, r, &pt.ev)
	}
	msg, err := schemas.Decode(r.Value)
	if err != nil {
		pt.rejectUndecodable(tx, r, err)
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

func (pt *partition) rejectUndecodable(tx *stream.Tx, r *kgo.Record, err error) {
	reason := schemas.ReasonUndecodable
	if errors.Is(err, schemas.ErrUnknownSchema) {
		reason = schemas.ReasonUnknownSchema
	}
	pt.reject(tx, r, nil, reason, err.Error())
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

// appendAggKey appends the aggregate key K of e: the framed customer,
// meter and group name/value pairs (a property given twice groups under its
// last value; a missing one under "").
func appendAggKey(dst []byte, e *schemas.DedupedEvent, m *Meter) []byte {
	dst = appendFramed(dst, e.CustomerID)
	dst = appendFramed(dst, e.Meter)
	for _, g := range m.GroupBy {
		v := ""
		for _, p := range e.Properties {
			if p.Name == g {
				v = p.Value
			}
		}
		dst = appendFramed(dst, g)
		dst = appendFramed(dst, v)
	}
	return dst
}

// appendFramed is schemas.AppendFramed of one part, for a part in a string
// or in bytes.
func appendFramed[T string | []byte](dst []byte, part T) []byte {
	dst = strconv.AppendInt(dst, int64(len(part)), 10)
	dst = append(dst, ':')
	return append(dst, part...)
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
	c := &pt.pr.cfg
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
	start, end := pt.bounds(e.EventTime)
	// ak is a scratch buffer: valid until the next event.
	pt.akBuf = appendAggKey(pt.akBuf[:0], e, m)
	ak := pt.akBuf
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
	k := append(pt.uBuf[:0], pfxUnique)
	k = binary.BigEndian.AppendUint64(k, uint64(start))
	k = appendFramed(k, ak)
	k = appendFramed(k, value)
	pt.uBuf = k
	_, seen, err := tx.Get(k)
	if err != nil || seen {
		return false, err
	}
	tx.Put(k, nil)
	return true, nil
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

// openAggregate returns the OPEN aggregate with state key k (a scratch
// buffer, copied if kept) through the cache, loading it from the state or
// making a fresh one (fresh) on a miss.
func (pt *partition) openAggregate(tx *stream.Tx, k []byte, start int64) (a *openAgg, fresh bool, err error) {
	if a, ok := pt.open[string(k)]; ok {
		return a, false, nil
	}
	st, ok, err := pt.loadState(tx, k)
	if err != nil {
		return nil, false, err
	}
	if !ok {
		st = &aggState{}
		pt.keys++
	}
	out, err := pt.aggOutput(k)
	if err != nil {
		return nil, false, err
	}
	a = &openAgg{key: bytes.Clone(k), start: start, st: *st, out: out}
	pt.open[string(a.key)] = a
	return a, !ok, nil
}

func (pt *partition) onTime(tx *stream.Tx, e *schemas.DedupedEvent, m *Meter, start int64, ak []byte, uval string) error {
	k := append(pt.okBuf[:0], pfxOpen)
	k = binary.BigEndian.AppendUint64(k, uint64(start))
	k = append(k, ak...)
	pt.okBuf = k
	a, fresh, err := pt.openAggregate(tx, k, start)
	if err != nil {
		return err
	}
	isNew := false
	if m.Aggregation == UniqueCount {
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

// materialize writes the cached state of every aggregate this transaction
// changed into the transaction, for a reader of the state itself (tx.Scan
// in finalizePeriod). The aggregates stay dirty: Flush still emits their
// OPEN revisions.
func (pt *partition) materialize(tx *stream.Tx) {
	for _, a := range pt.dirty {
		if a.dirty {
			pt.stBuf = a.st.appendTo(pt.stBuf[:0])
			tx.Put(a.key, pt.stBuf)
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
	isNew := false
	if m.Aggregation == UniqueCount {
		if isNew, err = pt.seeUnique(tx, start, ak, uval); err != nil {
			return err
		}
	}
	delta := apply(st, !ok, e, m, isNew)
	tx.Put(k, st.encode())
	bStart, bEnd := pt.bounds(e.IngestTime)
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
		_, end := pt.bounds(start)
		if pt.wm <= end+grace {
			return nil
		}
		if err := pt.finalizePeriod(tx, start, end); err != nil {
			return err
		}
	}
}

func (pt *partition) finalizePeriod(tx *stream.Tx, start, end int64) error {
	// The period's OPEN aggregates move to FINAL (finalize materialized
	// them): they leave the cache, and Flush emits no OPEN revision of them.
	for k, a := range pt.open {
		if a.start == start {
			a.dirty = false
			pt.drop(k, a)
		}
	}
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
		out, err := pt.aggOutput(o.k)
		if err != nil {
			return err
		}
		if _, err := pt.emitRevision(tx, &kgo.Record{}, nil, &out, start, st, schemas.StatusFinal); err != nil {
			return err
		}
		pt.pr.m.emittedFinal.Inc()
		tx.Delete(o.k)
		fk := append([]byte{pfxFinal}, o.k[1:]...)
		tx.Put(fk, st.encode())
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
		_, end := pt.bounds(start)
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

// aggOutput makes what every revision of the aggregate with state key k
// ('a' or 'f', P, K) shares.
func (pt *partition) aggOutput(k []byte) (aggOut, error) {
	start := int64(binary.BigEndian.Uint64(k[1:9]))
	_, end := pt.bounds(start)
	parts, err := schemas.SplitFramed(k[9:])
	if err != nil || len(parts) < 2 {
		return aggOut{}, fmt.Errorf("aggregator: corrupt aggregate key %q", k)
	}
	m, _ := pt.pr.cfg.Meters.Lookup(parts[1])
	head := schemas.AppendAggregateHead(nil, &schemas.Aggregate{
		CustomerID: parts[0], Meter: parts[1], Group: groupOf(parts), Aggregation: string(m.Aggregation),
		PeriodStart: start, PeriodEnd: end,
	})
	keyParts := append([]string{parts[0], parts[1], strconv.FormatInt(start, 10)}, parts[2:]...)
	key := schemas.AppendFramed(nil, keyParts...)
	return aggOut{key: key, part: schemas.Partition(key, pt.pr.counts.aggregates), head: head}, nil
}

// emitRevision appends a revision of the aggregate out, period start, state
// st to buf, points rec at it and emits rec. It returns buf, which the
// caller may append the next revision to: the record's value is a
// capacity-limited slice of it.
func (pt *partition) emitRevision(tx *stream.Tx, rec *kgo.Record, buf []byte, out *aggOut, start int64, st *aggState, status schemas.AggregateStatus) ([]byte, error) {
	off := len(buf)
	buf, err := schemas.AppendAggregateTail(append(buf, out.head...), &schemas.Aggregate{
		Revision: st.Revision, Status: status, Value: st.Value, EventCount: st.Count,
		FirstEventTime: st.FirstET, LastEventTime: st.LastET, UpdatedAt: pt.wm,
	})
	if err != nil {
		return buf, err
	}
	*rec = kgo.Record{Topic: pt.pr.aggregatesTopic, Partition: out.part, Key: out.key,
		Value: buf[off:len(buf):len(buf)]}
	tx.Emit(rec)
	return buf, nil
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
	rej.Bound() // raw bytes: a prefix, the length and a SHA-256 (DESIGN §6.10)
	tx.Emit(&kgo.Record{Topic: pt.pr.cfg.Topics.RejectedTopic(), Partition: part, Key: key, Value: schemas.MustEncode(rej)})
	pt.pr.m.rejected.WithLabelValues("aggregator", reason).Inc()
	pt.pr.log.Info("record rejected", zap.String("reason", reason), zap.String("detail", detail),
		zap.ByteString("key", key))
}

func msTime(ms int64) string { return time.UnixMilli(ms).UTC().Format(time.RFC3339Nano) }
