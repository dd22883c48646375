package stream

import (
	"fmt"
	"slices"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"
)

// Local runs one partition of a Processor on an in-memory store, without
// a broker or a session: the per-partition work of a stage (Process,
// Work when asked, Flush, the changelog records and the store writes of a
// committed transaction, Committed, or an Abort), for benchmarks and fuzz
// tests. It is not a Runtime: there are no transactions on a broker, no
// timer (Punctuate runs when called), and the records the partition
// emits are only counted unless Keep was called; a restore is
// RestoreLocal, from the changelog records Keep kept.
type Local struct {
	rt      *Runtime
	p       int32
	part    Partition
	ov      *overlay
	inputs  Config // for the input offsets' state keys
	emitted map[string]int
	// keep: Keep was called. pending holds the open transaction's emitted
	// records, out those of committed transactions not yet taken
	// (TakeOutput), changelog the changelog records of every committed
	// transaction since Keep, in order.
	keep         bool
	pending, out []*kgo.Record
	changelog    []*kgo.Record
}

// NewLocal opens partition p of proc on an empty in-memory store. The
// input offsets are kept under the keys a Runtime with InputTopic input
// would use.
func NewLocal(proc Processor, p int32, input string) (*Local, error) {
	return openLocal(proc, p, input, nil, vfs.NewMem(), "local")
}

// NewLocalIn is NewLocal on a store in dir on disk, for tests that
// measure the store's files.
func NewLocalIn(proc Processor, p int32, input, dir string) (*Local, error) {
	return openLocal(proc, p, input, nil, vfs.Default, dir)
}

// RestoreLocal opens partition p of proc on an in-memory store restored
// from changelog, the changelog records of a Local (Changelog) in order, as
// a restore from the start of the changelog topic leaves it. The new Local
// keeps its records (Keep), and its changelog continues the one given.
func RestoreLocal(proc Processor, p int32, input string, changelog []*kgo.Record) (*Local, error) {
	if changelog == nil {
		changelog = []*kgo.Record{} // of a Local that committed nothing: kept all the same
	}
	return openLocal(proc, p, input, changelog, vfs.NewMem(), "local")
}

func openLocal(proc Processor, p int32, input string, changelog []*kgo.Record, fs vfs.FS, dir string) (*Local, error) {
	st, err := OpenStore(dir, fs, zap.NewNop())
	if err != nil {
		return nil, err
	}
	l := &Local{p: p, ov: newOverlay(), inputs: Config{InputTopic: input}, emitted: map[string]int{}}
	l.rt = &Runtime{store: st, sink: func(r *kgo.Record) {
		l.emitted[r.Topic]++
		if l.keep {
			l.pending = append(l.pending, r)
		}
	}}
	if changelog != nil {
		// In batches of restoreBatch records, as a restore from the
		// changelog topic writes them.
		for c := range slices.Chunk(changelog, restoreBatch) {
			b := st.newBatch()
			for _, r := range c {
				if r.Value == nil {
					b.del(p, r.Key)
				} else {
					b.set(p, r.Key, r.Value)
				}
			}
			if err := b.commit(); err != nil {
				_ = st.Close()
				return nil, fmt.Errorf("stream: local: restore partition %d: %w", p, err)
			}
		}
		l.keep, l.changelog = true, slices.Clone(changelog)
	}
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
		cl := l.ov.changelogRecords("changelog", l.p)
		if l.keep {
			l.changelog = append(l.changelog, cl...)
		}
	}
	b := l.rt.store.newBatch()
	for _, rd := range l.ov.rangeDels {
		b.deleteRange(l.p, rd.lo, rd.hi)
	}
	for i, k := range l.ov.order {
		if e := l.ov.vals[i]; !e.gone {
			if e.del {
				del(b, l.p, k)
			} else {
				set(b, l.p, k, e.val)
			}
		}
	}
	for _, k := range l.ov.inputKeys() {
		set(b, l.p, k, encodeOffset(l.ov.inputNext[k]))
	}
	if err := b.commit(); err != nil {
		return fmt.Errorf("stream: local: apply: %w", err)
	}
	if c, ok := l.part.(Committer); ok {
		c.Committed()
	}
	l.ov = newOverlaySized(l.ov.sizeHint())
	l.out, l.pending = append(l.out, l.pending...), nil
	return nil
}

// Abort ends the open transaction as an aborted one: its writes and the
// records it emitted are dropped, and the partition's Abort runs, as the
// runtime does before the input is consumed again from the committed
// offset. It returns the records the transaction emitted (Keep; nil
// without), which never reach a reader.
func (l *Local) Abort() []*kgo.Record {
	l.ov = newOverlaySized(l.ov.sizeHint())
	dropped := l.pending
	l.pending = nil
	if a, ok := l.part.(Aborter); ok {
		a.Abort()
	}
	return dropped
}

// Keep makes the Local keep, from now on, the records the partition emits
// (TakeOutput: those of committed transactions) and the changelog records
// of every committed transaction (Changelog).
func (l *Local) Keep() { l.keep = true }

// TakeOutput returns the records emitted by the transactions committed
// since the last call, in order (Keep).
func (l *Local) TakeOutput() []*kgo.Record {
	out := l.out
	l.out = nil
	return out
}

// Changelog returns the changelog records of every committed transaction
// since Keep, in order: the input of RestoreLocal.
func (l *Local) Changelog() []*kgo.Record { return l.changelog }

// DB is the store's Pebble DB (metrics).
func (l *Local) DB() *pebble.DB { return l.rt.store.DB() }

// Emitted returns how many records the partition emitted to topic.
func (l *Local) Emitted(topic string) int { return l.emitted[topic] }

// Close closes the partition and the store.
func (l *Local) Close() error {
	l.part.Close()
	return l.rt.store.Close()
}

// Work gives the partition, a Worker with work (HasWork), one call of
// Work in the open transaction, as the runtime's run loop does; it reports
// whether it did.
func (l *Local) Work() (bool, error) {
	w, ok := l.part.(Worker)
	if !ok || !w.HasWork() {
		return false, nil
	}
	return true, w.Work(&Tx{rt: l.rt, p: l.p, ov: l.ov})
}

// HasWork reports whether the partition, a Worker, has chunked work that
// a Runtime would give it a transaction of its own for (Worker.HasWork).
func (l *Local) HasWork() bool {
	w, ok := l.part.(Worker)
	return ok && w.HasWork()
}

// Punctuate gives the partition one call of Punctuate in the open
// transaction, as the runtime does every punctuate interval.
func (l *Local) Punctuate() error {
	return l.part.Punctuate(&Tx{rt: l.rt, p: l.p, ov: l.ov})
}

// RejectBatch hands b, a batch of the partition's input rejected
// unread, to the partition, a BatchRejecter, inside the open transaction,
// and moves the input past it, as the runtime does.
func (l *Local) RejectBatch(b RejectedBatch) error {
	if err := l.part.(BatchRejecter).RejectBatch(&Tx{rt: l.rt, p: l.p, ov: l.ov}, b); err != nil {
		return err
	}
	if l.ov.inputNext == nil {
		l.ov.inputNext = map[string]int64{}
	}
	l.ov.inputNext[l.inputs.inputOffsetKey(b.Topic)] = b.Next
	l.ov.touched = true
	return nil
}
