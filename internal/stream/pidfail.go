package stream

import (
	"context"
	"errors"

	"github.com/twmb/franz-go/pkg/kerr"
)

// A transactional kgo client (v1.22.3) fails its producer ID when the
// broker refuses a batch with OUT_OF_ORDER_SEQUENCE_NUMBER,
// UNKNOWN_PRODUCER_ID, INVALID_PRODUCER_ID_MAPPING or INVALID_PRODUCER_EPOCH
// (handleReqRespBatch in sink.go): the next drain of any broker's sink finds
// the failed ID and fails every buffered record ("fatal InitProducerID
// error", failBufferedRecords in producer.go). That pass fails only the
// partitions the client has stored: a topic the client produces to for the
// first time (the changelog, in a new session's first transaction) has its
// held records handed to the sinks before its partitions are stored
// (storePartitionsUpdate, a deferred store), and a drain in between misses
// them. Nothing drains them afterwards (no linger, no retry): Flush waits
// for them until its deadline, and so does End's AbortBufferedRecords, which
// fails records only when a sink drains.
//
// The transaction cannot commit once a record failed, and it commits
// nothing unless End sends TxnOffsetCommit and EndTxn, which the runtime
// then does not: it neither waits for the client's buffer nor ends the
// transaction, counts it aborted and rebuilds the session (or stops, as
// notCommitted decides for the record's error). The new session's
// InitProducerID with the same transactional ID aborts the open
// transaction, and the old client's Close fails the records it held.

// producerIDFailed reports whether kgo fails a transactional producer's ID
// for a record that failed with err.
func producerIDFailed(err error) bool {
	return errors.Is(err, kerr.OutOfOrderSequenceNumber) || errors.Is(err, kerr.UnknownProducerID) ||
		errors.Is(err, kerr.InvalidProducerIDMapping) || errors.Is(err, kerr.InvalidProducerEpoch)
}

// notePIDFailed records, with prodMu held, that a record of the open
// transaction failed its producer ID.
func (rt *Runtime) notePIDFailed() {
	if rt.pidFailed == nil {
		rt.pidFailed = make(chan struct{})
	}
	select {
	case <-rt.pidFailed:
	default:
		close(rt.pidFailed)
	}
}

// pidFailedCh returns the channel closed once a record of the open
// transaction failed its producer ID.
func (rt *Runtime) pidFailedCh() <-chan struct{} {
	rt.prodMu.Lock()
	defer rt.prodMu.Unlock()
	if rt.pidFailed == nil {
		rt.pidFailed = make(chan struct{})
	}
	return rt.pidFailed
}

// flush waits, for up to the transaction timeout, until the client wrote
// or failed every buffered record, or a record failed the producer ID. It
// returns whether a record failed the producer ID, and Flush's error.
func (rt *Runtime) flush(ctx context.Context) (pidFailed bool, err error) {
	failed := rt.pidFailedCh()
	fctx, fcancel := context.WithTimeout(context.WithoutCancel(ctx), rt.cfg.TransactionTimeout)
	defer fcancel()
	defer rt.diagnoseStall(rt.adm)()
	done := make(chan error, 1)
	go func() { done <- rt.sess.Client().Flush(fctx) }()
	select {
	case err := <-done:
		select {
		case <-failed:
			return true, err
		default:
			return false, err
		}
	case <-failed:
		fcancel()
		<-done
		return true, nil
	}
}
