package stream

import "github.com/twmb/franz-go/pkg/kgo"

// Partition is a processor's handle on one input partition, created by
// Processor.Open once the partition's state is restored. The runtime calls
// it from its single run loop only.
//
// A Partition keeps its state in the store through Tx: reads see the
// transaction's own writes, and writes become durable only if the
// transaction commits. In-memory structures a Partition keeps besides must
// tolerate an aborted transaction (a Bloom filter that gained a key is
// fine; a counter is not), or be rebuilt in Open.
type Partition interface {
	// Process handles records of the partition, in offset order. Outputs
	// are emitted and state changed through tx. An error stops the stage;
	// bad input must be handled (rejected), not returned.
	Process(tx *Tx, recs []*kgo.Record) error
	// Punctuate runs every punctuate interval for a ready partition.
	Punctuate(tx *Tx) error
	// Close releases the partition when it is revoked or the stage stops.
	Close()
}

// Flusher is implemented by a Partition that emits once per transaction
// (the aggregator's one revision per changed key): Flush runs just before
// the transaction's changelog is written, and may read, write and emit.
type Flusher interface {
	Flush(tx *Tx) error
}

// Aborter is implemented by a Partition that keeps per-transaction memory
// (what Flush will emit): Abort runs when a transaction it took part in is
// aborted or discarded.
type Aborter interface {
	Abort()
}

// Processor is the logic of a stateful stage.
type Processor interface {
	// Open is called once partition p's state has been restored from the
	// changelog, before any of its input is processed. It runs on the
	// restore goroutine and may read the restored state through st.
	Open(p int32, st *PartitionState) (Partition, error)
}

// PartitionState reads one partition's restored state in Pebble.
type PartitionState struct {
	s *Store
	p int32
}

// Partition returns the partition number.
func (ps *PartitionState) Partition() int32 { return ps.p }

// Get reads a key.
func (ps *PartitionState) Get(k []byte) ([]byte, bool, error) { return ps.s.Get(ps.p, k) }

// Scan iterates keys in [lower, upper); fn must not keep k or v.
func (ps *PartitionState) Scan(lower, upper []byte, fn func(k, v []byte) error) error {
	return ps.s.Scan(ps.p, lower, upper, fn)
}
