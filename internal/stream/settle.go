package stream

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"
)

// Under transactions v2 (KIP-890) EndTxn returns once the coordinator has
// decided the outcome; the commit or abort markers are written to every
// partition of the transaction after that. Until they all are, the
// coordinator refuses to add a partition to the next transaction
// (CONCURRENT_TRANSACTIONS). A produce request of the next transaction
// adds its partitions implicitly; its partition leader retries that for
// add.partitions.to.txn.retry.backoff.max.ms (100 ms by default) and then
// refuses the batch. kgo (v1.22.3) keeps up to five produce requests in
// flight per broker, so the later batches of a partition whose first batch
// (sequence 0) was refused reach the leader with sequences it has not seen
// and are refused as well ("OutOfOrderSequenceException … Expected sequence
// 0 for transactions v2 idempotent producer with no existing state"), and
// kgo resends the refused batches only after its next metadata refresh,
// which MetadataMinAge (5 s) spaces from the previous one: the transaction
// stalls for up to 5 s (sink.go handleReqResp retries
// CONCURRENT_TRANSACTIONS like a leadership error, which waits for
// metadata, rather than after the produce backoff as it does
// REQUEST_TIMED_OUT). It happens whenever the markers take longer than the
// leader's retry; a freshly started dedup met it most often in its second
// transaction.
//
// The runtime's guard, txnEndWatch: after a transaction ended, what the
// next one emits is held back until the coordinator reports the previous
// one complete, then produced in emit order. Processing goes on meanwhile,
// as it did while the partition leaders held the produce requests. The
// check costs a DescribeTransactions request per transaction (the stage's
// WRITE on its transactional ID implies the DESCRIBE it needs).

// txnSettleMaxBackoff caps the pause between two DescribeTransactions of
// the check: the partition leaders' own retry of an add waits 20 ms
// (add.partitions.to.txn.retry.backoff.ms).
const txnSettleMaxBackoff = 20 * time.Millisecond

// errNoTxnState is returned by txnState when the coordinator's answer does
// not name the transactional ID.
var errNoTxnState = errors.New("stream: describe transactions: no state for the transactional ID")

// txnEndWatch holds back the records of a transaction until the
// coordinator has finished the one before it. start, wait and stop are
// called by the run loop only; produce by anything that emits.
type txnEndWatch struct {
	holding atomic.Bool // records are held back until the check is over
	mu      sync.Mutex
	held    []*kgo.Record // guarded by mu
	discard bool          // guarded by mu: drop held records, the session is ending
	done    chan struct{} // closed when the check is over; nil: none started
	cancel  context.CancelFunc
	warned  atomic.Bool // a failed check was logged in this session
}

// produce produces r in the current transaction, or holds it back while
// the check of the previous transaction runs.
func (w *txnEndWatch) produce(rt *Runtime, r *kgo.Record) {
	if w.holding.Load() {
		w.mu.Lock()
		if w.holding.Load() {
			w.held = append(w.held, r)
			w.mu.Unlock()
			return
		}
		w.mu.Unlock()
	}
	rt.sess.Produce(context.Background(), r, rt.promise)
}

// start begins checking, right after End returned, whether the coordinator
// has finished the transaction. Records emitted meanwhile are held back
// and produced, in emit order, when the check is over. It gives up after
// the transaction timeout; the held records are then produced as they
// would have been without the check. stop ends it early. The first failure
// of a session is logged.
func (w *txnEndWatch) start(ctx context.Context, rt *Runtime, adm *kadm.Client) {
	w.wait()
	done := make(chan struct{})
	ctx, cancel := context.WithTimeout(ctx, rt.cfg.TransactionTimeout)
	w.done, w.cancel = done, cancel
	w.holding.Store(true)
	started := time.Now()
	id := rt.cfg.TransactionalID()
	go func() {
		defer close(done)
		defer w.release(rt)
		backoff := time.Millisecond
		for {
			state, err := txnState(ctx, adm, id)
			if err != nil {
				if ctx.Err() == nil && !w.warned.Swap(true) {
					rt.log.Warn("cannot tell whether the coordinator finished the last transaction; the next one produces anyway",
						zap.String("transactional_id", id), zap.Error(err))
				}
				return
			}
			if state != "PrepareCommit" && state != "PrepareAbort" && state != "PrepareEpochFence" {
				rt.m.settleSeconds.Observe(time.Since(started).Seconds())
				return
			}
			select {
			case <-ctx.Done():
				if errors.Is(ctx.Err(), context.DeadlineExceeded) && !w.warned.Swap(true) {
					rt.log.Warn("the coordinator has not finished the last transaction; the next one produces anyway",
						zap.String("transactional_id", id), zap.String("state", state), zap.Duration("waited", time.Since(started)))
				}
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, txnSettleMaxBackoff)
		}
	}()
}

// release produces the held records, in emit order, unless the session is
// ending, and stops holding.
func (w *txnEndWatch) release(rt *Runtime) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.discard {
		for _, r := range w.held {
			rt.sess.Produce(context.Background(), r, rt.promise)
		}
	}
	clear(w.held)
	w.held = w.held[:0]
	w.holding.Store(false)
}

// wait returns when the check start began is over and the held records
// are produced. The transaction's end waits for it.
func (w *txnEndWatch) wait() {
	if w.done != nil {
		<-w.done
		w.done = nil
		w.cancel()
	}
}

// stop ends a check still running, dropping the records it held (the
// transaction they belong to is being aborted or abandoned), and returns
// when it has.
func (w *txnEndWatch) stop() {
	w.mu.Lock()
	w.discard = true
	w.mu.Unlock()
	if w.done != nil {
		w.cancel()
		w.wait()
	}
	w.mu.Lock()
	w.discard = false
	w.mu.Unlock()
	w.warned.Store(false)
}

// txnState returns the coordinator's state of the transactional ID:
// Empty, Ongoing, PrepareCommit, PrepareAbort, CompleteCommit,
// CompleteAbort, PrepareEpochFence or Dead.
func txnState(ctx context.Context, adm *kadm.Client, id string) (string, error) {
	ds, err := adm.DescribeTransactions(ctx, id)
	if err != nil {
		return "", err
	}
	d, ok := ds[id]
	if !ok {
		return "", errNoTxnState
	}
	return d.State, d.Err
}
