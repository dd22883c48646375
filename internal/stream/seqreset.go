package stream

import (
	"errors"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"
)

// Under transactions v2 (KIP-890) every EndTxn bumps the producer epoch,
// and the broker then expects sequence 0 from each partition's first batch
// of the next transaction. kgo (v1.22.3) resets its sequence numbers when
// EndTxn returns (resetAllProducerSequences in producer.go, called from
// EndTransaction in txn.go), but only those of the partitions in the
// producer's stored metadata, the map it iterates. A topic the client
// produces to for the first time is stored late: the metadata update that
// learns its partitions first partitions the records held while the topic
// was unknown, which hands them to the brokers' sinks, and stores the
// partitions after that (storePartitionsUpdate in topics_and_partitions.go,
// a deferred store). If the metadata goroutine stalls in between (a loaded
// machine) while the records are written, Flush returns and EndTxn is
// answered, the partition misses the reset: the next transaction's first
// batch to it carries the old sequence under the new epoch, the broker
// refuses it with OUT_OF_ORDER_SEQUENCE_NUMBER, and the transaction can
// only abort.
//
// The guard: before a transaction ends, every partition it wrote to must be
// in the client's stored metadata. Client.PartitionLeader reads that map
// (the producer's topics, then the topic's stored partitions) and answers
// leader -1 for a partition it does not hold. The runtime waits, briefly,
// for a partition it has not yet seen there; one still missing after
// producedMetadataWait gets the session rebuilt after the transaction (the
// new client starts every sequence at 0). An OUT_OF_ORDER_SEQUENCE_NUMBER
// that happens anyway (notCommitted) rebuilds the session too, at most
// maxSequenceRestarts times without a commit in between.

// producedMetadataWait bounds the wait for the partitions a transaction
// wrote to to be in the client's stored metadata. The store follows the
// first records by a few instructions of one goroutine: it takes a
// scheduling delay, not a request.
const producedMetadataWait = 5 * time.Second

// maxSequenceRestarts is how many sessions in a row may end with
// OUT_OF_ORDER_SEQUENCE_NUMBER before the stage stops with it: each new
// session starts every sequence at 0, so the error coming back session
// after session is a fault that rebuilding does not repair.
const maxSequenceRestarts = 3

// topicPartition names a partition the transactional client produces to.
type topicPartition struct {
	topic string
	p     int32
}

// noteProduced records, with prodMu held, that a record of the open
// transaction was written to tp.
func (rt *Runtime) noteProduced(tp topicPartition) {
	if _, ok := rt.seqKnown[tp]; ok {
		return
	}
	if rt.txProduced == nil {
		rt.txProduced = map[topicPartition]struct{}{}
	}
	rt.txProduced[tp] = struct{}{}
}

// partitionStored reports whether the session's client holds tp in its
// stored metadata, the partitions whose sequence numbers it resets when a
// transaction ends.
func (rt *Runtime) partitionStored(tp topicPartition) bool {
	if rt.storedFn != nil {
		return rt.storedFn(tp)
	}
	return clientHolds(rt.sess.Client(), tp)
}

// clientHolds reports whether cl holds tp in its stored metadata with a
// leader. PartitionLeader looks tp's topic up in the producer's topics
// first (a topic cl produced to is there from its first record on, with no
// partitions until its metadata is stored) and answers -1 for a partition
// that topic does not hold; a partition stored without a leader counts as
// missing too, until a metadata update gives it one.
func clientHolds(cl *kgo.Client, tp topicPartition) bool {
	leader, _, _ := cl.PartitionLeader(tp.topic, tp.p)
	return leader >= 0
}

// awaitProducedMetadata waits until every partition the open transaction
// wrote to is in the client's stored metadata, for up to
// producedMetadataWait (a stage that is stopping waits too: it commits
// the open transaction). It returns false if one is still missing: its
// sequence numbers may then survive the end of the transaction. A
// partition found is not checked again in the session.
func (rt *Runtime) awaitProducedMetadata() bool {
	rt.prodMu.Lock()
	pending := make([]topicPartition, 0, len(rt.txProduced))
	for tp := range rt.txProduced {
		pending = append(pending, tp)
	}
	rt.prodMu.Unlock()
	if len(pending) == 0 {
		return true
	}
	wait := rt.metadataWait
	if wait == 0 {
		wait = producedMetadataWait
	}
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	backoff := 50 * time.Microsecond
	for {
		missing := pending[:0]
		for _, tp := range pending {
			if !rt.partitionStored(tp) {
				missing = append(missing, tp)
				continue
			}
			rt.prodMu.Lock()
			rt.seqKnown[tp] = struct{}{}
			rt.prodMu.Unlock()
		}
		pending = missing
		if len(pending) == 0 {
			return true
		}
		select {
		case <-deadline.C:
			rt.log.Warn("partitions the transaction wrote to are not in the Kafka client's metadata yet; rebuilding the session after the transaction, so that their sequence numbers start again at 0",
				zap.Int("partitions", len(pending)), zap.String("topic", pending[0].topic), zap.Int32("partition", pending[0].p))
			return false
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 10*time.Millisecond)
	}
}

// sequenceRestart reports whether a transaction that aborted because of
// perr rebuilds the session: perr is OUT_OF_ORDER_SEQUENCE_NUMBER and
// fewer than maxSequenceRestarts sessions in a row ended with it.
func (rt *Runtime) sequenceRestart(perr error) bool {
	if !errors.Is(perr, kerr.OutOfOrderSequenceNumber) || rt.seqRestarts >= maxSequenceRestarts {
		return false
	}
	rt.seqRestarts++
	return true
}
