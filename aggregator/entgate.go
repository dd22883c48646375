package aggregator

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/internal/stream"
	"github.com/meterline/meterline/schemas"
)

// gateTime returns the broker time a record of usage.deduped waits for
// in the gate: an event's ingest_time, a watermark's watermark; 0 for
// anything else (it is rejected or ignored when it leaves the gate), and
// for a time too far ahead of the record's own (tooFarAhead: rejected).
//
// decoded reports that r decoded as a DedupedEvent, now in pt.ev as
// handle would decode it (handleDecoded goes on from there).
func (pt *partition) gateTime(r *kgo.Record) (t int64, decoded bool) {
	t, decoded = gateTimeOf(r.Value, &pt.ev)
	if pt.tooFarAhead(r, t) {
		return 0, decoded
	}
	return t, decoded
}

// tooFarAhead reports whether t, a record's ingest_time or watermark, is
// more than Config.EntitlementsMaxAhead after the record's broker time:
// no entitlements record may ever be read that far, and it would hold the
// gate. Replay-stable: both times are the record's.
func (pt *partition) tooFarAhead(r *kgo.Record, t int64) bool {
	return pt.ent != nil && t > r.Timestamp.UnixMilli()+pt.pr.cfg.EntitlementsMaxAhead.Milliseconds()
}

// rejectTooFarAhead rejects a record tooFarAhead (invalid).
func (pt *partition) rejectTooFarAhead(tx *stream.Tx, r *kgo.Record, e *schemas.DedupedEvent, what string, t int64) error {
	return pt.reject(tx, r, e, schemas.ReasonInvalid, fmt.Sprintf("%s %s is more than %s after the record's broker time %s in %s",
		what, msTime(t), pt.pr.cfg.EntitlementsMaxAhead, msTime(r.Timestamp.UnixMilli()), r.Topic))
}

// gateTimeOf returns an event's ingest_time, a watermark's watermark, 0
// for anything else; decoded reports that v decoded into scratch.
func gateTimeOf(v []byte, scratch *schemas.DedupedEvent) (t int64, decoded bool) {
	*scratch = schemas.DedupedEvent{}
	if schemas.DecodeInto(v, scratch) == nil {
		return scratch.IngestTime, true
	}
	if m, err := schemas.Decode(v); err == nil {
		switch m := m.(type) {
		case *schemas.Watermark:
			return m.Watermark, false
		case *schemas.DedupedEvent:
			return m.IngestTime, false
		}
	}
	return 0, false
}

// encodeGateRecord keeps what the aggregator reads of a record: its
// offset and timestamp (for usage.rejected), key and value.
func encodeGateRecord(r *kgo.Record) []byte {
	b := make([]byte, 0, 24+len(r.Key)+len(r.Value))
	b = binary.AppendUvarint(b, uint64(r.Offset))
	b = binary.AppendVarint(b, r.Timestamp.UnixMilli())
	b = binary.AppendUvarint(b, uint64(len(r.Key)))
	b = append(b, r.Key...)
	if r.Value == nil {
		return append(b, 0)
	}
	return append(append(b, 1), r.Value...)
}

func decodeGateRecord(b []byte, topic string, p int32) (*kgo.Record, error) {
	bad := fmt.Errorf("aggregator: partition %d: corrupt gate record", p)
	off, n := binary.Uvarint(b)
	if n <= 0 {
		return nil, bad
	}
	b = b[n:]
	ts, n := binary.Varint(b)
	if n <= 0 {
		return nil, bad
	}
	b = b[n:]
	kl, n := binary.Uvarint(b)
	if n <= 0 || uint64(len(b)-n) < kl+1 {
		return nil, bad
	}
	b = b[n:]
	r := &kgo.Record{Topic: topic, Partition: p, Offset: int64(off), Timestamp: time.UnixMilli(ts)}
	if kl > 0 {
		r.Key = bytes.Clone(b[:kl])
	}
	b = b[kl:]
	if b[0] == 1 {
		r.Value = bytes.Clone(b[1:])
	}
	return r, nil
}

// gateIn puts r in the gate when it must wait: the gate is not empty, a
// release of held events in chunks is under way (entorder.go), or r's
// time is past what the entitlements partition has been read up to.
// It reports whether it did, and, when it did not, whether r is decoded
// in pt.ev (gateTime): handleDecoded then spares decoding it again.
func (pt *partition) gateIn(tx *stream.Tx, r *kgo.Record) (gated, decoded bool) {
	e := pt.ent
	if e.gateN == 0 && !e.releasePending() {
		t, dec := pt.gateTime(r)
		if e.passes(t) {
			return false, dec
		}
	}
	// It enters the gate in memory (fresh), as the state would give it
	// back (decodeGateRecord): the state gets it only if it is still in
	// the gate when the transaction ends (flushGate).
	if len(e.fresh) == 0 {
		e.freshFirst = e.gateNext
	}
	var key []byte
	if len(r.Key) > 0 {
		key = r.Key
	}
	e.fresh = append(e.fresh, kgo.Record{Topic: pt.pr.cfg.Topics.DedupedTopic(), Partition: pt.p, Offset: r.Offset,
		Timestamp: time.UnixMilli(r.Timestamp.UnixMilli()), Key: key, Value: r.Value})
	e.gateNext++
	e.gateN++
	return true, false
}

// flushGate writes to the transaction the records that entered the gate
// in it and are still there, under the keys and with the values they
// would have had written at once ('q' seq: encodeGateRecord), and the seq
// of the next record to enter (keyGateNext): the committed state holds
// the gate whole, and a record gated and let through in one transaction
// never touches the state (Flush).
func (pt *partition) flushGate(tx *stream.Tx) {
	e := pt.ent
	for i := e.freshHead; i < len(e.fresh); i++ {
		k := binary.BigEndian.AppendUint64(append(e.gateKeyBuf[:0], pfxGate), e.freshFirst+uint64(i))
		e.gateKeyBuf = k
		tx.Put(k, encodeGateRecord(&e.fresh[i]))
	}
	if e.gateNext != e.txFirst {
		tx.Put(keyGateNext, binary.BigEndian.AppendUint64(nil, e.gateNext))
	}
	clear(e.fresh)
	e.fresh, e.freshHead = e.fresh[:0], 0
	e.txFirst = e.gateNext
}

// passes reports whether a record waiting for broker time t can leave the
// gate: the entitlements partition has been read past t (strictly: a
// record written in t's millisecond may still be unread, and would apply
// to an event that arrived at t, Timeline.At), or t is 0 (it waits for
// nothing).
func (e *entPart) passes(t int64) bool { return t <= 0 || t < e.readTo }

// drain lets the records at the head of the gate through, in order, while
// their time is before Ledger.ReadTo (passes), at most Config.FinalChunk of
// them, and of those the state holds, about Config.FinalChunkBytes a
// transaction (the rest go in Work's transactions).
func (pt *partition) drain(tx *stream.Tx) error {
	_, err := pt.drainN(tx, pt.pr.cfg.FinalChunk)
	return err
}

// drainAhead lets through, before n new records of usage.deduped are
// handled, the gated records ahead of them that can go, at most 2n of
// them (a transaction then handles at most three times the records it
// read; Work's transactions drain the rest, Config.FinalChunk at a time).
// A gate with a backlog of ready records (a stage catching up, whose
// first records waited for its entitlements partition to be read) thus
// shrinks by at least n a call (while the records it lets through stay
// under about Config.FinalChunkBytes a transaction, drainN), and once it
// is empty the new records whose time the entitlements partition has
// been read past skip it (gateIn):
// they are not written to the state and deleted again. In steady state
// only the records that arrived after the partition's last tick wait.
//
// A release of held events in chunks under way (entorder.go) goes first:
// at most 2n held events (and Config.FinalChunk and about
// Config.FinalChunkBytes a transaction, releaseChunk).
func (pt *partition) drainAhead(tx *stream.Tx, n int) error {
	budget := 2 * n
	if pt.ent.releasePending() {
		if done, err := pt.continueRelease(tx, min(budget, pt.pr.cfg.FinalChunk)); err != nil || !done {
			return err
		}
	}
	for pt.ent.gateN > 0 && budget > 0 {
		done, err := pt.drainN(tx, min(budget, pt.pr.cfg.FinalChunk))
		if err != nil || done == 0 {
			return err
		}
		budget -= done
	}
	return nil
}

// drainN is drain with at most limit records, and reports how many went
// through.
func (pt *partition) drainN(tx *stream.Tx, limit int) (int, error) {
	e := pt.ent
	if e.gateN == 0 {
		e.more = false
		return 0, nil
	}
	// The gate is the records the committed state holds ('q' keys), then
	// those that entered it in this transaction (fresh).
	// The state's records are at most about Config.FinalChunkBytes a
	// transaction (an event is up to schemas.MaxEventBytes): full, the
	// rest of them, and the fresh ones behind them, wait for the next.
	done, blocked, full := 0, false, false
	if inState := e.gateN - (len(e.fresh) - e.freshHead); inState > 0 {
		budget := pt.pr.cfg.FinalChunkBytes - e.drainedBytes
		var kvs []kv
		if budget > 0 {
			var err error
			if kvs, _, err = scanChunkBytes(tx, []byte{pfxGate}, []byte{pfxGate + 1}, nil, min(limit, inState), budget); err != nil {
				return 0, err
			}
		}
		full = len(kvs) < inState && kvBytes(kvs) >= budget
		topic := pt.pr.cfg.Topics.DedupedTopic()
		for _, kv := range kvs {
			r, err := decodeGateRecord(kv.v, topic, pt.p)
			if err != nil {
				return done, err
			}
			went, err := pt.leave(tx, r, func() { tx.Delete(kv.k) })
			if !went {
				blocked = true
				break
			}
			e.drainedBytes += len(kv.k) + len(kv.v)
			done++
			if err != nil {
				return done, err
			}
		}
	}
	// Past the state's records only when every one of them went through
	// (done < limit then means none is left there).
	for !blocked && !full && done < limit && e.freshHead < len(e.fresh) {
		went, err := pt.leave(tx, &e.fresh[e.freshHead], func() { e.freshHead++ })
		if !went {
			blocked = true
			break
		}
		done++
		if err != nil {
			return done, err
		}
	}
	e.more = false
	if !blocked && (done == limit || full) {
		var err error
		if e.more, err = pt.gateHeadPasses(tx); err != nil {
			return done, err
		}
	}
	pt.pr.m.gated.WithLabelValues(pt.pl).Set(float64(e.gateN))
	pt.publishHold() // the records let through were held
	return done, nil
}

// gateHeadPasses reports whether the record at the head of the gate (the
// first the state holds, else the first that entered it in this
// transaction) can leave it now (passes): whether Work has records to
// drain. It is the same whether the partition kept its memory or loaded
// its state (a restart, an aborted transaction): a gate whose head waits
// for the entitlements partition gives Work nothing to do either way, and
// the chunks of a period's roll and FINALs go in the same transactions.
func (pt *partition) gateHeadPasses(st stateReader) (bool, error) {
	e := pt.ent
	if e.gateN <= 0 || e.releasePending() {
		return false, nil
	}
	var head *kgo.Record
	if e.gateN > len(e.fresh)-e.freshHead {
		var v []byte
		err := st.Scan([]byte{pfxGate}, []byte{pfxGate + 1}, func(_, val []byte) error {
			v = bytes.Clone(val)
			return errStop
		})
		if err != nil && !errors.Is(err, errStop) {
			return false, err
		}
		if v == nil {
			return false, fmt.Errorf("aggregator: partition %d: %d gated records, none in the state", pt.p, e.gateN)
		}
		if head, err = decodeGateRecord(v, pt.pr.cfg.Topics.DedupedTopic(), pt.p); err != nil {
			return false, err
		}
	} else {
		head = &e.fresh[e.freshHead]
	}
	t, _ := pt.gateTime(head)
	return e.passes(t), nil
}

// leave lets r, the record at the head of the gate, through when the
// entitlements partition has been read past its time (passes) and no
// release of held events in chunks is under way: out takes it out of the
// gate, then it is handled. It reports whether r went.
func (pt *partition) leave(tx *stream.Tx, r *kgo.Record, out func()) (bool, error) {
	if pt.ent.releasePending() {
		return false, nil
	}
	t, decoded := pt.gateTime(r)
	if !pt.ent.passes(t) {
		return false, nil
	}
	out()
	pt.ent.gateN--
	return true, pt.dispatch(tx, r, decoded)
}
