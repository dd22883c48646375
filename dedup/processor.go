package dedup

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"time"

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
	// logAppend: a record of this partition had a LogAppendTime timestamp
	// (keyLogAppend); a CreateTime one after it stops the stage (handle).
	logAppend bool
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
	// committedForward is lastForward as of the last committed
	// transaction: an abort goes back to it, so that the ticks read again
	// forward as they did (0, none, would forward one the uninterrupted
	// run throttles).
	lastForward      int64
	committedForward int64
	// committedWM is the watermark as of the last committed transaction
	// (or the state Open read): an abort publishes it again, so that the
	// watermark gauge never keeps one that was never committed.
	committedWM int64

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
	// again: the bucket lies below keyDropped, so it expired before (its
	// keys came back with a restore from the changelog, which has no
	// range deletes): meterline_dedup_expired_buckets_total counted it
	// then.
	again bool
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
// the counters, and the buckets it expired to
// meterline_dedup_expired_buckets_total: here, for the partition may be
// revoked before its next transaction (its next owner, restored from the
// changelog, drops them again without counting them: again).
func (pt *partition) Committed() {
	pt.txc.Commit()
	pt.committedForward = pt.lastForward
	pt.committedWM = pt.wm
	n := 0
	for _, d := range pt.dropping {
		if !d.again {
			n++
		}
	}
	pt.pr.m.expired.Add(float64(n))
	pt.dropping = nil
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
	if p >= pr.counts.events {
		// Partitions were added to the events topic (and its changelog)
		// since this instance read the count: stop, as a start would, rather
		// than record the old count in the new partition's state and go on
		// re-routing and forwarding watermarks by it.
		return nil, fmt.Errorf("dedup: partition %d: %w: this instance started with %d partitions of %s, and was assigned partition %d; "+
			"adding partitions moves keys away from their earlier copies (docs/design.md, Event identity and keys)",
			p, ErrPartitionCountChanged, pr.counts.events, pr.eventsTopic, p)
	}
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
	if _, part.logAppend, err = st.Get(keyLogAppend); err != nil {
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
	part.committedWM = part.wm
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
		// A promoted standby's filters, or those the partition's revoked
		// instance here kept (Keep), in step with the state: no scan of
		// every key (docs/design.md, Exactly-once, 4).
		part.filters = *w
	} else {
		start := time.Now()
		if err := part.filters.load(p, st); err != nil {
			return nil, err
		}
		took := time.Since(start)
		pr.m.filterLoad.Observe(took.Seconds())
		pr.log.Info("bloom filters built from every identity key of the state", zap.Int32("partition", p),
			zap.Int("keys", part.keyCount()), zap.Duration("took", took))
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

// Close implements stream.Partition.
func (pt *partition) Close() {
	if !pt.pr.owners.Release(pt.p, pt) {
		return // a newer instance of the partition owns the gauges
	}
	pt.pr.m.keys.DeleteLabelValues(pt.pl)
	pt.pr.m.watermark.DeleteLabelValues(pt.pl)
	pt.pr.m.wmDelay.DeleteLabelValues(pt.pl)
}

// Abort implements stream.Aborter: the aborted transaction's state writes
// are gone, so the metadata keys it may have carried are written again and
// the watermark is read back from the committed state, and the last
// forward of the watermark is the committed one. (Identity keys need
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
	pt.writeMeta, pt.reloadWM, pt.lastForward = true, true, pt.committedForward
	pt.wm = pt.committedWM // read back from the state by the next begin
	pt.expired, pt.dropTo = -1, -1
	pt.flushed = false
	pt.txc.Drop()
	pt.undoFilters()
	pt.publish()
}

// undoFilters puts back the filters of the buckets the open transaction
// dropped and takes the keys it stored out of the key counts: it did not
// commit, or its outcome is not known (a dropped bucket whose drop did
// commit keeps a filter: one that says maybe is still correct).
func (pt *partition) undoFilters() {
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
}

// Keep implements stream.Keeper: the partition is revoked, and its filters
// are kept for its next restore here (docs/operations.md, Rebalances that
// give a partition back), which replays through them (filters.Apply) what
// another owner wrote meanwhile. They hold every identity key of the
// committed state: those Open had, and every key a transaction stored
// since. The last transaction cannot commit any more, or its outcome is
// unknown: the buckets it dropped get their filters back, as on an Abort
// (the store may still hold their keys). The keys it stored keep their
// Bloom bits.
func (pt *partition) Keep() stream.WarmState {
	pt.undoFilters()
	fs := pt.filters
	// A kept filter set follows no keyDropped of its own (a standby's
	// does): Open drops the buckets the restored state says are gone.
	fs.pr, fs.dropped, fs.pending = nil, 0, nil
	pt.filters = newFilters()
	return &fs
}

// Flush implements stream.Flusher: the transaction is about to commit.
func (pt *partition) Flush(*stream.Tx) error {
	pt.flushed = true
	return nil
}

// keyCount returns the identity keys the filters count.
func (fs *filters) keyCount() int {
	n := 0
	for _, k := range fs.keys {
		n += k
	}
	return n
}

func (pt *partition) publish() {
	pt.pr.m.keys.WithLabelValues(pt.pl).Set(float64(pt.keyCount()))
	if pt.wm > 0 {
		pt.pr.m.watermark.WithLabelValues(pt.pl).Set(float64(pt.wm) / 1000)
	}
}
