package stream

import "github.com/twmb/franz-go/pkg/kgo"

// The interfaces a stage implements: a Processor opens a Partition for each
// input partition the instance owns, once its state is restored; the
// runtime calls the Partition with the records and the transaction that
// carries them. A Partition may also be a Flusher, an Aborter, a Committer
// or a Worker.

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
	// Punctuate runs every punctuate interval for a ready partition. A
	// transaction in which it wrote state or emitted commits the
	// partition's offsets too, unchanged when it consumed none of its
	// input (the offset its reading starts from, for a topic the group has
	// none of yet), so that the group generation fences a zombie's
	// punctuation as it fences its input (docs/design.md, Time).
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

// Committer is implemented by a Partition that counts what a transaction
// did only once it is committed (docs/operations.md, Health, metrics and
// logs: a record re-processed after an abort is counted once): Committed
// runs after a transaction it took part in committed, before the next one
// begins. A transaction that aborts, or whose outcome is unknown, calls
// Abort instead (what it did is then not counted, even if it did commit).
type Committer interface {
	Committed()
}

// BatchRejecter is implemented by a Partition that rejects, as bad input,
// a batch of its input that it is never given: one that decompresses past
// Config.MaxDecompressBatchBytes, or a malformed one (RejectedBatch.Malformed,
// docs/design.md, Bad input). RejectBatch
// records the rejection in tx (nothing of the batch is decoded); the
// runtime then moves the partition's input past the batch in the same
// transaction, as if Process had been given its records, so the rejection
// and the skip commit together or not at all. An error stops the stage. A
// Partition that is not a BatchRejecter stops the stage at such a batch.
type BatchRejecter interface {
	RejectBatch(tx *Tx, b RejectedBatch) error
}

// RejectedBatch is an input batch the runtime could not decode.
type RejectedBatch struct {
	Topic     string
	Partition int32
	// From is the batch's first offset and Next the offset after its last
	// record.
	From, Next int64
	// Limit is the bound it decompresses past
	// (Config.MaxDecompressBatchBytes).
	Limit int
	// Malformed, when not empty, says instead what is wrong with the
	// batch's records (gaps.go): the batch is not past the bound, but
	// the Kafka client reads it wrongly, and From is the first offset of
	// it not processed.
	Malformed string
	// Err is the client's error; nil for a malformed batch.
	Err error
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
	s    *Store
	p    int32
	warm WarmState // a promoted standby's (standby.go); nil: none
}

// Partition returns the partition number.
func (ps *PartitionState) Partition() int32 { return ps.p }

// Get reads a key.
func (ps *PartitionState) Get(k []byte) ([]byte, bool, error) { return ps.s.Get(ps.p, k) }

// Scan iterates keys in [lower, upper); fn must not keep k or v.
func (ps *PartitionState) Scan(lower, upper []byte, fn func(k, v []byte) error) error {
	return ps.s.Scan(ps.p, lower, upper, fn)
}

// Worker is implemented by a Partition that has work of its own, work that
// scales with its state rather than with its input (docs/design.md,
// Exactly-once, 7: the FINAL revisions of a period, emitted in chunks). It
// proceeds without waiting for input:
//
//   - while any partition reports work, the run loop polls without waiting;
//   - after the input of each poll is handled, one partition with work (in
//     turn) gets one call of Work in the open transaction, and that
//     transaction commits at once. A transaction carries at most one
//     partition's chunk, plus the input polled with it.
//
// A transaction that carries a chunk commits its partition's offset too,
// unchanged when it consumed no input of that partition (the offset its
// reading starts from, for a topic the group has none of yet), so that
// the group generation fences a zombie's chunk as it fences its input
// (docs/design.md, Time: every transaction consumes offsets). A partition
// whose input the group had no committed offset of gets its first Work once
// a transaction of it committed one (Runtime.nextWorker).
type Worker interface {
	// HasWork reports whether Work has something to do. The run loop
	// calls it after every poll: it must be cheap.
	HasWork() bool
	// Work does one bounded chunk of that work in tx.
	Work(tx *Tx) error
}
