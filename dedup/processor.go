package dedup

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/meterline/meterline/internal/stream"
	"github.com/meterline/meterline/schemas"
)

// ErrPartitionCountChanged is returned when usage.events has another
// partition count than the one recorded in the state: keys would no longer
// map to the partitions their earlier copies are in, so dedup refuses to run.
var ErrPartitionCountChanged = errors.New("partition count of the events topic changed")

// Headers of a re-routed record (DESIGN §2).
const (
	// HeaderRerouted marks a record dedup re-produced to its canonical
	// partition; it is never re-routed again. Value: "<partition>/<offset>"
	// of the misrouted original.
	HeaderRerouted = "meterline-rerouted"
	// HeaderArrival carries the misrouted original's arrival time (epoch
	// ms), which stays the event's arrival time.
	HeaderArrival = "meterline-arrival"
)

// State keys. Identity keys are 'k' | bucket (4 bytes BE) | 16-byte hash.
var (
	keyPartitions = []byte("mN")
	keyWatermark  = []byte("mW")
)

// An identity is stored under the first 16 bytes of SHA-256 of its
// canonical key; the value keeps 4 more bytes of that hash (a hit must match
// on 160 bits, or it is a different identity and is never dropped), a
// 4-byte hash of the payload (for the conflict flag; a 2⁻³² miss flags a
// conflicting copy as exact, and both are dropped either way), the arrival
// within its bucket and the offset. About 42 bytes per key on disk.
const (
	prefixIdentity = 'k'
	hashLen        = 16
	verifyLen      = 4
	payloadLen     = 4
	identityKeyLen = 1 + 4 + hashLen
)

type processor struct {
	cfg    Config
	log    *zap.Logger
	counts partitionCountsT
	m      *metrics
	now    func() time.Time

	// The output topics' full names, built once: topics.Names builds them
	// on every call.
	eventsTopic, dedupedTopic, duplicatesTopic, rejectedTopic string
}

// setTopics caches the topic names of cfg.Topics.
func (pr *processor) setTopics() {
	t := pr.cfg.Topics
	pr.eventsTopic, pr.dedupedTopic = t.EventsTopic(), t.DedupedTopic()
	pr.duplicatesTopic, pr.rejectedTopic = t.DuplicatesTopic(), t.RejectedTopic()
}

type partition struct {
	pr      *processor
	p       int32
	pl      string // partition label
	wm      int64  // partition watermark, epoch ms; 0: none yet
	needN   bool   // the partition count is not in the state yet
	blooms  map[uint32]*bloom
	keys    map[uint32]int
	buckets []uint32 // live buckets, descending
	expired int64    // every bucket below this has been dropped; -1: none
	dropTo  int64    // drop buckets below this in the next transaction

	// Per-record scratch, reused: Process runs one record at a time.
	ev    schemas.UsageEvent
	canon []byte
	// accepted counts accepted events per source, added to the counters
	// at the end of each Process: WithLabelValues hashes the label on
	// every call, and an increment per event on a counter shared by the
	// partitions' goroutines contends for its cache line.
	accepted     map[string]*pendingCount
	lastAccepted *pendingCount // the entry of the last accepted event's source
	// recs is a slab of output records, handed out one at a time.
	recs []kgo.Record
	slab []byte // output key and value bytes (alloc)
}

type pendingCount struct {
	source string
	c      prometheus.Counter
	n      int
}

// flushCounts adds the accepted counts gathered since the last call.
func (pt *partition) flushCounts() {
	for _, pc := range pt.accepted {
		if pc.n > 0 {
			pc.c.Add(float64(pc.n))
			pc.n = 0
		}
	}
}

// newRecord returns a zero record from the partition's slab: one
// allocation per slab instead of one per output record. A slab stays alive
// until the client released all of its records.
func (pt *partition) newRecord() *kgo.Record {
	if len(pt.recs) == 0 {
		pt.recs = make([]kgo.Record, 256)
	}
	r := &pt.recs[0]
	pt.recs = pt.recs[1:]
	return r
}

// alloc returns an empty slice of capacity n carved from the partition's
// byte slab (64 KiB at a time): one allocation per slab instead of one per
// output record. A slab stays alive until the client released every
// record that points into it.
func (pt *partition) alloc(n int) []byte {
	const slab = 64 << 10
	if n > slab/8 {
		return make([]byte, 0, n)
	}
	if cap(pt.slab)-len(pt.slab) < n {
		pt.slab = make([]byte, 0, slab)
	}
	b := pt.slab[len(pt.slab) : len(pt.slab) : len(pt.slab)+n]
	pt.slab = pt.slab[:len(pt.slab)+n]
	return b
}

// Open rebuilds the in-memory filters from the restored state and checks
// the partition count.
func (pr *processor) Open(p int32, st *stream.PartitionState) (stream.Partition, error) {
	part := &partition{pr: pr, p: p, pl: strconv.Itoa(int(p)), blooms: map[uint32]*bloom{}, keys: map[uint32]int{},
		expired: -1, dropTo: -1, accepted: map[string]*pendingCount{}}
	v, ok, err := st.Get(keyPartitions)
	if err != nil {
		return nil, err
	}
	if ok {
		n := int32(binary.BigEndian.Uint32(v))
		if n != pr.counts.events {
			return nil, fmt.Errorf("dedup: partition %d: %w: the state was built with %d partitions of %s, it now has %d; adding partitions moves keys away from their earlier copies (DESIGN §2)",
				p, ErrPartitionCountChanged, n, pr.eventsTopic, pr.counts.events)
		}
	} else {
		part.needN = true
	}
	if v, ok, err := st.Get(keyWatermark); err != nil {
		return nil, err
	} else if ok {
		part.wm = int64(binary.BigEndian.Uint64(v))
	}
	err = st.Scan([]byte{prefixIdentity}, []byte{prefixIdentity + 1}, func(k, _ []byte) error {
		if len(k) != identityKeyLen {
			return fmt.Errorf("dedup: partition %d: corrupt identity key of %d bytes", p, len(k))
		}
		b := binary.BigEndian.Uint32(k[1:5])
		part.bloomFor(b).add(k[5:])
		part.keys[b]++
		return nil
	})
	if err != nil {
		return nil, err
	}
	// State replayed from the changelog may hold buckets that had expired;
	// drop them in the first transaction.
	part.scheduleExpiry()
	part.publish()
	return part, nil
}

func (pt *partition) bloomFor(b uint32) *bloom {
	f, ok := pt.blooms[b]
	if !ok {
		// Arrival buckets of a steady stream hold about as many keys as
		// the one before: size the new bucket's filter for that many.
		f = &bloom{}
		if len(pt.buckets) > 0 && pt.buckets[0] < b {
			f.first = pt.keys[pt.buckets[0]] + pt.keys[pt.buckets[0]]/4
		}
		pt.blooms[b] = f
		pt.buckets = append(pt.buckets, b)
		sort.Slice(pt.buckets, func(i, j int) bool { return pt.buckets[i] > pt.buckets[j] })
	}
	return f
}

// Close implements stream.Partition.
func (pt *partition) Close() {
	pt.pr.m.keys.DeleteLabelValues(pt.pl)
	pt.pr.m.watermark.DeleteLabelValues(pt.pl)
	pt.pr.m.wmDelay.DeleteLabelValues(pt.pl)
}

// Punctuate appends a tick to the partition's usage.events partition. Its
// broker timestamp, when read back, advances the watermark (DESIGN §3).
func (pt *partition) Punctuate(tx *stream.Tx) error {
	pt.begin(tx)
	tx.Emit(&kgo.Record{
		Topic:     pt.pr.eventsTopic,
		Partition: pt.p,
		Value:     schemas.MustEncode(&schemas.Tick{InstanceID: pt.pr.cfg.Stream.InstanceID}),
	})
	if pt.wm > 0 {
		pt.pr.m.wmDelay.WithLabelValues(pt.pl).Set(pt.pr.now().Sub(time.UnixMilli(pt.wm)).Seconds())
	}
	return nil
}

// begin writes what a transaction must carry on its first use: the
// partition count, and pending expiry.
func (pt *partition) begin(tx *stream.Tx) {
	if pt.needN {
		var v [4]byte
		binary.BigEndian.PutUint32(v[:], uint32(pt.pr.counts.events))
		tx.Put(keyPartitions, v[:])
		pt.needN = false
	}
	if pt.dropTo > pt.expired {
		lo := []byte{prefixIdentity, 0, 0, 0, 0}
		hi := make([]byte, 5)
		hi[0] = prefixIdentity
		binary.BigEndian.PutUint32(hi[1:], uint32(pt.dropTo))
		tx.DeleteRangeLocal(lo, hi)
		kept := pt.buckets[:0]
		for _, b := range pt.buckets {
			if int64(b) < pt.dropTo {
				delete(pt.blooms, b)
				delete(pt.keys, b)
				pt.pr.m.expired.Inc()
				continue
			}
			kept = append(kept, b)
		}
		pt.buckets = kept
		pt.expired = pt.dropTo
	}
}

// scheduleExpiry computes which buckets are past W + S at the watermark:
// bucket b holds first arrivals in [b·B, (b+1)·B), all of whose keys may go
// once the watermark reaches (b+1)·B + W + S.
func (pt *partition) scheduleExpiry() {
	if pt.wm <= 0 {
		return
	}
	c := pt.pr.cfg
	horizon := pt.wm - c.Window.Milliseconds() - c.Skew.Milliseconds()
	if horizon <= 0 {
		return
	}
	// (b+1)·B ≤ horizon ⇔ b < ⌊horizon/B⌋: buckets below that are expired.
	below := horizon / c.Bucket.Milliseconds()
	if below > pt.dropTo {
		pt.dropTo = below
	}
}

func (pt *partition) publish() {
	n := 0
	for _, k := range pt.keys {
		n += k
	}
	pt.pr.m.keys.WithLabelValues(pt.pl).Set(float64(n))
	if pt.wm > 0 {
		pt.pr.m.watermark.WithLabelValues(pt.pl).Set(float64(pt.wm) / 1000)
	}
}

// Process implements stream.Partition.
func (pt *partition) Process(tx *stream.Tx, recs []*kgo.Record) error {
	pt.begin(tx)
	wm0 := pt.wm
	defer pt.flushCounts()
	for _, r := range recs {
		if err := pt.handle(tx, r); err != nil {
			return err
		}
	}
	if pt.wm != wm0 {
		var v [8]byte
		binary.BigEndian.PutUint64(v[:], uint64(pt.wm))
		tx.Put(keyWatermark, v[:])
		pt.scheduleExpiry()
		pt.begin(tx) // drop buckets that just expired
	}
	pt.publish()
	return nil
}

// arrivalOf returns the record's arrival time: its broker timestamp, or for
// a record dedup re-routed, the original's arrival carried in a header
// (re-routing never makes an event late).
func arrivalOf(r *kgo.Record) (arrival int64, rerouted bool) {
	arrival = r.Timestamp.UnixMilli()
	for _, h := range r.Headers {
		if h.Key == HeaderRerouted {
			rerouted = true
		}
	}
	if !rerouted {
		return arrival, false
	}
	for _, h := range r.Headers {
		if h.Key == HeaderArrival {
			if v, err := strconv.ParseInt(string(h.Value), 10, 64); err == nil {
				arrival = v
			}
		}
	}
	return arrival, true
}

// handle decides one record. Bad input is rejected, never returned; an
// error means the local state could not be read, and stops the stage.
func (pt *partition) handle(tx *stream.Tx, r *kgo.Record) error {
	arrival, rerouted := arrivalOf(r)
	if arrival > pt.wm {
		pt.wm = arrival
	}
	if n := len(r.Key) + len(r.Value); n > schemas.MaxEventBytes {
		pt.reject(tx, r, nil, schemas.ReasonOversized, fmt.Sprintf("record is %d bytes, more than %d", n, schemas.MaxEventBytes))
		return nil
	}
	// Nearly every record is a UsageEvent: those are decoded into the
	// partition's reused value.
	msg, err := schemas.DecodeUsageOr(r.Value, &pt.ev)
	if err != nil {
		reason := schemas.ReasonUndecodable
		if errors.Is(err, schemas.ErrUnknownSchema) {
			reason = schemas.ReasonUnknownSchema
		}
		pt.reject(tx, r, nil, reason, err.Error())
		return nil
	}
	switch m := msg.(type) {
	case *schemas.Tick:
		pt.forwardWatermark(tx)
	case *schemas.UsageEvent:
		return pt.event(tx, r, m, arrival, rerouted)
	default:
		pt.reject(tx, r, nil, schemas.ReasonInvalid, fmt.Sprintf("record is a %s, not a UsageEvent or Tick", msg.Kind()))
	}
	return nil
}

// forwardWatermark sends the partition watermark to every usage.deduped
// partition; the aggregator takes the minimum over all sources.
func (pt *partition) forwardWatermark(tx *stream.Tx) {
	c := pt.pr.counts
	v := schemas.MustEncode(&schemas.Watermark{SourcePartition: pt.p, SourcePartitions: c.events, Watermark: pt.wm, WindowMs: pt.pr.cfg.Window.Milliseconds()})
	for i := int32(0); i < c.deduped; i++ {
		tx.Emit(&kgo.Record{Topic: pt.pr.dedupedTopic, Partition: i, Value: v})
	}
}

func (pt *partition) event(tx *stream.Tx, r *kgo.Record, e *schemas.UsageEvent, arrival int64, rerouted bool) error {
	if err := e.Validate(); err != nil {
		var fe *schemas.FieldError
		code := schemas.ReasonInvalid
		if errors.As(err, &fe) {
			code = fe.Code
		}
		pt.reject(tx, r, e, code, err.Error())
		return nil
	}
	pt.canon = schemas.AppendFramed(pt.canon[:0], e.CustomerID, e.Meter, e.EventID)
	canon := pt.canon // reused by the next record: clone what outlives this one
	n := pt.pr.counts.events
	if !rerouted && (r.Key == nil || !bytes.Equal(r.Key, canon) || r.Partition != schemas.Partition(canon, n)) {
		pt.reroute(tx, r, canon, arrival)
		return nil
	}
	c := pt.pr.cfg
	switch {
	case e.EventTime <= arrival-c.Window.Milliseconds():
		pt.reject(tx, r, e, schemas.ReasonTooOld, fmt.Sprintf("event_time %s is %s or more before its arrival %s (window W)",
			msTime(e.EventTime), c.Window, msTime(arrival)))
		return nil
	case e.EventTime > arrival+c.Skew.Milliseconds():
		pt.reject(tx, r, e, schemas.ReasonInFuture, fmt.Sprintf("event_time %s is more than %s after its arrival %s (skew S)",
			msTime(e.EventTime), c.Skew, msTime(arrival)))
		return nil
	}
	sum := sha256.Sum256(canon)
	kh, verify := sum[:hashLen], sum[hashLen:hashLen+verifyLen]
	ph := payloadHash(e)
	orig, ok, err := pt.lookup(tx, kh)
	if err != nil {
		return err
	}
	if ok {
		if !bytes.Equal(orig.verify, verify) {
			// A 128-bit prefix collision between two identities: never
			// drop a real event. Forward it without storing it.
			pt.pr.log.Error("identity hash prefix collision; forwarding without dedup state",
				zap.ByteString("key", canon), zap.Int32("partition", pt.p), zap.Int64("offset", r.Offset))
			pt.forward(tx, r, e, arrival)
			return nil
		}
		pt.duplicate(tx, r, e, canon, arrival, orig, !bytes.Equal(orig.payload, ph[:]))
		return nil
	}
	b := uint32(arrival / c.Bucket.Milliseconds())
	if int64(b) < pt.expired {
		// Arrival older than buckets already dropped: only a re-routed
		// record from long ago can be here, and it is outside the window
		// anyway; the window check above rejects it before this point.
		b = uint32(pt.expired)
	}
	var key [identityKeyLen]byte
	key[0] = prefixIdentity
	binary.BigEndian.PutUint32(key[1:5], b)
	copy(key[5:], kh)
	var val [maxValueLen]byte
	tx.Put(key[:], appendValue(val[:0], verify, ph[:], arrival-int64(b)*c.Bucket.Milliseconds(), r.Offset))
	pt.bloomFor(b).add(kh)
	pt.keys[b]++
	pt.forward(tx, r, e, arrival)
	return nil
}

type original struct {
	verify, payload []byte
	arrival         int64
	offset          int64
}

func (pt *partition) lookup(tx *stream.Tx, kh []byte) (original, bool, error) {
	var key [identityKeyLen]byte
	key[0] = prefixIdentity
	copy(key[5:], kh)
	for _, b := range pt.buckets {
		if !pt.blooms[b].mayContain(kh) {
			continue
		}
		binary.BigEndian.PutUint32(key[1:5], b)
		v, ok, err := tx.Get(key[:])
		if err != nil {
			// A read error of the local cache is not bad input: stop.
			return original{}, false, fmt.Errorf("dedup: partition %d: read state: %w", pt.p, err)
		}
		if !ok {
			continue
		}
		o, err := decodeValue(v)
		if err != nil {
			return original{}, false, fmt.Errorf("dedup: partition %d: %w", pt.p, err)
		}
		o.arrival += int64(b) * pt.pr.cfg.Bucket.Milliseconds()
		return o, true, nil
	}
	return original{}, false, nil
}

// maxValueLen bounds an identity value.
const maxValueLen = verifyLen + payloadLen + 2*binary.MaxVarintLen64

// appendValue appends the identity value to v.
func appendValue(v, verify, payload []byte, arrivalDelta, offset int64) []byte {
	v = append(v, verify[:verifyLen]...)
	v = append(v, payload[:payloadLen]...)
	v = binary.AppendUvarint(v, uint64(arrivalDelta))
	return binary.AppendUvarint(v, uint64(offset))
}

func decodeValue(v []byte) (original, error) {
	const fixed = verifyLen + payloadLen
	if len(v) < fixed+2 {
		return original{}, fmt.Errorf("corrupt identity value (%d bytes)", len(v))
	}
	o := original{verify: v[:verifyLen], payload: v[verifyLen:fixed]}
	rest := v[fixed:]
	a, n := binary.Uvarint(rest)
	if n <= 0 {
		return original{}, errors.New("corrupt identity value (arrival)")
	}
	off, m := binary.Uvarint(rest[n:])
	if m <= 0 {
		return original{}, errors.New("corrupt identity value (offset)")
	}
	o.arrival, o.offset = int64(a), int64(off)
	return o, nil
}

// payloadHash covers what makes two copies conflict: quantity, event_time
// and properties (DESIGN §2). source is not part of it.
func payloadHash(e *schemas.UsageEvent) [payloadLen]byte {
	// One pass over quantity, event_time and the framed properties: the
	// same hash as writing them to a digest one after another.
	var buf [256]byte
	b := binary.BigEndian.AppendUint64(buf[:0], uint64(e.Quantity))
	b = binary.BigEndian.AppendUint64(b, uint64(e.EventTime))
	for _, p := range e.Properties {
		b = schemas.AppendFramed(b, p.Name, p.Value)
	}
	var out [payloadLen]byte
	binary.BigEndian.PutUint32(out[:], uint32(xxhash.Sum64(b)))
	return out
}

func (pt *partition) forward(tx *stream.Tx, r *kgo.Record, e *schemas.UsageEvent, arrival int64) {
	// Key and value share one allocation; each is capped so that neither
	// append can run into the other.
	// The key frames customer_id and meter, which is how the canonical
	// key (pt.canon, framed customer_id, meter, event_id) of this event
	// starts.
	klen := framedLen(e.CustomerID) + framedLen(e.Meter)
	buf := pt.alloc(klen + len(r.Value) + 3*binary.MaxVarintLen64)
	key := append(buf, pt.canon[:klen]...)
	rest := key[len(key):len(key):cap(key)]
	key = key[:len(key):len(key)]
	val, ok := schemas.AppendDedupedFromRaw(rest, r.Value, arrival, r.Partition, r.Offset)
	if !ok { // written with an older schema: re-encode
		val = schemas.MustEncode(&schemas.DedupedEvent{
			EventID: e.EventID, CustomerID: e.CustomerID, Meter: e.Meter, Quantity: e.Quantity,
			EventTime: e.EventTime, Source: e.Source, Properties: e.Properties,
			IngestTime: arrival, SourcePartition: r.Partition, SourceOffset: r.Offset,
		})
	}
	rec := pt.newRecord()
	rec.Topic, rec.Partition, rec.Key, rec.Value = pt.pr.dedupedTopic, schemas.Partition(key, pt.pr.counts.deduped), key, val
	tx.Emit(rec)
	pc := pt.lastAccepted
	if pc == nil || pc.source != e.Source { // most events of a stream share a source
		var ok bool
		if pc, ok = pt.accepted[e.Source]; !ok {
			src := strings.Clone(e.Source)
			pc = &pendingCount{source: src, c: pt.pr.m.accepted.WithLabelValues(src)}
			pt.accepted[src] = pc
		}
		pt.lastAccepted = pc
	}
	pc.n++
}

// framedLen is the length of s framed by schemas.AppendFramed.
func framedLen(s string) int {
	n := len(s) + 2 // one digit and the colon
	for l := len(s); l >= 10; l /= 10 {
		n++
	}
	return n
}

func (pt *partition) duplicate(tx *stream.Tx, r *kgo.Record, e *schemas.UsageEvent, canon []byte, arrival int64, o original, conflict bool) {
	tx.Emit(&kgo.Record{
		Topic:     pt.pr.duplicatesTopic,
		Partition: schemas.Partition(canon, pt.pr.counts.duplicates),
		Key:       bytes.Clone(canon),
		Value: schemas.AppendDuplicate(nil, &schemas.Duplicate{
			EventID: e.EventID, CustomerID: e.CustomerID, Meter: e.Meter, Source: e.Source, Conflict: conflict,
			Quantity: e.Quantity, EventTime: e.EventTime,
			OriginalPartition: pt.p, OriginalOffset: o.offset, OriginalArrival: o.arrival,
			DuplicatePartition: r.Partition, DuplicateOffset: r.Offset, DuplicateArrival: arrival,
		}),
	})
	pt.pr.m.duplicates.WithLabelValues(e.Source, strconv.FormatBool(conflict)).Inc()
	pt.pr.log.Info("duplicate dropped", zap.ByteString("key", canon), zap.Bool("conflict", conflict),
		zap.String("source", e.Source), zap.Int32("partition", r.Partition), zap.Int64("offset", r.Offset),
		zap.Int64("original_offset", o.offset))
}

func (pt *partition) reroute(tx *stream.Tx, r *kgo.Record, canon []byte, arrival int64) {
	to := schemas.Partition(canon, pt.pr.counts.events)
	tx.Emit(&kgo.Record{
		Topic:     pt.pr.eventsTopic,
		Partition: to,
		Key:       bytes.Clone(canon),
		Value:     r.Value,
		Headers: []kgo.RecordHeader{
			{Key: HeaderRerouted, Value: []byte(fmt.Sprintf("%d/%d", r.Partition, r.Offset))},
			{Key: HeaderArrival, Value: []byte(strconv.FormatInt(arrival, 10))},
		},
	})
	pt.pr.m.rerouted.Inc()
	pt.pr.log.Info("misrouted record re-routed", zap.ByteString("key", r.Key), zap.ByteString("canonical_key", canon),
		zap.Int32("partition", r.Partition), zap.Int64("offset", r.Offset), zap.Int32("to_partition", to))
}

func (pt *partition) reject(tx *stream.Tx, r *kgo.Record, e *schemas.UsageEvent, reason, detail string) {
	rej := &schemas.Rejected{
		Reason: reason, Detail: detail, Stage: "dedup",
		SourceTopic: r.Topic, SourcePartition: r.Partition, SourceOffset: r.Offset,
		SourceTimestamp: r.Timestamp.UnixMilli(), RawKey: r.Key, RawValue: r.Value,
	}
	if e != nil {
		rej.CustomerID, rej.Meter, rej.EventID = e.CustomerID, e.Meter, e.EventID
	}
	n := pt.pr.counts.rejected
	part := r.Partition % n
	if len(r.Key) > 0 {
		part = schemas.Partition(r.Key, n)
	}
	tx.Emit(&kgo.Record{Topic: pt.pr.rejectedTopic, Partition: part, Key: r.Key, Value: schemas.MustEncode(rej)})
	pt.pr.m.rejected.WithLabelValues("dedup", reason).Inc()
	pt.pr.log.Info("record rejected", zap.String("reason", reason), zap.String("detail", detail),
		zap.ByteString("key", r.Key), zap.Int32("partition", r.Partition), zap.Int64("offset", r.Offset))
}

func msTime(ms int64) string { return time.UnixMilli(ms).UTC().Format(time.RFC3339Nano) }
