package stream

import (
	"fmt"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"
)

// Local runs one partition of a Processor on an in-memory store, without
// a broker or a session: the per-partition work of a stage (Process,
// Flush, the changelog records and the store writes of a committed
// transaction, Committed), for benchmarks. It is not a Runtime: there are no
// transactions on a broker, no restore, no Punctuate or Work, and the
// records the partition emits are only counted.
type Local struct {
	rt      *Runtime
	p       int32
	part    Partition
	ov      *overlay
	inputs  Config // for the input offsets' state keys
	emitted map[string]int
}

// NewLocal opens partition p of proc on an empty in-memory store. The
// input offsets are kept under the keys a Runtime with InputTopic input
// would use.
func NewLocal(proc Processor, p int32, input string) (*Local, error) {
	st, err := OpenStore("local", vfs.NewMem(), zap.NewNop())
	if err != nil {
		return nil, err
	}
	l := &Local{p: p, ov: newOverlay(), inputs: Config{InputTopic: input}, emitted: map[string]int{}}
	l.rt = &Runtime{store: st, sink: func(r *kgo.Record) { l.emitted[r.Topic]++ }}
	part, err := proc.Open(p, &PartitionState{s: st, p: p})
	if err != nil {
		_ = st.Close()
		return nil, fmt.Errorf("stream: local: open partition %d: %w", p, err)
	}
	l.part = part
	return l, nil
}

// Process hands recs, records of one topic of the partition, to the
// partition inside the open transaction, as the runtime does with a fetch.
func (l *Local) Process(recs []*kgo.Record) error {
	if len(recs) == 0 {
		return nil
	}
	if err := l.part.Process(&Tx{rt: l.rt, p: l.p, ov: l.ov}, recs); err != nil {
		return err
	}
	if l.ov.inputNext == nil {
		l.ov.inputNext = map[string]int64{}
	}
	l.ov.inputNext[l.inputs.inputOffsetKey(recs[0].Topic)] = recs[len(recs)-1].Offset + 1
	l.ov.touched = true
	return nil
}

// Commit ends the open transaction as a committed one: the partition's
// Flush, its changelog records (made, then dropped), the store's batch of
// its writes and the partition's Committed.
func (l *Local) Commit() error {
	if f, ok := l.part.(Flusher); ok {
		if err := f.Flush(&Tx{rt: l.rt, p: l.p, ov: l.ov}); err != nil {
			return err
		}
	}
	if l.ov.touched {
		_ = l.ov.changelogRecords("changelog", l.p)
	}
	b := l.rt.store.newBatch()
	for _, rd := range l.ov.rangeDels {
		b.deleteRange(l.p, rd.lo, rd.hi)
	}
	for _, k := range l.ov.order {
		if e, ok := l.ov.writes[k]; ok {
			if e.del {
				b.del(l.p, []byte(k))
			} else {
				b.set(l.p, []byte(k), e.val)
			}
		}
	}
	for _, k := range l.ov.inputKeys() {
		b.set(l.p, []byte(k), encodeOffset(l.ov.inputNext[k]))
	}
	if err := b.commit(); err != nil {
		return fmt.Errorf("stream: local: apply: %w", err)
	}
	if c, ok := l.part.(Committer); ok {
		c.Committed()
	}
	l.ov = newOverlaySized(l.ov.sizeHint())
	return nil
}

// Emitted returns how many records the partition emitted to topic.
func (l *Local) Emitted(topic string) int { return l.emitted[topic] }

// Close closes the partition and the store.
func (l *Local) Close() error {
	l.part.Close()
	return l.rt.store.Close()
}

// HasWork reports whether the partition, a Worker, has chunked work that
// a Runtime would give it a transaction of its own for (Worker.HasWork).
func (l *Local) HasWork() bool {
	w, ok := l.part.(Worker)
	return ok && w.HasWork()
}
