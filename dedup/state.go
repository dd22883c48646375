package dedup

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sort"

	"github.com/cespare/xxhash/v2"

	"github.com/meterline/meterline/internal/stream"
	"github.com/meterline/meterline/schemas"
)

// State keys. Identity keys are 'k' | bucket (4 bytes BE) | 16-byte hash.
// The metadata keys are written when missing and again with every bucket
// expiry (about once a Bucket of broker time), so that the changelog's
// retention (W + S + margin) never deletes the only copy.
var (
	// keyPartitions: the partition count of the events topic.
	keyPartitions = []byte("mN")
	// keyWatermark: the partition watermark, epoch ms.
	keyWatermark = []byte("mW")
	// keyUpgrade: the upgrade offset. Unsigned re-route headers (written
	// before dedup signed them) are honoured only below it. Recorded when
	// the partition first runs with signatures: the events partition's end
	// offset then, or 0 for a partition whose state is new.
	keyUpgrade = []byte("mU")
	// keyKeyScheme: the key scheme of the records this state's partition
	// wrote to usage.deduped, schemas.DedupedKeyScheme. State that has a
	// partition count but no scheme was written keying by customer and
	// meter; dedup refuses it (schemas.ErrKeyScheme).
	keyKeyScheme = []byte("mK")
	// keyDropped: epoch ms before which the keys of first arrivals have
	// been dropped (the end of the last bucket dropped), written with every
	// bucket expiry. The expiry check never goes below it, so that a W or
	// S raised after keys expired under the shorter one does not admit
	// copies of events whose keys are gone; and alike whether the local
	// store deleted them or a restore from the changelog brought them back.
	keyDropped = []byte("mE")
	// keyBucket: the expiry bucket B (Config.Bucket) in ms, the unit of
	// the bucket numbers of the identity keys. State that has a partition
	// count but no bucket was written before it was recorded: it gets the
	// configured one.
	keyBucket = []byte("mB")
	// keyLogAppend: present once the partition has given a record with a
	// LogAppendTime timestamp; a CreateTime record after that stops the
	// stage (handle), after a restart too.
	keyLogAppend = []byte("mL")
	// keyUsePrefix (keyuse.go): "mS" | key ID, the last signing use of
	// a key.
	// keySkew (skew.go): the S the state's keys were accepted under.
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

// readDropped reads keyDropped through get (0 when absent).
func readDropped(get func([]byte) ([]byte, bool, error)) (int64, error) {
	return readTime(get, keyDropped, "dropped-keys time")
}

// readWatermark reads the watermark key through get (0 when absent).
func readWatermark(get func([]byte) ([]byte, bool, error)) (int64, error) {
	return readTime(get, keyWatermark, "watermark")
}

// readTime reads an 8-byte time (epoch ms) at key through get (0 when
// absent).
func readTime(get func([]byte) ([]byte, bool, error), key []byte, what string) (int64, error) {
	v, ok, err := get(key)
	switch {
	case err != nil:
		return 0, err
	case !ok:
		return 0, nil
	case len(v) != 8:
		return 0, fmt.Errorf("corrupt %s (%d bytes)", what, len(v))
	}
	return int64(binary.BigEndian.Uint64(v)), nil
}

func (fs *filters) bloomFor(b uint32) *bloom {
	f, ok := fs.blooms[b]
	if !ok {
		// Arrival buckets of a steady stream hold about as many keys as
		// the one before: size the new bucket's filter for that many.
		f = &bloom{}
		if len(fs.buckets) > 0 && fs.buckets[0] < b {
			f.first = fs.keys[fs.buckets[0]] + fs.keys[fs.buckets[0]]/4
		}
		fs.blooms[b] = f
		fs.buckets = append(fs.buckets, b)
		sort.Slice(fs.buckets, func(i, j int) bool { return fs.buckets[i] > fs.buckets[j] })
	}
	return f
}

// begin writes what a transaction must carry on its first use: the
// metadata keys when due, and pending expiry.
func (pt *partition) begin(tx *stream.Tx) error {
	if pt.flushed {
		// The previous transaction committed (an abort would have called
		// Abort): the buckets it dropped are gone from the store
		// (Committed counted them).
		pt.dropping, pt.flushed = nil, false
	}
	if pt.reloadWM {
		wm, err := readWatermark(tx.Get)
		if err != nil {
			return fmt.Errorf("dedup: partition %d: %w", pt.p, err)
		}
		dropped, err := readDropped(tx.Get)
		if err != nil {
			return fmt.Errorf("dedup: partition %d: %w", pt.p, err)
		}
		pt.wm, pt.dropped, pt.reloadWM = wm, dropped, false
		pt.scheduleExpiry()
	}
	refresh := false
	if pt.dropTo > pt.expired {
		refresh = true
		lo := []byte{prefixIdentity, 0, 0, 0, 0}
		hi := make([]byte, 5)
		hi[0] = prefixIdentity
		binary.BigEndian.PutUint32(hi[1:], uint32(pt.dropTo))
		tx.DeleteRangeLocal(lo, hi)
		kept := pt.buckets[:0]
		again := pt.dropped / pt.pr.cfg.Bucket.Milliseconds() // the buckets below it were dropped before
		for _, b := range pt.buckets {
			if int64(b) < pt.dropTo {
				pt.dropping = append(pt.dropping, droppedBucket{b: b, f: pt.blooms[b], keys: pt.keys[b], again: int64(b) < again})
				delete(pt.blooms, b)
				delete(pt.keys, b)
				continue
			}
			kept = append(kept, b)
		}
		pt.buckets = kept
		pt.expired = pt.dropTo
		pt.dropped = max(pt.dropped, pt.dropTo*pt.pr.cfg.Bucket.Milliseconds())
	}
	if pt.writeMeta || refresh {
		// Written when missing and re-written with every bucket expiry,
		// about once a Bucket of broker time, so that the changelog's
		// retention never deletes the only copy (a restore would then lose
		// the partition-count guard, the upgrade offset or the last use of
		// a key).
		var n [4]byte
		binary.BigEndian.PutUint32(n[:], uint32(pt.pr.counts.events))
		tx.Put(keyPartitions, n[:])
		var u [8]byte
		binary.BigEndian.PutUint64(u[:], uint64(pt.upgrade))
		tx.Put(keyUpgrade, u[:])
		tx.Put(keyKeyScheme, []byte(schemas.DedupedKeyScheme))
		var b [8]byte
		binary.BigEndian.PutUint64(b[:], uint64(pt.pr.cfg.Bucket.Milliseconds()))
		tx.Put(keyBucket, b[:])
		pt.writeKeyUses(tx)
		if pt.wm > 0 {
			var w [8]byte
			binary.BigEndian.PutUint64(w[:], uint64(pt.wm))
			tx.Put(keyWatermark, w[:])
		}
		tx.Put(keySkew, pt.skew.encode())
		if pt.logAppend {
			tx.Put(keyLogAppend, []byte{1})
		}
		if pt.dropped > 0 {
			var d [8]byte
			binary.BigEndian.PutUint64(d[:], uint64(pt.dropped))
			tx.Put(keyDropped, d[:])
		}
		pt.writeMeta = false
	}
	return nil
}

// scheduleExpiry computes which buckets are past W + S at the watermark:
// bucket b holds first arrivals in [b·B, (b+1)·B), all of whose keys may go
// once the watermark reaches (b+1)·B + W + S. The buckets below keyDropped
// go too, whatever W and S are now: a restore from the changelog brings
// back the keys of buckets dropped under a shorter W or S, and a copy
// must be judged alike from the local state, where they are gone.
func (pt *partition) scheduleExpiry() {
	below := pt.liveFrom()
	if below > 0 && below > pt.dropTo {
		pt.dropTo = below
	}
}

// liveFrom returns the first bucket that is live at the watermark: every
// bucket below it is past W + S, or below the keys already dropped
// (keyDropped), and goes with the next bucket drop (0: none).
func (pt *partition) liveFrom() int64 {
	return max(pt.expiredBuckets(), pt.dropped/pt.pr.cfg.Bucket.Milliseconds())
}

// expiredBuckets returns the first bucket not expired at the watermark:
// every bucket below it is past W + S (0: none).
func (pt *partition) expiredBuckets() int64 {
	c := pt.pr.cfg
	horizon := pt.wm - c.Window.Milliseconds() - expirySkew(&pt.pr.cfg, pt.skew, pt.wm)
	if pt.wm <= 0 || horizon <= 0 {
		return 0
	}
	// (b+1)·B ≤ horizon ⇔ b < ⌊horizon/B⌋: buckets below that are expired.
	return horizon / c.Bucket.Milliseconds()
}

// expiredBefore returns the time, epoch ms, before which the keys of first
// arrivals have expired (0: none): at the watermark, and never before the
// keys already dropped (keyDropped: under a shorter W or S, they expired
// earlier).
func (pt *partition) expiredBefore() int64 {
	return max(pt.expiredBuckets()*pt.pr.cfg.Bucket.Milliseconds(), pt.dropped)
}

type original struct {
	verify, payload []byte
	arrival         int64
	offset          int64
}

// lookup finds the stored first copy of the identity whose key hash is
// kh, in the buckets live at the watermark. A bucket that expired at the
// watermark is not searched even while it is still in the store (it is
// dropped when the batch ends): a copy is judged by the watermark up to
// it, never by where a batch of records ends, so that the decision does
// not depend on how far behind the stage ran (docs/design.md, Time).
func (pt *partition) lookup(tx *stream.Tx, kh []byte) (original, bool, error) {
	var key [identityKeyLen]byte
	key[0] = prefixIdentity
	copy(key[5:], kh)
	live := pt.liveFrom()
	for _, b := range pt.buckets {
		if int64(b) < live {
			break // pt.buckets is in descending order
		}
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
// and properties (docs/design.md, Event identity and keys). source is not
// part of it.
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
