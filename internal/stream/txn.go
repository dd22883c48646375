package stream

import (
	"bytes"
	"sort"

	"github.com/twmb/franz-go/pkg/kgo"
)

// The transaction's view of state (Tx): a partition's uncommitted writes
// over Pebble, and the changelog records they become.

type entry struct {
	val []byte
	del bool
	// gone: the key was removed from writes (Forget, DeleteRangeLocal);
	// its place in order stays until order is compacted.
	gone bool
}

type rangeDel struct{ lo, hi []byte }

// overlay is one partition's uncommitted writes.
type overlay struct {
	// writes maps a key written to its place in order and vals. A map of
	// small values: a transaction writes thousands of keys, and a map's
	// slots of whole entries would be twice the memory, made and cleared
	// every transaction, and looked up once more for each key when the
	// transaction ends (vals is read in order instead).
	writes map[string]int32
	// order is the keys' first-write order, for deterministic changelog
	// output, and vals[i] is order[i]'s write. A key removed from writes
	// (Forget, DeleteRangeLocal) stays in order, its entry gone and its
	// place in dropped, until order is compacted (compact); a key written
	// again meanwhile keeps its place.
	order     []string
	vals      []entry
	dropped   map[string]int32
	rangeDels []rangeDel
	// inputNext is the next input offset after this transaction, by the
	// state key of its topic (Config.inputOffsetKey); nil: none consumed.
	inputNext map[string]int64
	// startFenced: inputNext holds a start offset fenceFirst recorded
	// (work.go), committed with the transaction.
	startFenced bool
	touched     bool
	// skipped are the input topics of which the transaction skipped a
	// batch the partition rejected (oversized.go).
	skipped []string
	// in and out count the records this transaction consumed and emitted
	// for the partition, by topic: added to records_in and records_out
	// when it commits (Runtime.committed), dropped with the overlay when
	// it does not (docs/operations.md, Health, metrics and logs: input
	// consumed again after an abort is counted once).
	in, out topicCounts
	// room is the keys the overlay has room for (newOverlaySized),
	// made at its first write.
	room int
	// time counts the input records the partition took as time records
	// (Tx.TimeRecord), by topic: added to time_records_in as in is to
	// records_in.
	time topicCounts
}

func newOverlay() *overlay { return newOverlaySized(0) }

// newOverlaySized returns an overlay with room for n keys: a partition's
// transactions mostly write as many keys as its previous one
// (overlay.sizeHint), and a map grown key by key to that many rehashes
// every key a few times over, in every transaction. The room is made at
// its first write: an overlay that writes nothing (a partition that only
// punctuated) allocates nothing.
func newOverlaySized(n int) *overlay {
	return &overlay{room: min(n, maxOverlayHint)}
}

// maxOverlayHint bounds the room an overlay is made with: a transaction
// that wrote many more keys (a chunk of Work) leaves the next one no more
// than this to allocate, and clear, that it may not use.
const maxOverlayHint = 1 << 14

// sizeHint is the room for the next overlay of the partition: the keys
// this one wrote, or, when it wrote fewer, most of the room it was made
// with. A transaction in which the partition only punctuated, or read a
// tick of usage.entitlements (the aggregator's, every
// --entitlements-tick, whether or not the transaction has input of the
// partition), writes no key or a few: sized by it alone, the next
// overlay would grow to the partition's usual size key by key again. The
// room shrinks by an eighth a transaction that writes less.
func (ov *overlay) sizeHint() int { return max(len(ov.order), ov.room-ov.room/8) }

// topicCounts counts records by topic: a partition reads and writes a
// handful of topics, mostly one after another.
type topicCounts []topicCount

type topicCount struct {
	topic string
	n     int
}

func (tc *topicCounts) add(topic string, n int) {
	c := *tc
	if k := len(c); k > 0 && c[k-1].topic == topic {
		c[k-1].n += n
		return
	}
	for i := range c {
		if c[i].topic == topic {
			c[i].n += n
			return
		}
	}
	*tc = append(c, topicCount{topic, n})
}

// Tx is the view of one partition inside the current transaction.
type Tx struct {
	rt *Runtime
	p  int32
	ov *overlay
}

// Partition returns the input partition this view belongs to.
func (tx *Tx) Partition() int32 { return tx.p }

// Get reads a state key: the transaction's own writes first, then Pebble.
func (tx *Tx) Get(k []byte) ([]byte, bool, error) {
	if i, ok := tx.ov.writes[string(k)]; ok {
		if e := tx.ov.vals[i]; e.del {
			return nil, false, nil
		}
		return tx.ov.vals[i].val, true, nil
	}
	for _, rd := range tx.ov.rangeDels {
		if bytes.Compare(k, rd.lo) >= 0 && bytes.Compare(k, rd.hi) < 0 {
			return nil, false, nil
		}
	}
	return tx.rt.store.Get(tx.p, k)
}

// Put writes a state key. It reaches the changelog when the transaction
// ends and Pebble only after it committed.
func (tx *Tx) Put(k, v []byte) {
	tx.write(k, entry{val: bytes.Clone(v)})
}

// Delete deletes a state key (a changelog tombstone).
func (tx *Tx) Delete(k []byte) {
	tx.write(k, entry{del: true})
}

// Forget undoes the open transaction's writes of k, as if it had never
// written k: Get and Scan see k as they would without them, and k gets no
// changelog record and no store write from this transaction.
//
// It is for a key this transaction created, one the committed state does
// not hold (the caller knows it, e.g. from a sequence number handed out
// in this transaction): such a key is then gone without a trace, where
// Delete would leave a changelog tombstone for a key that never reached
// the changelog. For a key the committed state holds, Forget does not
// delete it: its committed value shows again. A write of k after Forget
// is a new write; k keeps its place in the changelog order.
func (tx *Tx) Forget(k []byte) {
	ov := tx.ov
	i, ok := ov.writes[string(k)]
	if !ok {
		return
	}
	ks := ov.order[i]
	delete(ov.writes, ks)
	ov.drop(ks, i)
}

// drop records that ks, at i in order, was removed from writes, and
// compacts order once most of it is dropped keys (amortized O(1) a drop).
func (ov *overlay) drop(ks string, i int32) {
	ov.vals[i] = entry{gone: true}
	if ov.dropped == nil {
		ov.dropped = map[string]int32{}
	}
	ov.dropped[ks] = i
	if len(ov.dropped) >= 64 && 2*len(ov.dropped) > len(ov.order) {
		ov.compact()
	}
}

// compact removes the dropped keys from order and vals.
func (ov *overlay) compact() {
	n := 0
	for i, k := range ov.order {
		if ov.vals[i].gone {
			continue
		}
		ov.order[n], ov.vals[n] = k, ov.vals[i]
		ov.writes[k] = int32(n)
		n++
	}
	clear(ov.order[n:])
	clear(ov.vals[n:])
	ov.order, ov.vals = ov.order[:n], ov.vals[:n]
	clear(ov.dropped)
}

func (tx *Tx) write(k []byte, e entry) {
	ov := tx.ov
	if ov.writes == nil {
		ov.writes = make(map[string]int32, ov.room)
		ov.order, ov.vals = make([]string, 0, ov.room), make([]entry, 0, ov.room)
	}
	ov.touched = true
	if i, ok := ov.writes[string(k)]; ok {
		ov.vals[i] = e
		return
	}
	ks := string(k)
	if i, was := ov.dropped[ks]; was {
		delete(ov.dropped, ks) // still in order, at its first write
		ov.vals[i] = e
		ov.writes[ks] = i
		return
	}
	ov.writes[ks] = int32(len(ov.order))
	ov.order = append(ov.order, ks)
	ov.vals = append(ov.vals, e)
}

// Scan calls fn for every live key in [lo, hi) in key order, merging the
// transaction's own writes over Pebble. fn must not keep k or v, and must
// not write through tx while scanning.
func (tx *Tx) Scan(lo, hi []byte, fn func(k, v []byte) error) error {
	var mine []string
	for k := range tx.ov.writes {
		if k >= string(lo) && (hi == nil || k < string(hi)) {
			mine = append(mine, k)
		}
	}
	sort.Strings(mine)
	inRangeDel := func(k []byte) bool {
		for _, rd := range tx.ov.rangeDels {
			if bytes.Compare(k, rd.lo) >= 0 && bytes.Compare(k, rd.hi) < 0 {
				return true
			}
		}
		return false
	}
	i := 0
	emitMine := func(upTo []byte) error { // overlay keys < upTo (nil: all)
		for ; i < len(mine) && (upTo == nil || mine[i] < string(upTo)); i++ {
			if e := tx.ov.vals[tx.ov.writes[mine[i]]]; !e.del {
				if err := fn([]byte(mine[i]), e.val); err != nil {
					return err
				}
			}
		}
		return nil
	}
	err := tx.rt.store.Scan(tx.p, lo, hi, func(k, v []byte) error {
		if err := emitMine(k); err != nil {
			return err
		}
		if i < len(mine) && mine[i] == string(k) {
			i++ // the overlay's value (or deletion) wins
			if e := tx.ov.vals[tx.ov.writes[string(k)]]; !e.del {
				return fn(k, e.val)
			}
			return nil
		}
		if inRangeDel(k) {
			return nil
		}
		return fn(k, v)
	})
	if err != nil {
		return err
	}
	return emitMine(nil)
}

// DeleteRangeLocal deletes the keys in [lo, hi) from the local store when
// the transaction commits, without writing the changelog. It is for state
// whose expiry is derived from other state (a watermark) and so is
// re-derived after a restore; the changelog's own retention drops the old
// records.
func (tx *Tx) DeleteRangeLocal(lo, hi []byte) {
	tx.ov.rangeDels = append(tx.ov.rangeDels, rangeDel{bytes.Clone(lo), bytes.Clone(hi)})
	for k := range tx.ov.writes {
		if k >= string(lo) && k < string(hi) {
			// Its place now: a drop may compact order meanwhile.
			i := tx.ov.writes[k]
			delete(tx.ov.writes, k)
			tx.ov.drop(k, i)
		}
	}
	tx.ov.touched = true
}

// TimeRecord counts r, an input record of the transaction, as a time
// record: one that only moves time (dedup's ticks, the watermark records
// of usage.deduped), no event. Counted, by topic, in
// meterline_stream_time_records_in_total when the transaction commits, as
// r is in meterline_stream_records_in_total; the alert on rejections
// divides by the records in less these (docs/operations.md,
// MeterlineRejectionSpike). A record the partition rejects is no time
// record, whatever it claims to be.
func (tx *Tx) TimeRecord(r *kgo.Record) {
	tx.ov.time.add(r.Topic, 1)
}

// Emit produces an output record in the transaction. Topic and Partition
// must be set: the runtime partitions manually, so placement never depends
// on a client's partitioner.
func (tx *Tx) Emit(r *kgo.Record) {
	tx.ov.out.add(r.Topic, 1)
	tx.rt.emit(r)
}

// changelogRecords returns the overlay's changelog records in first-write
// order, plus the input-offset records (one per input topic consumed, in
// key order). The records, and their keys, are allocated together, not
// one by one: a transaction writes thousands of keys.
func (ov *overlay) changelogRecords(topic string, p int32) []*kgo.Record {
	inputs := ov.inputKeys()
	n, size := 0, 0
	for i, k := range ov.order {
		if !ov.vals[i].gone { // not removed by a Forget or a DeleteRangeLocal
			n, size = n+1, size+len(k)
		}
	}
	for _, k := range inputs {
		size += len(k)
	}
	recs := make([]kgo.Record, n+len(inputs))
	out := make([]*kgo.Record, 0, len(recs))
	keys := make([]byte, 0, size) // never nil: a key is never a null key
	add := func(k string, v []byte) {
		r := &recs[len(out)]
		r.Topic, r.Partition = topic, p
		start := len(keys)
		keys = append(keys, k...)
		r.Key, r.Value = keys[start:len(keys):len(keys)], v
		out = append(out, r)
	}
	for i, k := range ov.order {
		switch e := ov.vals[i]; {
		case e.gone:
		case e.del:
			add(k, nil)
		case e.val == nil:
			add(k, []byte{})
		default:
			add(k, e.val)
		}
	}
	for _, k := range inputs {
		add(k, encodeOffset(ov.inputNext[k]))
	}
	return out
}

// inputKeys returns the keys of inputNext in order.
func (ov *overlay) inputKeys() []string {
	ks := make([]string, 0, len(ov.inputNext))
	for k := range ov.inputNext {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// sortedPartitions returns the keys of m in order.
func sortedPartitions[V any](m map[int32]V) []int32 {
	out := make([]int32, 0, len(m))
	for p := range m {
		out = append(out, p)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}
