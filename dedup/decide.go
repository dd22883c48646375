package dedup

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/meterline/meterline/internal/stream"
	"github.com/meterline/meterline/internal/topics"
	"github.com/meterline/meterline/schemas"
)

// Process implements stream.Partition.
func (pt *partition) Process(tx *stream.Tx, recs []*kgo.Record) error {
	if err := pt.begin(tx); err != nil {
		return err
	}
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
		if err := pt.begin(tx); err != nil { // drop buckets that just expired
			return err
		}
	}
	pt.publish()
	return nil
}

// handle decides one record. Bad input is rejected, never returned; an
// error means the local state could not be read, and stops the stage.
func (pt *partition) handle(tx *stream.Tx, r *kgo.Record) error {
	// New checked that usage.events uses LogAppendTime. A CreateTime
	// record after a LogAppendTime one means the setting was changed since:
	// its timestamp is its producer's choice, never an arrival.
	if !pt.pr.cfg.AllowCreateTime {
		if r.Attrs.TimestampType() == 1 {
			if !pt.logAppend {
				pt.logAppend = true
				tx.Put(keyLogAppend, []byte{1}) // again with the metadata after an abort
			}
		} else if pt.logAppend {
			return &topics.TimestampTypeError{Stage: "dedup", Topic: r.Topic, Have: "CreateTime",
				Record: fmt.Sprintf("partition %d offset %d", r.Partition, r.Offset)}
		}
	}
	// The watermark is the largest broker timestamp seen: no header moves
	// it (docs/design.md, Event identity and keys).
	ts := r.Timestamp.UnixMilli()
	if ts > pt.wm {
		pt.wm = ts
	}
	var h dedupHeaders
	if len(r.Headers) > 0 {
		h = scanHeaders(r.Headers)
	}
	if n := len(r.Key) + len(r.Value); n > schemas.MaxEventBytes {
		pt.notEvent(r, &h)
		return pt.reject(tx, r, nil, schemas.ReasonOversized, fmt.Sprintf("record is %d bytes, more than %d", n, schemas.MaxEventBytes))
	}
	// Nearly every record is a UsageEvent: those are decoded into the
	// partition's reused value.
	msg, err := schemas.DecodeUsageOr(r.Value, &pt.ev)
	if err != nil {
		reason := schemas.ReasonUndecodable
		if errors.Is(err, schemas.ErrUnknownSchema) {
			reason = schemas.ReasonUnknownSchema
		}
		pt.notEvent(r, &h)
		return pt.reject(tx, r, nil, reason, err.Error())
	}
	switch m := msg.(type) {
	case *schemas.Tick:
		tx.TimeRecord(r)
		return pt.tick(tx, r, m, &h, ts)
	case *schemas.UsageEvent:
		arrival, proven := pt.arrivalOf(r, &h, ts)
		return pt.event(tx, r, m, arrival, proven)
	}
	pt.notEvent(r, &h)
	return pt.reject(tx, r, nil, schemas.ReasonInvalid, fmt.Sprintf("record is a %s, not a UsageEvent or Tick", msg.Kind()))
}

// notEvent counts dedup's headers on a record that is no event: dedup
// never re-routes one, so they are forged.
func (pt *partition) notEvent(r *kgo.Record, h *dedupHeaders) {
	if h.any {
		pt.forged(r, "dedup headers on a record that is not an event")
	}
}

func (pt *partition) event(tx *stream.Tx, r *kgo.Record, e *schemas.UsageEvent, arrival int64, proven bool) error {
	if err := e.Validate(); err != nil {
		var fe *schemas.FieldError
		code := schemas.ReasonInvalid
		if errors.As(err, &fe) {
			code = fe.Code
		}
		return pt.reject(tx, r, e, code, err.Error())
	}
	pt.canon = schemas.AppendFramed(pt.canon[:0], e.CustomerID, e.Meter, e.EventID)
	canon := pt.canon // reused by the next record: clone what outlives this one
	n := pt.pr.counts.events
	// Every record is checked, a proven re-routed one too: dedup wrote
	// those with the canonical key to the canonical partition, and the
	// signature covers both, so a proven record that fails here cannot be
	// one dedup wrote.
	if r.Key == nil || !bytes.Equal(r.Key, canon) || r.Partition != schemas.Partition(canon, n) {
		if proven {
			pt.forged(r, "re-routed record not at its canonical key and partition")
			arrival = r.Timestamp.UnixMilli()
		}
		// Re-routed, the record weighs its canonical key and its value:
		// one over the limit would come back as a record dedup rejects.
		if n := len(canon) + len(r.Value); n > schemas.MaxEventBytes {
			return pt.reject(tx, r, e, schemas.ReasonOversized,
				fmt.Sprintf("record with its canonical key is %d bytes, more than %d", n, schemas.MaxEventBytes))
		}
		return pt.reroute(tx, r, canon, e, arrival)
	}
	c := pt.pr.cfg
	switch {
	case e.EventTime <= arrival-c.Window.Milliseconds():
		return pt.reject(tx, r, e, schemas.ReasonTooOld, fmt.Sprintf("event_time %s is %s or more before its arrival %s (window W)",
			msTime(e.EventTime), c.Window, msTime(arrival)))
	case e.EventTime > arrival+c.Skew.Milliseconds():
		return pt.reject(tx, r, e, schemas.ReasonInFuture, fmt.Sprintf("event_time %s is more than %s after its arrival %s (skew S)",
			msTime(e.EventTime), c.Skew, msTime(arrival)))
	case e.EventTime-expirySkew(&c, pt.skew, pt.wm) < pt.expiredBefore():
		// Any earlier copy first arrived at or after event_time − S, and
		// the keys of first arrivals before expiredBefore are gone (or go
		// at the end of this batch): a copy could not be recognised. Only
		// an arrival older than the watermark gets here (a re-routed
		// record, which keeps an arrival up to W before its broker
		// timestamp, or a broker clock that stepped back), or one that a
		// W or S raised since admits. Judged by the watermark, the largest
		// broker timestamp up to this record, and by the committed state,
		// so the decision is the same however the records are batched.
		return pt.reject(tx, r, e, schemas.ReasonTooOld, fmt.Sprintf(
			"event_time %s is within %s of %s, before which the keys of first arrivals have expired (the partition watermark is %s), so a copy could not be recognised",
			msTime(e.EventTime), time.Duration(expirySkew(&c, pt.skew, pt.wm))*time.Millisecond, msTime(pt.expiredBefore()), msTime(pt.wm)))
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
			_, err := pt.forward(tx, r, e, arrival)
			return err
		}
		return pt.duplicate(tx, r, e, canon, arrival, orig, !bytes.Equal(orig.payload, ph[:]))
	}
	// Forwarded first: an event rejected instead leaves no state, so that a
	// later copy is judged as the first.
	if fwd, err := pt.forward(tx, r, e, arrival); !fwd || err != nil {
		return err
	}
	b := uint32(arrival / c.Bucket.Milliseconds())
	if int64(b) < pt.expired {
		// Arrival older than buckets already dropped. The expiry check
		// above rejects such an event (its event_time ≤ arrival + S);
		// should one get here, its key goes to the oldest live bucket.
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
	if n := len(pt.txKeys); n > 0 && pt.txKeys[n-1].b == b {
		pt.txKeys[n-1].n++
	} else {
		pt.txKeys = append(pt.txKeys, bucketKeys{b: b, n: 1})
	}
	return nil
}

// encode is schemas.Encode: the re-encoding of an event read in an older
// schema. Tests replace it to see that a failure rejects the event instead
// of stopping the stage.
var encode = schemas.Encode

// forward emits e to usage.deduped. It reports false, having rejected r
// instead (the error is reject's), when e was written in an older schema
// and cannot be re-encoded as a DedupedEvent.
func (pt *partition) forward(tx *stream.Tx, r *kgo.Record, e *schemas.UsageEvent, arrival int64) (bool, error) {
	// Key and value share one allocation; each is capped so that neither
	// append can run into the other.
	// The key is the framed customer_id (schemas.CustomerKey;
	// docs/design.md, Topics: one partition owns all of a customer's
	// meters), which is how the canonical key (pt.canon, framed
	// customer_id, meter, event_id) of this event starts. The record is
	// bounded by construction: the input was at most MaxEventBytes, and
	// MaxRecordBytes is far more.
	klen := framedLen(e.CustomerID)
	buf := pt.alloc(klen + len(r.Value) + 3*binary.MaxVarintLen64)
	key := append(buf, pt.canon[:klen]...)
	rest := key[len(key):len(key):cap(key)]
	key = key[:len(key):len(key)]
	val, ok := schemas.AppendDedupedFromRaw(rest, r.Value, arrival, r.Partition, r.Offset)
	if !ok { // written with an older schema: re-encode
		var err error
		val, err = encode(&schemas.DedupedEvent{
			EventID: e.EventID, CustomerID: e.CustomerID, Meter: e.Meter, Quantity: e.Quantity,
			EventTime: e.EventTime, Source: e.Source, Properties: e.Properties,
			IngestTime: arrival, SourcePartition: r.Partition, SourceOffset: r.Offset,
		})
		if err != nil {
			return false, pt.reject(tx, r, e, schemas.ReasonInvalid, "the event cannot be re-encoded as a DedupedEvent: "+err.Error())
		}
	}
	rec := pt.newRecord()
	rec.Topic, rec.Partition, rec.Key, rec.Value = pt.pr.dedupedTopic, schemas.Partition(key, pt.pr.counts.deduped), key, val
	tx.Emit(rec)
	pc := pt.lastAccepted
	if pc == nil || pt.lastSource != e.Source { // most events of a stream share a source
		label := pt.pr.sourceLabel(e.Source)
		var ok bool
		if pc, ok = pt.accepted[label]; !ok {
			pc = &pendingCount{source: label, c: pt.pr.m.accepted.WithLabelValues(label)}
			pt.accepted[label] = pc
		}
		pt.lastSource, pt.lastAccepted = e.Source, pc
	}
	pc.n++
	return true, nil
}

// OtherSource is the source label of dedup's per-source metrics for every
// source not in Config.Sources (docs/operations.md, Dedup keys:
// producer-set values never make unbounded label sets).
const OtherSource = "other"

// sourceLabel returns the metric label of a source: itself when
// configured, else OtherSource. It does not allocate.
func (pr *processor) sourceLabel(s string) string {
	if l, ok := pr.sources[s]; ok {
		return l
	}
	return OtherSource
}

// framedLen is the length of s framed by schemas.AppendFramed.
func framedLen(s string) int {
	n := len(s) + 2 // one digit and the colon
	for l := len(s); l >= 10; l /= 10 {
		n++
	}
	return n
}

// recordBytes is what a record weighs against the broker's limit, without
// the batch framing (MaxRecordBytes leaves room for it).
func recordBytes(r *kgo.Record) int {
	n := len(r.Key) + len(r.Value)
	for _, h := range r.Headers {
		n += len(h.Key) + len(h.Value)
	}
	return n
}

// emitDerived emits rec, which dedup derived from input r, after checking
// it against MaxRecordBytes (docs/design.md, Bad input): a derived record
// that would be too large is not emitted, and r is rejected as oversized
// (bounded) instead, so that no input can make its own output unwritable
// and stop the partition.
func (pt *partition) emitDerived(tx *stream.Tx, r *kgo.Record, e *schemas.UsageEvent, rec *kgo.Record, what string) (bool, error) {
	if n := recordBytes(rec); n > pt.pr.cfg.MaxRecordBytes {
		return false, pt.reject(tx, r, e, schemas.ReasonOversized,
			fmt.Sprintf("its %s record would be %d bytes, more than %d", what, n, pt.pr.cfg.MaxRecordBytes))
	}
	tx.Emit(rec)
	return true, nil
}

func (pt *partition) duplicate(tx *stream.Tx, r *kgo.Record, e *schemas.UsageEvent, canon []byte, arrival int64, o original, conflict bool) error {
	ok, err := pt.emitDerived(tx, r, e, &kgo.Record{
		Topic:     pt.pr.duplicatesTopic,
		Partition: schemas.Partition(canon, pt.pr.counts.duplicates),
		Key:       bytes.Clone(canon),
		Value: schemas.AppendDuplicate(nil, &schemas.Duplicate{
			EventID: e.EventID, CustomerID: e.CustomerID, Meter: e.Meter, Source: e.Source, Conflict: conflict,
			Quantity: e.Quantity, EventTime: e.EventTime,
			OriginalPartition: pt.p, OriginalOffset: o.offset, OriginalArrival: o.arrival,
			DuplicatePartition: r.Partition, DuplicateOffset: r.Offset, DuplicateArrival: arrival,
		}),
	}, "duplicate")
	if !ok {
		return err
	}
	pt.txc.Inc(pt.pr.m.duplicates.WithLabelValues(pt.pr.sourceLabel(e.Source), strconv.FormatBool(conflict)))
	pt.pr.log.Info("duplicate dropped", zap.ByteString("key", canon), zap.Bool("conflict", conflict),
		zap.String("source", e.Source), zap.Int32("partition", r.Partition), zap.Int64("offset", r.Offset),
		zap.Int64("original_offset", o.offset))
	return nil
}

// reject parks r in usage.rejected, bounded (schemas.Rejected.Bound): a
// prefix of its key and value, their lengths and digests.
func (pt *partition) reject(tx *stream.Tx, r *kgo.Record, e *schemas.UsageEvent, reason, detail string) error {
	rej := &schemas.Rejected{
		Reason: reason, Detail: detail, Stage: "dedup",
		SourceTopic: r.Topic, SourcePartition: r.Partition, SourceOffset: r.Offset,
		SourceTimestamp: r.Timestamp.UnixMilli(), RawKey: r.Key, RawValue: r.Value,
	}
	if e != nil {
		rej.CustomerID, rej.Meter, rej.EventID = e.CustomerID, e.Meter, e.EventID
	}
	return pt.park(tx, rej)
}

// park emits rej to usage.rejected, in the partition of its raw key, or of
// its source partition without one, and counts it.
func (pt *partition) park(tx *stream.Tx, rej *schemas.Rejected) error {
	n := pt.pr.counts.rejected
	part := rej.SourcePartition % n
	if len(rej.RawKey) > 0 {
		part = schemas.Partition(rej.RawKey, n)
	}
	// Of the whole key: EncodeRejected cuts rej.RawKey to its prefix.
	key := schemas.RejectedKey(rej.RawKey)
	v, err := schemas.EncodeRejected(nil, rej)
	if err != nil {
		return fmt.Errorf("dedup: partition %d offset %d: encode rejected record: %w", rej.SourcePartition, rej.SourceOffset, err)
	}
	rec := &kgo.Record{Topic: pt.pr.rejectedTopic, Partition: part, Key: key, Value: v}
	if recordBytes(rec) > pt.pr.cfg.MaxRecordBytes {
		// Validate keeps MaxRecordBytes above schemas.MaxRejectedBytes, so
		// this cannot happen; if it did, the digests and lengths remain.
		rej.RawKey, rej.RawValue, rec.Key = nil, nil, nil
		if rec.Value, err = schemas.EncodeRejected(nil, rej); err != nil {
			return fmt.Errorf("dedup: partition %d offset %d: encode rejected record: %w", rej.SourcePartition, rej.SourceOffset, err)
		}
	}
	tx.Emit(rec)
	pt.txc.Inc(pt.pr.m.rejected.WithLabelValues("dedup", rej.Reason))
	pt.pr.log.Info("record rejected", zap.String("reason", rej.Reason), zap.String("detail", rej.Detail),
		zap.ByteString("key", boundLogKey(rej.RawKey)), zap.Int32("partition", rej.SourcePartition), zap.Int64("offset", rej.SourceOffset))
	return nil
}

// RejectBatch implements stream.BatchRejecter: a batch of usage.events
// that decompresses past the bound is rejected as oversized, one rejection
// at its first offset naming its offsets; a malformed one, which the Kafka
// client reads at offsets not its own, as undecodable, at the first offset
// of it not processed. None of its records is decoded, so it has no raw
// bytes, no customer and no timestamp (0).
func (pt *partition) RejectBatch(tx *stream.Tx, b stream.RejectedBatch) error {
	if err := pt.begin(tx); err != nil {
		return err
	}
	defer pt.flushCounts()
	reason := schemas.ReasonOversized
	if b.Malformed != "" {
		reason = schemas.ReasonUndecodable
	}
	rej := &schemas.Rejected{
		Reason: reason, Stage: "dedup",
		Detail:      b.Detail(),
		SourceTopic: b.Topic, SourcePartition: b.Partition, SourceOffset: b.From,
	}
	if err := pt.park(tx, rej); err != nil {
		return err
	}
	pt.publish()
	return nil
}

func msTime(ms int64) string { return time.UnixMilli(ms).UTC().Format(time.RFC3339Nano) }
