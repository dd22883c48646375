package dedup

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"time"

	"github.com/meterline/meterline/internal/stream"
	"github.com/meterline/meterline/schemas"
)

// filters are a partition's Bloom filters, one per arrival bucket, and the
// key count of each bucket: what a lookup needs in memory. Open builds them
// from every identity key of the state, unless the partition was a standby
// here: its tail kept them in step with the state it applied (stream.Warmer),
// and Open takes them as they are, in a time independent of the key count.
type filters struct {
	blooms  map[uint32]*bloom
	keys    map[uint32]int
	buckets []uint32 // live buckets, descending

	// On a standby (Warm): the processor, and the buckets below dropped,
	// following the keyDropped the owner records in the changelog
	// (droppedAt, epoch ms) in the bucket the state records (keyBucket,
	// ms; 0 until known), never the standby's configured one.
	pr        *processor
	dropped   int64
	droppedAt int64
	bucket    int64
	pending   [][2][]byte // ranges to delete (stream.WarmExpirer)
}

func newFilters() filters {
	return filters{blooms: map[uint32]*bloom{}, keys: map[uint32]int{}}
}

// load adds every identity key of the state.
func (fs *filters) load(p int32, st *stream.PartitionState) error {
	return st.Scan([]byte{prefixIdentity}, []byte{prefixIdentity + 1}, func(k, _ []byte) error {
		if len(k) != identityKeyLen {
			return fmt.Errorf("dedup: partition %d: corrupt identity key of %d bytes", p, len(k))
		}
		fs.add(k)
		return nil
	})
}

func (fs *filters) add(k []byte) {
	b := binary.BigEndian.Uint32(k[1:5])
	fs.bloomFor(b).add(k[5:])
	fs.keys[b]++
}

// Apply implements stream.WarmState: an identity key written to the state
// joins its bucket's filter. dedup writes an identity key once and never
// deletes one alone (expiry drops whole buckets, locally, in Open's first
// transaction), so a delete needs nothing: a Bloom filter that keeps a key
// stays correct. Another key, or a malformed one, is not an identity key;
// Open's scan would refuse a malformed one, and so does the promoted
// partition's first lookup of it, never a wrong answer.
func (fs *filters) Apply(k, v []byte) {
	if fs.pr != nil && v != nil && len(v) == 8 {
		switch {
		case bytes.Equal(k, keyDropped):
			fs.droppedAt = max(fs.droppedAt, int64(binary.BigEndian.Uint64(v)))
			fs.expire()
			return
		case bytes.Equal(k, keyBucket):
			fs.bucket = int64(binary.BigEndian.Uint64(v))
			fs.expire()
			return
		}
	}
	if v == nil || len(k) != identityKeyLen || k[0] != prefixIdentity {
		return
	}
	fs.add(k)
}

// expire drops, on a standby, the buckets its owner dropped: those below
// droppedAt (epoch ms), the keyDropped the owner records in the
// transaction that drops them (partition.begin). Their filters go now,
// their keys through LocalDeletes. The standby follows what the owner
// recorded, not a horizon of its own: its W or S may differ from the
// owner's (a rolling restart that changes them), and expiring by a shorter
// one would drop keys the owner keeps, which the standby, promoted, would
// then miss. So does it count buckets in the one the state records
// (keyBucket), in which the owner numbers them: its own may differ too (a
// rolling restart that tries another bucket, which the owner's Open
// refuses), and a shorter one would drop every key of its copy, which the
// instance, back on the state's bucket, would restore only the tail of.
// Until the state's bucket is known, nothing is dropped: keys kept are
// never wrong. A bucket below keyDropped may still be in the owner's
// store (a restore brought it back); its keys are never needed: the
// expiry check rejects an event that could be a copy of one
// (partition.expiredBefore).
func (fs *filters) expire() {
	if fs.bucket <= 0 {
		return
	}
	below := fs.droppedAt / fs.bucket
	if below <= fs.dropped {
		return
	}
	lo := []byte{prefixIdentity, 0, 0, 0, 0}
	hi := make([]byte, 5)
	hi[0] = prefixIdentity
	binary.BigEndian.PutUint32(hi[1:], uint32(below))
	fs.pending = append(fs.pending, [2][]byte{lo, hi})
	kept := fs.buckets[:0]
	for _, b := range fs.buckets {
		if int64(b) < below {
			delete(fs.blooms, b)
			delete(fs.keys, b)
			continue
		}
		kept = append(kept, b)
	}
	fs.buckets = kept
	fs.dropped = below
}

// LocalDeletes implements stream.WarmExpirer.
func (fs *filters) LocalDeletes() [][2][]byte {
	out := fs.pending
	fs.pending = nil
	return out
}

// Warm implements stream.Warmer: a standby's filters, built from the state
// it starts from.
func (pr *processor) Warm(p int32, st *stream.PartitionState) (stream.WarmState, error) {
	fs := newFilters()
	fs.pr = pr
	if err := fs.load(p, st); err != nil {
		return nil, err
	}
	var err error
	if fs.droppedAt, err = readDropped(st.Get); err != nil {
		return nil, fmt.Errorf("dedup: partition %d: %w", p, err)
	}
	switch v, ok, err := st.Get(keyBucket); {
	case err != nil:
		return nil, err
	case ok && len(v) != 8:
		return nil, fmt.Errorf("dedup: partition %d: corrupt expiry bucket (%d bytes)", p, len(v))
	case ok:
		fs.bucket = int64(binary.BigEndian.Uint64(v))
	}
	fs.expire()
	return &fs, nil
}

// IdentityRecord returns the changelog record (key and value) with which
// dedup records the first copy of e, arrived at arrival (epoch ms) at
// offset of usage.events, with expiry buckets of bucket: the state a
// partition holds for each identity it has seen. Benchmarks and tests seed
// a partition's state with it (millions of keys in seconds) to measure a
// restore or a failover without first deduplicating as many events.
func IdentityRecord(e *schemas.UsageEvent, arrival int64, bucket time.Duration, offset int64) (key, value []byte) {
	canon := schemas.AppendFramed(nil, e.CustomerID, e.Meter, e.EventID)
	sum := sha256.Sum256(canon)
	kh, verify := sum[:hashLen], sum[hashLen:hashLen+verifyLen]
	ph := payloadHash(e)
	b := uint32(arrival / bucket.Milliseconds())
	key = make([]byte, identityKeyLen)
	key[0] = prefixIdentity
	binary.BigEndian.PutUint32(key[1:5], b)
	copy(key[5:], kh)
	value = appendValue(nil, verify, ph[:], arrival-int64(b)*bucket.Milliseconds(), offset)
	return key, value
}
