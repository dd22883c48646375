package aggregator

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

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
//	'p' P seq        an event of P queued behind P's FINAL revisions (late
//	                 by arrival while P was open, or processed while its
//	                 FINALs were going out), booked as an adjustment after
//	                 them, in seq order
//	'F' P            P is final in this partition: periodState, the phase
//	                 of its chunked work and its cursor (finalize.go);
//	                 empty when done
//	'w' source       latest watermark from a dedup source partition
//	'n'              obsolete: the number of dedup source partitions as
//	                 watermark records once claimed it; never read (the
//	                 count comes from the cluster's metadata)
//	'c'              sequence counter for 'p' keys
const (
	pfxOpen    = 'a'
	pfxFinal   = 'f'
	pfxUnique  = 'u'
	pfxPending = 'p'
	pfxMarker  = 'F'
	pfxSource  = 'w'
)

var keySeq = []byte("c")

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
	sources []int64 // latest watermark per usage.events partition; 0: none
	wm      int64   // partition watermark: min over sources
	keys    int
	// finals holds the marker of every period final in this partition
	// (few: one per period until its end + W), as the state and the open
	// transaction have them.
	finals map[int64]*periodState
	// open caches OPEN aggregates (keyed by their state key) across
	// transactions, so that an event of a busy key costs no Pebble read, no
	// decode and no key split. Each equals the state as this partition's
	// transactions left it, plus the changes of the open transaction to
	// dirty aggregates, which reach the transaction (tx.Put) only in Flush
	// or materialize. An aborted transaction clears it; deciding a period
	// final drops the period's aggregates; overflow (maxCachedOpen) drops
	// clean ones.
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
	pendingGauge prometheus.Gauge // periods whose FINALs or queued adjustments are still going out
	wmGauge      prometheus.Gauge // nil until the first watermark
	due          dueRefresh       // the final-due gauge's last refresh (due.go)
	// Ignored watermark records since the last log line, and its time.
	wmIgnored      int
	wmIgnoredLogAt time.Time
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
	pt.pendingGauge = pr.m.finalizing.WithLabelValues(pt.pl)
	if err := pt.load(st); err != nil {
		return nil, err
	}
	pt.publish()
	pt.refreshFinalDue(st, true)
	return pt, nil
}

// load sets the in-memory watermarks and key count from the state.
func (pt *partition) load(st stateReader) error {
	pt.keys, pt.finals = 0, map[int64]*periodState{}
	if err := st.Scan([]byte{pfxMarker}, []byte{pfxMarker + 1}, func(k, v []byte) error {
		ps, err := decodePeriodState(v)
		if err != nil {
			return fmt.Errorf("%w (partition %d, key %q)", err, pt.p, k)
		}
		pt.finals[int64(binary.BigEndian.Uint64(k[1:9]))] = ps
		return nil
	}); err != nil {
		return err
	}
	// One slot per partition of usage.events, as the cluster's metadata
	// says (DESIGN §3). A source watermark of another count (state written
	// before the count came from metadata) is left out.
	pt.sources = make([]int64, pt.pr.counts.events)
	err := st.Scan([]byte{pfxSource}, []byte{pfxSource + 1}, func(k, v []byte) error {
		if len(k) != 5 || len(v) != 8 {
			return fmt.Errorf("aggregator: partition %d: corrupt source watermark %q", pt.p, k)
		}
		if s := int(binary.BigEndian.Uint32(k[1:])); s < len(pt.sources) {
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
	n := 0
	for _, ps := range pt.finals {
		if ps.phase == phaseEmit || ps.phase == phaseBook {
			n++
		}
	}
	pt.pendingGauge.Set(float64(n))
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
	pt.pr.m.finalizing.DeleteLabelValues(pt.pl)
	pt.pr.m.watermark.DeleteLabelValues(pt.pl)
	pt.pr.m.finalDue.DeleteLabelValues(pt.pl)
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
	pt.refreshFinalDue(tx, false)
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
			continue // its period was decided final in this transaction
		}
		a.dirty = false
		a.st.Revision++
		pt.stBuf = a.st.appendTo(pt.stBuf[:0])
		tx.Put(a.key, pt.stBuf)
		var err error
		if buf, err = pt.emitRevision(tx, &recs[i], buf, &a.out, pt.wm, &a.st, schemas.StatusOpen); err != nil {
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
		return pt.event(tx, r, &pt.ev, false)
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
		return pt.event(tx, r, m, false)
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
	// The number of sources is usage.events' partition count from the
	// cluster's metadata, never the record's claim: a record that disagrees
	// is counted, logged and ignored (DESIGN §3).
	n := pt.pr.counts.events
	switch {
	case w.SourcePartitions != n:
		pt.ignoreWatermark(w, "source_partitions")
		return nil
	case w.SourcePartition < 0 || w.SourcePartition >= n:
		pt.ignoreWatermark(w, "source_partition")
		return nil
	}
	if own := pt.pr.cfg.Window; w.WindowMs > own.Milliseconds() {
		// The working state of a final period is dropped at end + own W;
		// dedup accepts events for it until end + its W. A MAX,
		// UNIQUE_COUNT or LATEST adjustment in between would be measured
		// against nothing. Refuse, before anything of this record counts.
		theirs := time.Duration(w.WindowMs) * time.Millisecond
		return fmt.Errorf("%w: dedup's W is %s (watermark record of usage.events partition %d), the aggregator's %s; "+
			"run the aggregator with --window %s or more (partition %d is processed no further)",
			ErrWindowTooShort, theirs, w.SourcePartition, own, theirs, pt.p)
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
		// Periods whose end + grace it passed are decided final now;
		// their FINAL revisions, and the expiry of periods past end + W,
		// go out in chunks (Work).
		return pt.finalize(tx)
	}
	return nil
}

// ignoredLogEvery spaces the log lines of ignored watermark records of one
// partition (every dedup partition sends one per tick): the metric counts
// each record, the log says it is happening and what the records claim.
const ignoredLogEvery = time.Minute

// ignoreWatermark counts a watermark record that disagrees with the
// cluster's metadata and logs it (at most once a minute per partition,
// with the number of records ignored since the last line).
func (pt *partition) ignoreWatermark(w *schemas.Watermark, reason string) {
	pt.pr.m.wmIgnored.WithLabelValues(reason).Inc()
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
// queued: the event comes from its period's queue ('p'), behind the
// period's FINAL revisions; r is nil then.
func (pt *partition) event(tx *stream.Tx, r *kgo.Record, e *schemas.DedupedEvent, queued bool) error {
	c := &pt.pr.cfg
	if e.Quantity < 0 {
		// Dedup rejects these; a record of usage.deduped is still not
		// trusted to keep a sum from going down or wrapping.
		pt.reject(tx, r, e, schemas.ReasonInvalid, fmt.Sprintf("quantity: must not be negative (got %d)", e.Quantity))
		return nil
	}
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
	if queued {
		return pt.late(tx, r, e, m, start, end, ak, uval)
	}
	ps := pt.finals[start]
	if ps == nil && pt.wm > end+c.Grace.Milliseconds() {
		// DESIGN §3: the period is final once the watermark passed end +
		// grace, whether or not it had aggregates here (no marker:
		// finalize only decides periods with open or queued keys). An
		// event processed now (a re-routed event with its original
		// arrival, a broker clock that stepped back) is an adjustment,
		// not an OPEN aggregate that a later watermark would turn into a
		// second-round FINAL. Mark it, so that its state expires at end +
		// W.
		ps = pt.markFinal(tx, start)
	}
	switch {
	case ps == nil && e.IngestTime <= end+c.Grace.Milliseconds():
		return pt.onTime(tx, r, e, m, start, ak, uval)
	case ps == nil || ps.phase == phaseEmit || ps.phase == phaseBook:
		// Late by its own arrival while the period is not final here yet
		// (another source's watermark lags): its delta against the FINAL
		// value is not known yet. Or the period is final and its FINAL
		// revisions are still going out in chunks: the event is an
		// adjustment, booked behind them and behind the events queued
		// before it (DESIGN §3: deltas are against the final, in order).
		seq, err := pt.nextSeq(tx)
		if err != nil {
			return err
		}
		var sk [8]byte
		binary.BigEndian.PutUint64(sk[:], uint64(seq))
		tx.Put(periodKey(pfxPending, start, sk[:]), schemas.MustEncode(e))
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

// overflows reports whether folding e (quantity ≥ 0) into st would wrap
// a 64-bit value: st's SUM, or its event count (which COUNT and
// UNIQUE_COUNT values never exceed). MAX and LATEST take a quantity as it
// is, and a delta of two values in [0, MaxInt64] cannot wrap either.
func overflows(st *aggState, e *schemas.DedupedEvent, m *Meter) bool {
	return st.Count == math.MaxInt64 || (m.Aggregation == Sum && e.Quantity > math.MaxInt64-st.Value)
}

// rejectOverflow rejects an event that would wrap its aggregate (DESIGN
// §8: invalid, and counted in no aggregate).
func (pt *partition) rejectOverflow(tx *stream.Tx, r *kgo.Record, e *schemas.DedupedEvent, m *Meter, start int64, st *aggState) {
	what := "the " + string(m.Aggregation) + " of its aggregate"
	if st.Count == math.MaxInt64 {
		what = "the event count of its aggregate"
	}
	pt.reject(tx, r, e, schemas.ReasonInvalid, fmt.Sprintf(
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

func (pt *partition) onTime(tx *stream.Tx, r *kgo.Record, e *schemas.DedupedEvent, m *Meter, start int64, ak []byte, uval string) error {
	k := append(pt.okBuf[:0], pfxOpen)
	k = binary.BigEndian.AppendUint64(k, uint64(start))
	k = append(k, ak...)
	pt.okBuf = k
	a, fresh, err := pt.openAggregate(tx, k, start)
	if err != nil {
		return err
	}
	if !fresh && overflows(&a.st, e, m) {
		pt.rejectOverflow(tx, r, e, m, start, &a.st)
		return nil
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
// changed into the transaction, for a reader of the state itself (the
// scans of finalize, and the FINAL chunks, which read a decided period's
// values from it). The aggregates stay dirty: Flush still emits their OPEN
// revisions, unless their period is decided final.
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
func (pt *partition) late(tx *stream.Tx, r *kgo.Record, e *schemas.DedupedEvent, m *Meter, start, end int64, ak []byte, uval string) error {
	k := periodKey(pfxFinal, start, ak)
	st, ok, err := pt.loadState(tx, k)
	if err != nil {
		return err
	}
	if ok && overflows(st, e, m) {
		pt.rejectOverflow(tx, r, e, m, start, st)
		return nil
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
func (pt *partition) emitRevision(tx *stream.Tx, rec *kgo.Record, buf []byte, out *aggOut, updatedAt int64, st *aggState, status schemas.AggregateStatus) ([]byte, error) {
	off := len(buf)
	buf, err := schemas.AppendAggregateTail(append(buf, out.head...), &schemas.Aggregate{
		Revision: st.Revision, Status: status, Value: st.Value, EventCount: st.Count,
		FirstEventTime: st.FirstET, LastEventTime: st.LastET, UpdatedAt: updatedAt,
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
