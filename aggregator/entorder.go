package aggregator

import (
	"encoding/binary"
	"fmt"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/internal/stream"
	"github.com/meterline/meterline/schemas"
)

// The order entitlements decide events in (Config.EntitlementsOrder;
// docs/entitlements.md, Decision order).
const (
	// EntitlementsOrderInput decides each event when it leaves the gate,
	// in the order of its partition of usage.deduped. One customer's
	// events come from many usage.events partitions, each read by some
	// dedup instance: their order in usage.deduped follows their arrival
	// only while dedup keeps up.
	EntitlementsOrderInput = "input"
	// EntitlementsOrderArrival holds each event, once it left the gate,
	// until the partition watermark (docs/design.md, Time) has passed its
	// arrival, and decides the events a watermark advance releases in
	// order of arrival, then source partition and source offset: the
	// decisions are the same however far dedup lagged.
	EntitlementsOrderArrival = "arrival"
)

// The arrival hold (EntitlementsOrderArrival). An event that leaves the
// gate with an arrival (ingest_time) the partition watermark has not
// passed waits in the state under
//
//	'h' ingest_time source_partition source_offset offset
//
// (big-endian; offset is the record's in usage.deduped, for a key of its
// own), with the record as the gate keeps it (encodeGateRecord). A
// watermark record that moves the partition watermark from wm0 to wm first
// decides every held event whose arrival is before wm, in key order, then
// goes on as without the hold (advance: the period roll, FINAL decisions):
// as the same events would be decided in input order had dedup kept up.
// An event whose arrival is already before the watermark when it leaves
// the gate (a re-routed event, docs/design.md, Time) is decided at once.
//
// The release is chunked (docs/design.md, Exactly-once, 9): after a dedup
// instance was down, one advance passes the arrivals of its whole outage.
// A transaction decides at most Config.FinalChunk held events, and stops
// after the one whose bytes (from the transaction's first) reach
// Config.FinalChunkBytes (an event is up to schemas.MaxEventBytes); while some
// are left, 'H' holds wm0 and wm, the partition watermark stays at wm0,
// every record of usage.deduped waits in the gate behind them (gateIn,
// leave), and Work (or the next records' drainAhead) decides the next
// chunk; the last one advances the watermark. The decisions are thus those
// of one release whatever the chunks and transactions.
//
// Crash safety: a held event is in the state of the transaction that held
// it, and a decided one leaves the state in the transaction that decided
// it; an abort drops both with the input that brought them, which is read
// again (load). One held and released in the same transaction is forgotten
// (tx.Forget) and leaves no changelog record.
const pfxHold = 'h'

// keyRelease holds a release in chunks: the partition watermark it moves
// from, then the one it moves to (8 bytes big-endian each).
var keyRelease = []byte("H")

// arrivalHold is a partition's view of its held events, as the committed
// state and the open transaction have them.
type arrivalHold struct {
	n int // held events
	// oldest is the arrival of the oldest held event (the first key), 0
	// while none is held.
	oldest int64
	// fresh holds the keys held in the open transaction (cleared when it
	// ends): released in it, they are forgotten rather than deleted.
	fresh map[string]struct{}
	// releasing: held events are being decided; they are not held again.
	releasing bool
	// released counts the held events the open transaction decided: at
	// most Config.FinalChunk, whatever the watermark records it reads;
	// releasedBytes their keys and values as the hold has them: about
	// Config.FinalChunkBytes at most.
	released, releasedBytes int
	// to is the watermark of a release in chunks (keyRelease), 0 for
	// none; the partition watermark stays at the one it moves from.
	to int64
}

// arrivalOrder reports whether the partition holds events for the
// watermark.
func (pt *partition) arrivalOrder() bool {
	return pt.ent != nil && pt.pr.cfg.EntitlementsOrder == EntitlementsOrderArrival
}

// holds reports whether event e, leaving the gate, waits for the
// watermark: arrival order is on, and the watermark has not passed its
// arrival (strictly: dedup's watermark is an arrival it has read, and
// another event of that millisecond may follow it).
func (pt *partition) holds(e *schemas.DedupedEvent) bool {
	return pt.arrivalOrder() && !pt.ent.arrHold.releasing && e.IngestTime > 0 && e.IngestTime >= pt.wm
}

// releasePending reports whether a release in chunks is under way: no
// record of usage.deduped leaves the gate until it is done.
func (e *entPart) releasePending() bool { return e.arrHold.to != 0 }

// holdKey is r's key in the hold.
func holdKey(r *kgo.Record, e *schemas.DedupedEvent) []byte {
	k := make([]byte, 0, 29)
	k = append(k, pfxHold)
	k = binary.BigEndian.AppendUint64(k, uint64(e.IngestTime))
	k = binary.BigEndian.AppendUint32(k, uint32(e.SourcePartition))
	k = binary.BigEndian.AppendUint64(k, uint64(e.SourceOffset))
	return binary.BigEndian.AppendUint64(k, uint64(r.Offset))
}

// hold puts event r (decoded as e) in the hold.
func (pt *partition) hold(tx *stream.Tx, r *kgo.Record, e *schemas.DedupedEvent) {
	h := &pt.ent.arrHold
	k := holdKey(r, e)
	tx.Put(k, encodeGateRecord(r))
	if h.fresh == nil {
		h.fresh = map[string]struct{}{}
	}
	h.fresh[string(k)] = struct{}{}
	if h.n == 0 || e.IngestTime < h.oldest {
		h.oldest = e.IngestTime
	}
	h.n++
}

// advanceTo moves the partition watermark to wm (watermark): the held
// events it passes are decided first, in chunks (releaseChunk); once none
// is left, advance.
func (pt *partition) advanceTo(tx *stream.Tx, wm int64) error {
	if pt.ent == nil || pt.ent.arrHold.n == 0 {
		return pt.advance(tx, wm)
	}
	pt.ent.arrHold.to = wm
	done, err := pt.releaseChunk(tx, pt.pr.cfg.FinalChunk)
	if err != nil || !done {
		return err
	}
	return pt.advance(tx, wm)
}

// advance moves the partition watermark to wm: the period roll, and the
// periods whose end + grace it passed are decided final now; their FINAL
// revisions, and the expiry of periods at end + W + B + S, go out in chunks
// (Work).
func (pt *partition) advance(tx *stream.Tx, wm int64) error {
	pt.wm = wm
	if pt.ent != nil {
		if err := pt.entWatermark(tx); err != nil {
			return err
		}
	}
	return pt.finalize(tx)
}

// continueRelease decides the next chunk of a release in chunks, at most
// limit held events, and advances the watermark after the last one. It
// reports whether no release is left pending.
func (pt *partition) continueRelease(tx *stream.Tx, limit int) (bool, error) {
	h := &pt.ent.arrHold
	if h.to == 0 {
		return true, nil
	}
	to := h.to
	done, err := pt.releaseChunk(tx, limit)
	if err != nil || !done {
		return false, err
	}
	if err := pt.advance(tx, to); err != nil {
		return false, err
	}
	// The gate's records waited behind the release.
	pt.ent.more, err = pt.gateHeadPasses(tx)
	return true, err
}

// releaseChunk decides, in key order, at most limit held events whose
// arrival is before arrHold.to (fewer if the open transaction decided
// others: at most Config.FinalChunk in all, and about
// Config.FinalChunkBytes of them), and reports whether none is left: the
// release is done (to 0, keyRelease gone). Otherwise keyRelease records
// it, with the watermark the partition stays at meanwhile.
func (pt *partition) releaseChunk(tx *stream.Tx, limit int) (bool, error) {
	h := &pt.ent.arrHold
	limit = max(0, min(limit, pt.pr.cfg.FinalChunk-h.released))
	budget := pt.pr.cfg.FinalChunkBytes - h.releasedBytes
	if budget <= 0 {
		limit, budget = 0, 0
	}
	lo, hi := []byte{pfxHold}, binary.BigEndian.AppendUint64([]byte{pfxHold}, uint64(max(h.to, 0)))
	kvs, full, err := scanChunkBytes(tx, lo, hi, nil, limit+1, budget)
	if err != nil {
		return false, err
	}
	var next []byte // the first held event left after the chunk
	switch {
	case len(kvs) > limit:
		next, kvs = kvs[limit].k, kvs[:limit]
	case full:
		// Stopped at the bytes: whether one is left after them.
		after, err := scanChunk(tx, lo, hi, kvs[len(kvs)-1].k, 1)
		if err != nil {
			return false, err
		}
		if len(after) > 0 {
			next = after[0].k
		}
	}
	left := next != nil
	if left {
		h.oldest = holdArrival(next)
	}
	h.released += len(kvs)
	h.releasedBytes += kvBytes(kvs)
	h.releasing = true
	defer func() { h.releasing = false }()
	topic := pt.pr.cfg.Topics.DedupedTopic()
	for _, kv := range kvs {
		r, err := decodeGateRecord(kv.v, topic, pt.p)
		if err != nil {
			return false, fmt.Errorf("%w (held event %x)", err, kv.k)
		}
		if _, ok := h.fresh[string(kv.k)]; ok {
			delete(h.fresh, string(kv.k))
			tx.Forget(kv.k)
		} else {
			tx.Delete(kv.k)
		}
		h.n--
		if err := pt.handle(tx, r); err != nil {
			return false, err
		}
	}
	if left {
		v := binary.BigEndian.AppendUint64(nil, uint64(pt.wm))
		tx.Put(keyRelease, binary.BigEndian.AppendUint64(v, uint64(h.to)))
		return false, nil
	}
	if err := pt.findOldestHeld(tx); err != nil {
		return false, err
	}
	if v, ok, err := tx.Get(keyRelease); err != nil {
		return false, err
	} else if ok && v != nil {
		tx.Delete(keyRelease)
	}
	h.to = 0
	return true, nil
}

// loadHold counts the held events of the state and loads a release in
// chunks under way: the partition watermark is the one it moves from.
func (pt *partition) loadHold(st stateReader) error {
	h := &pt.ent.arrHold
	h.n, h.releasing, h.to, h.oldest = 0, false, 0, 0
	clear(h.fresh)
	v, ok, err := st.Get(keyRelease)
	switch {
	case err != nil:
		return err
	case ok && len(v) != 16:
		return fmt.Errorf("aggregator: partition %d: corrupt release of held events %x", pt.p, v)
	case ok:
		pt.wm, h.to = int64(binary.BigEndian.Uint64(v)), int64(binary.BigEndian.Uint64(v[8:]))
	}
	return st.Scan([]byte{pfxHold}, []byte{pfxHold + 1}, func(k, _ []byte) error {
		if h.n == 0 {
			h.oldest = holdArrival(k)
		}
		h.n++
		return nil
	})
}

// holdArrival is the arrival (ingest_time) of held key k.
func holdArrival(k []byte) int64 {
	if len(k) < 9 {
		return 0
	}
	return int64(binary.BigEndian.Uint64(k[1:9]))
}

// findOldestHeld sets arrHold.oldest from the first held key of tx, after
// a release that left none of its arrivals (the events held at or after
// its watermark stay).
func (pt *partition) findOldestHeld(tx *stream.Tx) error {
	h := &pt.ent.arrHold
	if h.n == 0 {
		h.oldest = 0
		return nil
	}
	kvs, err := scanChunk(tx, []byte{pfxHold}, []byte{pfxHold + 1}, nil, 1)
	if err != nil {
		return err
	}
	h.oldest = 0
	if len(kvs) > 0 {
		h.oldest = holdArrival(kvs[0].k)
	}
	return nil
}

// publishHold sets the partition's gauges of held events, in either
// order (held events a run in arrival order left wait in input order too,
// until the next watermark advance): how many, and the arrival of the
// oldest (absent while none).
func (pt *partition) publishHold() {
	if pt.ent == nil {
		return
	}
	h := &pt.ent.arrHold
	pt.pr.m.held.WithLabelValues(pt.pl).Set(float64(h.n))
	if h.n == 0 {
		pt.pr.m.heldOldest.DeleteLabelValues(pt.pl)
		return
	}
	pt.pr.m.heldOldest.WithLabelValues(pt.pl).Set(float64(h.oldest) / 1000)
}

// endHold forgets which keys the transaction that ends held, how many it
// released, and the bytes of the gate it drained (committed or aborted:
// Flush, Abort).
func (pt *partition) endHold() {
	if pt.ent != nil {
		clear(pt.ent.arrHold.fresh)
		pt.ent.arrHold.released, pt.ent.arrHold.releasedBytes = 0, 0
		pt.ent.drainedBytes = 0
	}
}
