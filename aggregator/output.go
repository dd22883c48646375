package aggregator

import (
	"encoding/binary"
	"fmt"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/meterline/meterline/internal/stream"
	"github.com/meterline/meterline/schemas"
)

// Output: what every aggregate revision shares and how one is emitted, and
// rejected records.

// aggOut is what every revision of one aggregate shares: its record key
// and partition in the aggregates topic, and the encoded head of its
// Aggregate message (schemas.AppendAggregateHead).
type aggOut struct {
	key  []byte
	part int32
	head []byte
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

// encode is schemas.Encode: the encoding of every record the aggregator
// makes from an event (a queued event, an adjustment). Tests replace it to
// see that a failure rejects the event instead of stopping the stage.
var encode = schemas.Encode

// reject parks r in usage.rejected, bounded (schemas.Rejected.Bound: a
// prefix of its key and value, their lengths and digests); for an event
// queued behind its period's FINALs (r nil), e re-encoded as its raw
// value. It returns an error only if the Rejected record cannot be
// encoded, which stops the stage rather than lose the record.
func (pt *partition) reject(tx *stream.Tx, r *kgo.Record, e *schemas.DedupedEvent, reason, detail string) error {
	pt.refused = true
	rec, err := pt.rejectedRecord(r, e, reason, detail)
	if err != nil {
		return err
	}
	tx.Emit(rec)
	if reason != pt.rejReason || pt.rejCounter == nil {
		pt.rejReason, pt.rejCounter = reason, pt.pr.m.rejected.WithLabelValues("aggregator", reason)
	}
	pt.txc.Inc(pt.rejCounter)
	if ce := pt.pr.log.Check(zap.InfoLevel, "record rejected"); ce != nil {
		ce.Write(zap.String("reason", reason), zap.String("detail", pt.rej.Detail), zap.ByteString("key", rec.Key))
	}
	pt.rej = schemas.Rejected{} // keeps no reference to r's bytes
	return nil
}

// rejectedRecord is reject's record of usage.rejected. The Rejected it
// encodes is pt.rej (reused; reject clears it), its digests in
// pt.rejSums, and the record is taken from pt.recs: a rejection costs one
// allocation of its own, its key and value.
func (pt *partition) rejectedRecord(r *kgo.Record, e *schemas.DedupedEvent, reason, detail string) (*kgo.Record, error) {
	rej := &pt.rej
	*rej = schemas.Rejected{Reason: reason, Detail: detail, Stage: "aggregator"}
	if r != nil {
		rej.SourceTopic, rej.SourcePartition, rej.SourceOffset = r.Topic, r.Partition, r.Offset
		rej.SourceTimestamp, rej.RawKey, rej.RawValue = r.Timestamp.UnixMilli(), r.Key, r.Value
	}
	if e != nil {
		rej.CustomerID, rej.Meter, rej.EventID = e.CustomerID, e.Meter, e.EventID
		if r == nil {
			v, err := encode(e)
			if err != nil {
				rej.Detail += "; the queued event cannot be re-encoded: " + err.Error()
			}
			rej.RawValue = v
		}
	}
	// Keyed by the event's identity (docs/design.md, Topics), never by the
	// record's key, which is the customer (docs/design.md, Topics); null
	// when the record is no event. The key and the value share one
	// allocation. Raw bytes: a prefix, the length and a SHA-256
	// (docs/design.md, Bad input), the digests in scratch memory: they are
	// copied into the encoding.
	rej.BoundWith(&pt.rejSums)
	var key, buf []byte
	if e != nil {
		id := schemas.Identity{CustomerID: e.CustomerID, Meter: e.Meter, EventID: e.EventID}
		buf = id.AppendKey(make([]byte, 0, id.KeySize()+schemas.RejectedSizeMax(rej)))
		key, buf = schemas.RejectedKey(buf[:len(buf):len(buf)]), buf[len(buf):]
	}
	part := pt.p % pt.pr.counts.rejected
	if len(key) > 0 {
		part = schemas.Partition(key, pt.pr.counts.rejected)
	}
	v, err := schemas.EncodeRejected(buf, rej)
	if err != nil {
		return nil, fmt.Errorf("aggregator: partition %d: encode rejected record (%s: %s): %w", pt.p, reason, rej.Detail, err)
	}
	if pt.rejTopic == "" {
		pt.rejTopic = pt.pr.cfg.Topics.RejectedTopic()
	}
	rec := pt.newRecord(key, v)
	rec.Topic, rec.Partition = pt.rejTopic, part
	return rec, nil
}

// recSlab is how many records newRecord allocates at once, and
// slabMaxBytes the largest key and value a record from a slab holds.
const (
	recSlab      = 64
	slabMaxBytes = 4 << 10
)

// newRecord returns a record for tx.Emit of key and value: one of a slab of
// records allocated together when they are small. The producer holds each
// until it is acknowledged, and a slab is never handed out twice, so a
// record is never reused. A slab stays alive while any record of it is,
// so it keeps the keys and values of up to recSlab-1 acknowledged records
// reachable; larger records (a balance of many caps and grants) are
// allocated alone, so that this is at most recSlab × slabMaxBytes a
// partition.
func (pt *partition) newRecord(key, value []byte) *kgo.Record {
	if len(key)+len(value) > slabMaxBytes {
		return &kgo.Record{Key: key, Value: value}
	}
	if len(pt.recs) == 0 {
		pt.recs = make([]kgo.Record, recSlab)
	}
	rec := &pt.recs[0]
	pt.recs = pt.recs[1:]
	*rec = kgo.Record{Key: key, Value: value}
	return rec
}

func msTime(ms int64) string { return time.UnixMilli(ms).UTC().Format(time.RFC3339Nano) }
