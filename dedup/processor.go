package dedup

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/meterline/meterline/internal/prom"
	"github.com/meterline/meterline/internal/stream"
	"github.com/meterline/meterline/schemas"
)

// ErrPartitionCountChanged is returned when usage.events has another
// partition count than the one recorded in the state: keys would no longer
// map to the partitions their earlier copies are in, so dedup refuses to run.
var ErrPartitionCountChanged = errors.New("partition count of the events topic changed")

// ErrBucketChanged is returned when Config.Bucket differs from the expiry
// bucket recorded in the state: identity keys are stored under the number
// of the arrival bucket of their first copy, which means another time with
// another bucket (a shorter one would expire every key at once, a longer
// one none for years), so dedup refuses to run.
var ErrBucketChanged = errors.New("expiry bucket changed")

// Headers of a re-routed record (docs/design.md, Event identity and keys).
// They are trusted only with a valid HeaderAuth signature (auth.go), or,
// for records re-routed before signatures existed, below the partition's
// upgrade offset.
const (
	// HeaderRerouted marks a record dedup re-produced to its canonical
	// partition. Value: "<partition>/<offset>" of the misrouted original.
	HeaderRerouted = "meterline-rerouted"
	// HeaderArrival carries the misrouted original's arrival time (epoch
	// ms), which stays the event's arrival time, within
	// [broker timestamp − W, broker timestamp].
	HeaderArrival = "meterline-arrival"
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

type processor struct {
	owners prom.Owners // which open partition owns its gauges
	cfg    Config
	log    *zap.Logger
	counts partitionCountsT
	m      *metrics
	now    func() time.Time
	keys   *keyring
	// endOffset returns the end offset of an events partition (the upgrade
	// offset of a partition that ran before signatures existed).
	endOffset func(p int32) (int64, error)
	// eventsRetention returns the events topic's retention.ms, negative
	// when infinite: how long a key that left the ring stays needed
	// (keyuse.go).
	eventsRetention func() (time.Duration, error)
	// forget: Config.ForgetKeys.
	forget map[string]bool
	// signUseKey is the state key of the signing key's last use.
	signUseKey []byte
	// sources maps each configured source to itself: the label values of
	// the per-source metrics; any other source is labelled "other".
	sources map[string]string
	// tickValue is the encoded Tick this instance appends.
	tickValue []byte

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
	pr *processor
	p  int32
	pl string // partition label
	// wm is the partition watermark: the largest broker timestamp seen,
	// epoch ms; 0: none yet. No header moves it.
	wm int64
	// writeMeta: write the metadata keys (partition count, upgrade offset,
	// watermark) in the next transaction: they are missing from the state,
	// or the transaction that wrote them was aborted.
	writeMeta bool
	// reloadWM: the last transaction was aborted; take the watermark from
	// the committed state again before the next use.
	reloadWM bool
	upgrade  int64 // unsigned re-route headers are honoured below this offset
	// skew: the S the state's keys were accepted under (skew.go).
	skew skewKeep
	// keyUses: the last signing use of each key of the ring this
	// partition's state records (keyuse.go), epoch ms; signUse is the
	// signing key's. dropUses: keys that left the ring, whose entries the
	// next transaction deletes.
	keyUses  map[string]int64
	signUse  int64
	dropUses []string
	// lastForward is the broker timestamp of the tick that last forwarded
	// the watermark; at most one tick per WatermarkEvery forwards.
	lastForward int64
	tickHeaders []kgo.RecordHeader // the signature of this partition's ticks
	// filters: the Bloom filter and key count of each live bucket (a
	// promoted standby's, kept warm, or built from the state in Open).
	filters
	expired int64 // every bucket below this has been dropped; -1: none
	dropTo  int64 // drop buckets below this in the next transaction
	// dropped is keyDropped as the open transaction sees it: the keys of
	// first arrivals before it are gone (epoch ms; 0: none).
	dropped int64
	// dropping: the filters of the buckets the open transaction dropped.
	// Their keys leave the store only if it commits: Abort puts them back,
	// so that its records, processed again at the committed watermark,
	// still find the copies the buckets hold.
	dropping []droppedBucket
	// flushed: the open transaction reached its commit (Flush ran). If no
	// Abort follows before the next transaction begins, it committed.
	flushed bool

	// Per-record scratch, reused: Process runs one record at a time.
	ev    schemas.UsageEvent
	canon []byte
	// accepted counts accepted events per source label, added to the
	// transaction's counts (txc) at the end of each Process:
	// WithLabelValues hashes the label on every call. It holds at most the
	// configured sources and "other".
	accepted     map[string]*pendingCount
	lastSource   string        // the source of the last accepted event
	lastAccepted *pendingCount // the entry of that source's label
	// txc: the open transaction's counts of records (accepted, duplicates,
	// rejected, re-routed, forged, ticks), added to the counters when it
	// commits and dropped when it aborts (docs/operations.md, Health,
	// metrics and logs: a record processed again after an abort is counted
	// once).
	txc prom.TxCounts
	// txKeys: the identity keys the open transaction added, per bucket
	// (runs, in the order added); Abort takes them back from keys.
	txKeys []bucketKeys
	// recs is a slab of output records, handed out one at a time.
	recs []kgo.Record
	slab []byte // output key and value bytes (alloc)
}

type bucketKeys struct {
	b uint32
	n int
}

type droppedBucket struct {
	b    uint32
	f    *bloom
	keys int
}

type pendingCount struct {
	source string
	c      prometheus.Counter
	n      int
}

// flushCounts adds the accepted counts gathered since the last call to
// the transaction's.
func (pt *partition) flushCounts() {
	for _, pc := range pt.accepted {
		if pc.n > 0 {
			pt.txc.Add(pc.c, float64(pc.n))
			pc.n = 0
		}
	}
}

// Committed implements stream.Committer: the transaction's counts go to
// the counters.
func (pt *partition) Committed() {
	pt.txc.Commit()
	pt.dropUses = nil // deleted by the first transaction, now committed
	pt.txKeys = pt.txKeys[:0]
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

// Open rebuilds the in-memory filters from the restored state, checks the
// partition count and the key ring (keyuse.go), and finds the upgrade
// offset.
func (pr *processor) Open(p int32, st *stream.PartitionState) (stream.Partition, error) {
	part := &partition{pr: pr, p: p, pl: strconv.Itoa(int(p)), filters: newFilters(),
		expired: -1, dropTo: -1, accepted: map[string]*pendingCount{}, keyUses: map[string]int64{},
		tickHeaders: pr.keys.tickHeaders(pr.eventsTopic, p, pr.tickValue)}
	pr.owners.Own(p, part)
	v, hasN, err := st.Get(keyPartitions)
	if err != nil {
		return nil, err
	}
	if hasN {
		if len(v) != 4 {
			return nil, fmt.Errorf("dedup: partition %d: corrupt partition count (%d bytes)", p, len(v))
		}
		n := int32(binary.BigEndian.Uint32(v))
		if n != pr.counts.events {
			return nil, fmt.Errorf("dedup: partition %d: %w: the state was built with %d partitions of %s, it now has %d; adding partitions moves keys away from their earlier copies (docs/design.md, Event identity and keys)",
				p, ErrPartitionCountChanged, n, pr.eventsTopic, pr.counts.events)
		}
	} else {
		part.writeMeta = true
	}
	if err := pr.checkKeyScheme(p, st, hasN); err != nil {
		return nil, err
	}
	switch v, ok, err := st.Get(keyBucket); {
	case err != nil:
		return nil, err
	case ok && len(v) != 8:
		return nil, fmt.Errorf("dedup: partition %d: corrupt expiry bucket (%d bytes)", p, len(v))
	case ok && int64(binary.BigEndian.Uint64(v)) != pr.cfg.Bucket.Milliseconds():
		was := time.Duration(binary.BigEndian.Uint64(v)) * time.Millisecond
		return nil, fmt.Errorf("dedup: partition %d: %w: the state in %s stores its keys by arrival buckets of %s, the configuration says %s; "+
			"a state's keys cannot be regrouped: run with --bucket %s, or with the new bucket on new topic names and a new consumer group",
			p, ErrBucketChanged, pr.cfg.Topics.DedupChangelogTopic(), was, pr.cfg.Bucket, was)
	case !ok:
		part.writeMeta = true
	}
	if part.wm, err = readWatermark(st.Get); err != nil {
		return nil, fmt.Errorf("dedup: partition %d: %w", p, err)
	}
	if part.dropped, err = readDropped(st.Get); err != nil {
		return nil, fmt.Errorf("dedup: partition %d: %w", p, err)
	}
	k, hasSkew, err := readSkew(st.Get)
	if err != nil {
		return nil, fmt.Errorf("dedup: partition %d: %w", p, err)
	}
	if part.skew = keepSkew(&pr.cfg, k, hasSkew, part.wm); !hasSkew || part.skew != k {
		part.writeMeta = true
	}
	if err := pr.openKeyUses(p, st, part); err != nil {
		return nil, err
	}
	switch v, ok, err := st.Get(keyUpgrade); {
	case err != nil:
		return nil, err
	case ok && len(v) == 8:
		part.upgrade = int64(binary.BigEndian.Uint64(v))
	case ok:
		return nil, fmt.Errorf("dedup: partition %d: corrupt upgrade offset (%d bytes)", p, len(v))
	case !hasN:
		// New state: this partition never ran without signatures, so no
		// unsigned re-route header is honoured.
		part.upgrade, part.writeMeta = 0, true
	default:
		// State of a version that did not sign its headers: what is in
		// the partition now may hold its re-routed records; anything
		// written from now on must be signed.
		if part.upgrade, err = pr.endOffset(p); err != nil {
			return nil, fmt.Errorf("dedup: partition %d: read the end offset of %s for the upgrade offset: %w", p, pr.eventsTopic, err)
		}
		part.writeMeta = true
		pr.log.Info("first run with signed headers: unsigned re-route headers are honoured only below the upgrade offset",
			zap.Int32("partition", p), zap.Int64("upgrade_offset", part.upgrade))
	}
	if w, ok := st.Warm().(*filters); ok {
		// A promoted standby's filters, in step with the state: no scan
		// of every key (docs/design.md, Exactly-once, 4).
		part.filters = *w
	} else if err := part.filters.load(p, st); err != nil {
		return nil, err
	}
	// State replayed from the changelog may hold buckets that had expired;
	// drop them in the first transaction.
	part.scheduleExpiry()
	part.publish()
	return part, nil
}

// checkKeyScheme refuses state of another key scheme of usage.deduped
// than schemas.DedupedKeyScheme (docs/design.md, Topics): its records in
// the deduped topic are keyed, and so partitioned, differently, and a run
// that added records of this scheme would split customers across
// partitions. hasN: the state is not new (it has the partition count). A
// new state gets the scheme with the other metadata keys in its first
// transaction.
func (pr *processor) checkKeyScheme(p int32, st *stream.PartitionState, hasN bool) error {
	v, ok, err := st.Get(keyKeyScheme)
	switch {
	case err != nil:
		return err
	case ok && string(v) != schemas.DedupedKeyScheme:
		if len(v) > 64 {
			v = v[:64]
		}
		return fmt.Errorf("dedup: partition %d: %w: the state in %s records the key scheme %q, this version keys %s by %q; "+
			"run it on new topic names and a new consumer group (docs/design.md, Topics)",
			p, schemas.ErrKeyScheme, pr.cfg.Topics.DedupChangelogTopic(), v, pr.dedupedTopic, schemas.DedupedKeyScheme)
	case !ok && hasN:
		return fmt.Errorf("dedup: partition %d: %w: the state in %s was built keying %s by customer and meter, this version keys it by %q; "+
			"run it on new topic names (the default names changed with the key) and a new consumer group (docs/design.md, Topics)",
			p, schemas.ErrKeyScheme, pr.cfg.Topics.DedupChangelogTopic(), pr.dedupedTopic, schemas.DedupedKeyScheme)
	}
	return nil
}

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

// Close implements stream.Partition.
func (pt *partition) Close() {
	if !pt.pr.owners.Release(pt.p, pt) {
		return // a newer instance of the partition owns the gauges
	}
	pt.pr.m.keys.DeleteLabelValues(pt.pl)
	pt.pr.m.watermark.DeleteLabelValues(pt.pl)
	pt.pr.m.wmDelay.DeleteLabelValues(pt.pl)
}

// Punctuate appends a signed tick to the partition's usage.events
// partition. Its broker timestamp, when read back, advances the watermark
// (docs/design.md, Time).
func (pt *partition) Punctuate(tx *stream.Tx) error {
	if err := pt.begin(tx); err != nil {
		return err
	}
	tx.Emit(&kgo.Record{
		Topic:     pt.pr.eventsTopic,
		Partition: pt.p,
		Value:     pt.pr.tickValue,
		Headers:   pt.tickHeaders,
	})
	pt.noteSigned(tx)
	if pt.wm > 0 {
		pt.pr.m.wmDelay.WithLabelValues(pt.pl).Set(pt.pr.now().Sub(time.UnixMilli(pt.wm)).Seconds())
	}
	return nil
}

// Abort implements stream.Aborter: the aborted transaction's state writes
// are gone, so the metadata keys it may have carried are written again and
// the watermark is read back from the committed state. (Identity keys need
// nothing: a Bloom filter that gained a key stays correct, and the records
// are consumed again.)
//
// A bucket drop the aborted transaction carried (a local range delete,
// applied only on commit) is lost with it, and the filters of the buckets
// it dropped go back: the watermark goes back to the committed one, at
// which those buckets may still be live, and their keys are still in the
// store (their records, processed again, must find the copies they hold).
// begin decides again from that watermark which buckets are due, and drops
// every bucket below (a range from the first bucket; dropping one twice
// does nothing).
func (pt *partition) Abort() {
	pt.writeMeta, pt.reloadWM, pt.lastForward = true, true, 0
	pt.expired, pt.dropTo = -1, -1
	pt.flushed = false
	pt.txc.Drop()
	for _, d := range pt.dropping {
		if f, ok := pt.blooms[d.b]; ok {
			// A key stored in the bucket since (cannot happen: keys go to
			// live buckets): keep both filters.
			f.filters = append(f.filters, d.f.filters...)
			pt.keys[d.b] += d.keys
			continue
		}
		pt.blooms[d.b], pt.keys[d.b] = d.f, d.keys
		pt.buckets = append(pt.buckets, d.b)
	}
	if len(pt.dropping) > 0 {
		sort.Slice(pt.buckets, func(i, j int) bool { return pt.buckets[i] > pt.buckets[j] })
	}
	pt.dropping = nil
	// The keys the transaction stored are not in the state (their Bloom
	// bits stay: a filter that says maybe is still correct).
	for _, k := range pt.txKeys {
		if _, ok := pt.keys[k.b]; ok {
			pt.keys[k.b] -= k.n
		}
	}
	pt.txKeys = pt.txKeys[:0]
	pt.publish()
}

// Flush implements stream.Flusher: the transaction is about to commit.
func (pt *partition) Flush(*stream.Tx) error {
	pt.flushed = true
	return nil
}

// begin writes what a transaction must carry on its first use: the
// metadata keys when due, and pending expiry.
func (pt *partition) begin(tx *stream.Tx) error {
	if pt.flushed {
		// The previous transaction committed (an abort would have called
		// Abort): the buckets it dropped are gone from the store.
		pt.pr.m.expired.Add(float64(len(pt.dropping)))
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
		for _, b := range pt.buckets {
			if int64(b) < pt.dropTo {
				pt.dropping = append(pt.dropping, droppedBucket{b: b, f: pt.blooms[b], keys: pt.keys[b]})
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

// arrivalOf returns an event record's arrival time and whether its
// re-route headers are proven (docs/design.md, Event identity and keys). A
// record without dedup's headers arrived at its broker timestamp ts. A
// re-routed record keeps the original's arrival, carried in a header, when
// its signature verifies (or, unsigned, when it lies below the upgrade
// offset); that arrival is clamped to [ts − W, ts]. Headers that fail are
// counted and change nothing: the record is an ordinary producer record.
func (pt *partition) arrivalOf(r *kgo.Record, h *dedupHeaders, ts int64) (arrival int64, proven bool) {
	if !h.any {
		return ts, false
	}
	var rr rerouted
	var why string
	if !h.hasAuth && r.Offset < pt.upgrade {
		// Re-routed before dedup signed its headers.
		var ok bool
		if rr, ok = parseRerouted(h); !ok {
			why = "malformed or repeated re-route headers"
		}
	} else {
		rr, why = pt.pr.keys.verifyReroute(pt.pr.eventsTopic, r, h)
	}
	if why != "" {
		pt.forged(r, why)
		return ts, false
	}
	return min(max(rr.arrival, ts-pt.pr.cfg.Window.Milliseconds()), ts), true
}

// forged counts and logs a record whose dedup headers are not proven.
func (pt *partition) forged(r *kgo.Record, why string) {
	pt.txc.Inc(pt.pr.m.forged)
	pt.pr.log.Warn("dedup headers not proven; handled as an ordinary producer record", zap.String("why", why),
		zap.Int32("partition", r.Partition), zap.Int64("offset", r.Offset), zap.ByteString("key", boundLogKey(r.Key)))
}

// boundLogKey keeps at most 256 bytes of a key for a log line.
func boundLogKey(k []byte) []byte {
	if len(k) > 256 {
		return k[:256]
	}
	return k
}

// handle decides one record. Bad input is rejected, never returned; an
// error means the local state could not be read, and stops the stage.
func (pt *partition) handle(tx *stream.Tx, r *kgo.Record) error {
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

// tick forwards the watermark on a tick that dedup signed (or, unsigned,
// one below the upgrade offset), at most once per WatermarkEvery of broker
// time: a producer's ticks, or a flood of replayed ones, fan out nothing
// more (docs/design.md, Time). Every tick's timestamp has already advanced
// the watermark, as any record's does.
func (pt *partition) tick(tx *stream.Tx, r *kgo.Record, m *schemas.Tick, h *dedupHeaders, ts int64) error {
	if h.hasAuth || r.Offset >= pt.upgrade {
		if why := pt.pr.keys.verifyTick(pt.pr.eventsTopic, r, h); why != "" {
			if h.any {
				pt.forged(r, why)
			}
			pt.txc.Inc(pt.pr.m.unauthTicks)
			// The instance the tick names tells a producer's ticks from a
			// dedup instance's signed with another key ring.
			pt.pr.log.Warn("tick not authenticated; it forwards no watermark", zap.String("why", why),
				zap.ByteString("tick_instance", boundLogKey([]byte(m.InstanceID))),
				zap.Int32("partition", r.Partition), zap.Int64("offset", r.Offset))
			return nil
		}
	}
	if pt.lastForward != 0 && ts < pt.lastForward+pt.pr.cfg.WatermarkEvery.Milliseconds() {
		pt.txc.Inc(pt.pr.m.throttledTicks)
		return nil
	}
	pt.lastForward = ts
	return pt.forwardWatermark(tx)
}

// forwardWatermark sends the partition watermark to every usage.deduped
// partition; the aggregator takes the minimum over all sources.
func (pt *partition) forwardWatermark(tx *stream.Tx) error {
	c := pt.pr.counts
	// Each record states W, B and S: the aggregator keeps state by them and
	// refuses to run with shorter ones (docs/design.md, Time).
	cfg := &pt.pr.cfg
	v, err := schemas.Encode(&schemas.Watermark{SourcePartition: pt.p, SourcePartitions: c.events, Watermark: pt.wm,
		WindowMs: cfg.Window.Milliseconds(), BucketMs: cfg.Bucket.Milliseconds(), SkewMs: cfg.Skew.Milliseconds()})
	if err != nil {
		return fmt.Errorf("dedup: partition %d: encode watermark: %w", pt.p, err)
	}
	for i := int32(0); i < c.deduped; i++ {
		tx.Emit(&kgo.Record{Topic: pt.pr.dedupedTopic, Partition: i, Value: v})
	}
	return nil
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

// reroute re-produces a misrouted event to its canonical partition with
// its canonical key, carrying the original's coordinates and arrival in
// signed headers.
func (pt *partition) reroute(tx *stream.Tx, r *kgo.Record, canon []byte, e *schemas.UsageEvent, arrival int64) error {
	to := schemas.Partition(canon, pt.pr.counts.events)
	key := bytes.Clone(canon)
	ok, err := pt.emitDerived(tx, r, e, &kgo.Record{
		Topic:     pt.pr.eventsTopic,
		Partition: to,
		Key:       key,
		Value:     r.Value,
		Headers: pt.pr.keys.rerouteHeaders(pt.pr.eventsTopic, to, key, r.Value,
			rerouted{origPartition: r.Partition, origOffset: r.Offset, arrival: arrival}),
	}, "re-routed")
	if !ok {
		return err
	}
	pt.noteSigned(tx)
	pt.txc.Inc(pt.pr.m.rerouted)
	pt.pr.log.Info("misrouted record re-routed", zap.ByteString("key", boundLogKey(r.Key)), zap.ByteString("canonical_key", canon),
		zap.Int32("partition", r.Partition), zap.Int64("offset", r.Offset), zap.Int32("to_partition", to))
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
	n := pt.pr.counts.rejected
	part := r.Partition % n
	if len(r.Key) > 0 {
		part = schemas.Partition(r.Key, n)
	}
	v, err := schemas.EncodeRejected(nil, rej)
	if err != nil {
		return fmt.Errorf("dedup: partition %d offset %d: encode rejected record: %w", r.Partition, r.Offset, err)
	}
	rec := &kgo.Record{Topic: pt.pr.rejectedTopic, Partition: part, Key: schemas.RejectedKey(r.Key), Value: v}
	if recordBytes(rec) > pt.pr.cfg.MaxRecordBytes {
		// Validate keeps MaxRecordBytes above schemas.MaxRejectedBytes, so
		// this cannot happen; if it did, the digests and lengths remain.
		rej.RawKey, rej.RawValue, rec.Key = nil, nil, nil
		if rec.Value, err = schemas.EncodeRejected(nil, rej); err != nil {
			return fmt.Errorf("dedup: partition %d offset %d: encode rejected record: %w", r.Partition, r.Offset, err)
		}
	}
	tx.Emit(rec)
	pt.txc.Inc(pt.pr.m.rejected.WithLabelValues("dedup", reason))
	pt.pr.log.Info("record rejected", zap.String("reason", reason), zap.String("detail", rej.Detail),
		zap.ByteString("key", boundLogKey(r.Key)), zap.Int32("partition", r.Partition), zap.Int64("offset", r.Offset))
	return nil
}

func msTime(ms int64) string { return time.UnixMilli(ms).UTC().Format(time.RFC3339Nano) }
