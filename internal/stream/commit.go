package stream

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/meterline/meterline/internal/fault"
	"github.com/meterline/meterline/internal/session"
)

// The reasons the stream runtime rebuilds a session for, besides those of
// every stage (session.RestartCommitUnknown, session.RestartFenced,
// session.RestartInitProducerID): the reason label of
// meterline_stream_session_restarts_total.
const (
	// restartProducerState: a record failed because of the producer's
	// transactional state (producerStateError), not fenced.
	restartProducerState session.RestartReason = "producer_state"
	// restartUnwritten: the transaction's records could not be written
	// within the transaction timeout (errUnwritten).
	restartUnwritten session.RestartReason = "records_unwritten"
	// restartOutOfOrderSequence: the broker refused a record with
	// OUT_OF_ORDER_SEQUENCE_NUMBER (seqreset.go, sequenceRestart).
	restartOutOfOrderSequence session.RestartReason = "out_of_order_sequence"
	// restartMetadataMissing: a partition the transaction wrote to was
	// not in the client's stored metadata when it ended (seqreset.go,
	// awaitProducedMetadata).
	restartMetadataMissing session.RestartReason = "metadata_missing"
	// restartOversizedBatch: the transaction skipped a batch past the
	// decompression bound (oversized.go, skipBatch).
	restartOversizedBatch session.RestartReason = "oversized_batch"
)

// restartReasons are the stream runtime's own restart reasons
// (session.Names.RestartReasons).
var restartReasons = []session.RestartReason{restartProducerState, restartUnwritten, restartOutOfOrderSequence, restartMetadataMissing, restartOversizedBatch}

// producerStateError reports whether a record failed because of the
// transactional producer's own state (fenced, epoch bumped, state expired)
// or a timeout, rather than because the broker refuses the record.
func producerStateError(err error) bool {
	return errors.Is(err, kerr.InvalidProducerEpoch) || errors.Is(err, kerr.ProducerFenced) ||
		errors.Is(err, kerr.InvalidProducerIDMapping) || errors.Is(err, kerr.UnknownProducerID) ||
		errors.Is(err, kerr.InvalidTxnState) || errors.Is(err, kerr.TransactionAbortable) ||
		errors.Is(err, kerr.ConcurrentTransactions) || errors.Is(err, kgo.ErrRecordTimeout) ||
		errors.Is(err, kgo.ErrAborting) || errors.Is(err, context.DeadlineExceeded)
}

// errUnwritten marks the record error of a transaction whose records the
// client could not write within the transaction timeout (the partitions'
// leaders unreachable: a broker outage). The transaction aborts, and kgo
// then fails the records it never sent with the error of its last attempt
// (a refused dial, LEADER_NOT_AVAILABLE): the broker refused nothing, so
// the session is rebuilt rather than the stage stopped (docs/design.md,
// Exactly-once, 5).
var errUnwritten = errors.New("records not written within the transaction timeout")

// overlayFor returns partition p's overlay in the open transaction,
// creating it for the partition's current epoch.
func (rt *Runtime) overlayFor(p int32, epoch uint64) *overlay {
	ov, ok := rt.ovs[p]
	if !ok {
		ov = newOverlaySized(rt.ovHint[p])
		rt.ovs[p] = ov
		rt.txEpoch[p] = epoch
	}
	return ov
}

// begin begins a transaction.
func (rt *Runtime) begin() error {
	if err := rt.sess.Begin(); err != nil {
		return fmt.Errorf("stream: begin transaction: %w", err)
	}
	rt.inTxn = true
	rt.txStart = rt.cfg.Clock.Now()
	return nil
}

// discardTxn tells the partitions of a transaction that is not committing
// to forget it, then resets the transaction state.
func (rt *Runtime) discardTxn() {
	for p := range rt.ovs {
		if a, ok := rt.active[p]; ok {
			if ab, ok := a.part.(Aborter); ok {
				ab.Abort()
			}
		}
	}
	rt.resetTxn()
}

// resetTxn forgets the transaction: no overlays, no records, no produce
// error.
func (rt *Runtime) resetTxn() {
	rt.inTxn = false
	rt.txRecs = 0
	rt.txWorked = noWorker
	rt.mustAbort = false
	if rt.ovHint == nil {
		rt.ovHint = map[int32]int{}
	}
	for p, ov := range rt.ovs {
		rt.ovHint[p] = ov.sizeHint()
	}
	rt.ovs = map[int32]*overlay{}
	rt.txEpoch = map[int32]uint64{}
	rt.prodMu.Lock()
	rt.prodErr = nil
	rt.pidFailed = nil
	rt.changeEnd = map[int32]int64{}
	clear(rt.txProduced)
	rt.prodMu.Unlock()
}

// emit produces an output record into the open transaction.
func (rt *Runtime) emit(r *kgo.Record) {
	if rt.sink != nil {
		rt.sink(r) // a Local's
		return
	}
	rt.txnEnd.produce(rt, r) // held back until the coordinator finished the previous transaction
}

// produceError is a record of the transaction that the brokers did not
// take: the first such of a transaction (Runtime.prodErr).
type produceError struct {
	topic     string
	partition int32
	err       error
}

func (e *produceError) Error() string {
	return fmt.Sprintf("produce to %s/%d: %v", e.topic, e.partition, e.err)
}

func (e *produceError) Unwrap() error { return e.err }

// writeACLHint names the ACL the stage's principal lacks when perr is a
// record refused for want of Write on its topic (TOPIC_AUTHORIZATION_FAILED:
// an output, the changelog, or the input a stage appends its ticks to), as
// the refusals of a read, a group or a transactional ID are named; else "".
func (rt *Runtime) writeACLHint(perr error) string {
	var pe *produceError
	if !errors.Is(perr, kerr.TopicAuthorizationFailed) || !errors.As(perr, &pe) {
		return ""
	}
	return fmt.Sprintf(" (%s needs Write on topic %s: docs/operations.md, Security and ACLs)", rt.cfg.Kafka.Principal(), pe.topic)
}

// promise records a produce result: the first error of the transaction,
// and each partition's last changelog offset (the checkpoint apply writes).
func (rt *Runtime) promise(r *kgo.Record, err error) {
	rt.prodMu.Lock()
	defer rt.prodMu.Unlock()
	if err != nil {
		if rt.prodErr == nil {
			rt.prodErr = &produceError{topic: r.Topic, partition: r.Partition, err: err}
		}
		if producerIDFailed(err) {
			rt.notePIDFailed()
		}
		return
	}
	rt.noteProduced(topicPartition{r.Topic, r.Partition})
	if r.Topic == rt.cfg.ChangelogTopic {
		if cur, ok := rt.changeEnd[r.Partition]; !ok || r.Offset > cur {
			rt.changeEnd[r.Partition] = r.Offset
		}
	}
}

// abortOpen ends an open transaction with an abort, best effort, before a
// fatal return.
func (rt *Runtime) abortOpen() {
	if !rt.inTxn {
		return
	}
	rt.txnEnd.stop()
	ctx, cancel := context.WithTimeout(context.Background(), rt.cfg.TransactionTimeout)
	defer cancel()
	_, _ = rt.sess.End(ctx, kgo.TryAbort)
	rt.discardTxn()
}

// commit writes the changelog, ends the transaction and, if it committed,
// applies the overlay to Pebble.
func (rt *Runtime) commit(ctx context.Context) error {
	start := time.Now()
	// Guarantee: every record emitted in the transaction was handed to the
	// client (held-back ones after the coordinator finished the previous
	// transaction, settle.go).
	rt.txnEnd.wait()
	rt.m.settleWait.Observe(time.Since(start).Seconds())
	// Every changelog record of this transaction, and so everything past
	// the checkpoints apply writes, is appended after this instant: it
	// dates those checkpoints (Checkpoint.At; docs/design.md, Exactly-once,
	// 4).
	at := rt.cfg.Clock.Now()
	abort := rt.mustAbort
	if !abort {
		if err := rt.flushPartitions(); err != nil {
			rt.abortOpen()
			return err
		}
		rt.fenceFirst()
	}
	rt.produceChangelog()
	// Guarantee: nothing of this transaction is visible to read_committed
	// readers yet; a crash here aborts it (the next session with this
	// transactional ID, or the transaction timeout, aborts it) and the input
	// is re-consumed from the committed offset.
	rt.hit(fault.BeforeCommit)
	committed, perr, err := rt.end(ctx, abort)
	if err == nil && !committed {
		// kgo rewound what it knows of; a skipped batch's partition it
		// may not know of (oversized.go).
		if rerr := rt.rewindSkipped(); rerr != nil {
			rt.discardTxn()
			return rerr
		}
	}
	rt.m.session.CommitSeconds.Observe(time.Since(start).Seconds())
	rebuild := rt.takeRebuild()
	if err != nil || !committed || perr != nil {
		if err := rt.notCommitted(committed, perr, err, abort); err != nil || rebuild == "" {
			return err
		}
		return session.Restart(rebuild, nil)
	}
	rt.m.session.Transactions.WithLabelValues(session.Committed).Inc()
	rt.writesCommitted()
	rt.seqRestarts = 0
	rt.committed()
	// Guarantee: outputs, changelog and offsets are committed; Pebble is
	// behind the changelog. A crash here is repaired by replaying the
	// changelog tail from the checkpoint on restore.
	rt.hit(fault.AfterCommit)
	if err := rt.apply(at); err != nil {
		return err
	}
	// Guarantee: Pebble matches the changelog for every applied partition.
	rt.hit(fault.AfterApply)
	rt.resetTxn()
	rt.reportStateBytes()
	if rebuild != "" {
		// Guarantee: the transaction is committed and applied; the next
		// one runs on a new client, whose sequence numbers start at 0 and
		// whose partitions are all fetched anew (oversized.go).
		return session.Restart(rebuild, nil)
	}
	return nil
}

// takeRebuild returns why the session is rebuilt after the transaction
// that is ending, "" if it is not, and clears it: oversized_batch if the
// transaction skipped a batch (oversized.go), else metadata_missing if a
// partition it wrote to may keep its sequence numbers (seqreset.go).
func (rt *Runtime) takeRebuild() session.RestartReason {
	var r session.RestartReason
	switch {
	case rt.skipRebuild:
		r = restartOversizedBatch
	case rt.seqRebuild:
		r = restartMetadataMissing
	}
	rt.seqRebuild, rt.skipRebuild = false, false
	return r
}

// committed counts the committed transaction's records in (and time
// records in) and out, and
// calls Committed on its partitions that are Committers and still
// current.
func (rt *Runtime) committed() {
	for p, ov := range rt.ovs {
		for _, c := range ov.in {
			rt.m.session.RecordsIn.WithLabelValues(c.topic).Add(float64(c.n))
		}
		for _, c := range ov.time {
			rt.m.timeIn.WithLabelValues(c.topic).Add(float64(c.n))
		}
		for _, c := range ov.out {
			rt.m.out(c.topic).Add(float64(c.n))
		}
		if a, ok := rt.active[p]; ok && a.epoch == rt.txEpoch[p] {
			if ov.startFenced {
				a.startCommitted = true // the group has the start offsets now
			}
			if c, ok := a.part.(Committer); ok {
				c.Committed()
			}
		}
	}
}

// flushPartitions calls Flush on the transaction's partitions that are
// Flushers and still current, in parallel, as they process
// (handleFetches).
func (rt *Runtime) flushPartitions() error {
	var flushers []Flusher
	var fps []int32
	for _, p := range sortedPartitions(rt.ovs) {
		a, ok := rt.active[p]
		if !ok || a.epoch != rt.txEpoch[p] {
			continue
		}
		if f, isFlusher := a.part.(Flusher); isFlusher {
			flushers = append(flushers, f)
			fps = append(fps, p)
		}
	}
	return parallel(len(flushers), func(i int) error {
		if err := flushers[i].Flush(&Tx{rt: rt, p: fps[i], ov: rt.ovs[fps[i]]}); err != nil {
			return fmt.Errorf("stream: flush partition %d: %w", fps[i], err)
		}
		return nil
	})
}

// produceChangelog produces the changelog records of every partition the
// transaction touched, into the transaction.
func (rt *Runtime) produceChangelog() {
	ps := sortedPartitions(rt.ovs)
	_ = parallel(len(ps), func(i int) error {
		ov := rt.ovs[ps[i]]
		if !ov.touched {
			return nil
		}
		for _, r := range ov.changelogRecords(rt.cfg.ChangelogTopic, ps[i]) {
			rt.sess.Produce(context.Background(), r, rt.promise)
		}
		return nil
	})
}

// end ends the transaction: it commits unless abort is set or a record of
// the transaction failed. It returns whether the transaction committed,
// the first record error of the transaction, and End's error (outcome
// unknown).
func (rt *Runtime) end(ctx context.Context, abort bool) (committed bool, perr, err error) {
	try := kgo.TryCommit
	if abort {
		try = kgo.TryAbort
	}
	// Every record of the transaction must have been written before it may
	// commit: kgo can end a transaction with TryCommit even after a record
	// failed (seen with INVALID_RECORD on a real broker), which would commit
	// the consumed offsets past a lost output. Flush, check, and abort.
	// A record whose error failed the producer ID ends the wait at once:
	// the transaction can only abort, and kgo may keep a record buffered
	// that no Flush or End returns for (pidfail.go).
	pidFailed, ferr := rt.flush(ctx)
	rt.prodMu.Lock()
	failed := rt.prodErr
	rt.prodMu.Unlock()
	if pidFailed {
		rt.log.Warn("a record failed the transaction's producer ID; not ending the transaction (the next session's InitProducerID aborts it)", zap.Error(failed))
		return false, failed, nil
	}
	if ferr != nil || failed != nil {
		try = kgo.TryAbort
	}
	unwritten := ferr != nil && failed == nil
	// Every partition the transaction wrote to is in the client's stored
	// metadata now, so that the end of the transaction resets its
	// sequence numbers (seqreset.go); if one is not, the session is
	// rebuilt after it.
	if !rt.awaitProducedMetadata() {
		rt.seqRebuild = true
	}
	// Every changelog record of the transaction is written now: a restore
	// that begins from here on lists an end past them and replays them if
	// the transaction commits. One that began earlier, for a partition the
	// transaction wrote to, may have listed its end before them: the
	// transaction must not commit (see staleEpochs).
	if try == kgo.TryCommit {
		if stale := rt.staleEpochs(); len(stale) > 0 {
			rt.log.Info("aborting the transaction: partitions it wrote to were revoked or assigned anew since", zap.Int32s("partitions", stale))
			try = kgo.TryAbort
		}
	}
	// End flushes, so every promise has run when it returns. It is never
	// cancelled half-way (kgo: that leaves the client in an invalid state);
	// the deadline bounds it.
	ectx, cancel := rt.cfg.EndContext(ctx)
	defer cancel()
	committed, err = rt.sess.End(rt.fence(ectx), try)
	if err == nil {
		rt.txnEnd.start(context.WithoutCancel(ctx), rt, rt.adm)
	}
	rt.prodMu.Lock()
	perr = rt.prodErr
	rt.prodMu.Unlock()
	if perr != nil && unwritten {
		perr = fmt.Errorf("%w: %w", errUnwritten, perr)
	}
	return committed, perr, err
}

// staleEpochs returns the partitions the open transaction wrote to that
// have been revoked or assigned anew (a new epoch, its restore begun) since
// it first did. Their writes must not commit: apply would skip them, and a
// new restore that listed the changelog's end before they were written
// would never replay them, so the partition's new instance would start from
// a state without them (and, for work kept as a cursor in state, do that
// work again).
func (rt *Runtime) staleEpochs() []int32 {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	var out []int32
	for _, p := range sortedPartitions(rt.ovs) {
		if st, ok := rt.parts[p]; !ok || st.epoch != rt.txEpoch[p] {
			out = append(out, p)
		}
	}
	return out
}

// endRefused reports whether ending a transaction failed because the
// broker refused the principal (TxnOffsetCommit or EndTxn answered with an
// authorization failure): the transaction did not commit, and no retry
// grants an ACL.
func endRefused(err error) bool {
	return errors.Is(err, kerr.TransactionalIDAuthorizationFailed) || errors.Is(err, kerr.GroupAuthorizationFailed) ||
		errors.Is(err, kerr.TopicAuthorizationFailed) || errors.Is(err, kerr.ClusterAuthorizationFailed)
}

// endRefusal names the ACL the principal lacks for a refused end.
func (rt *Runtime) endRefusal(err error) error {
	if errors.Is(err, kerr.GroupAuthorizationFailed) {
		return fmt.Errorf("consumer group %s: %w (%s needs Read on group %s: docs/operations.md, Security and ACLs)", rt.cfg.Group, err, rt.cfg.Kafka.Principal(), rt.cfg.Group)
	}
	return rt.cfg.TransactionalIDError(err)
}

// notCommitted handles a transaction that did not commit cleanly (End
// failed, it aborted, or it committed although a record failed): it
// counts the outcome, discards the transaction and returns what the run
// loop does next: nil (re-consume from the committed offsets),
// session.ErrRestart (rebuild the session; docs/design.md, Exactly-once, 5)
// or an error that stops the stage.
func (rt *Runtime) notCommitted(committed bool, perr, err error, abort bool) error {
	switch {
	case err != nil && endRefused(err):
		// The broker refused the end itself (a missing ACL): it did not
		// commit, and no rebuilt session is granted the ACL. The
		// transaction stays open until the transaction timeout aborts it,
		// or the next start's InitProducerID does.
		rt.m.session.Transactions.WithLabelValues(session.Aborted).Inc()
		rt.discardTxn()
		rt.log.Error("ending the transaction was refused; stopping (nothing committed)", zap.Error(err))
		return fmt.Errorf("stream: ending the transaction was refused (nothing committed): %w", rt.endRefusal(err))
	case err != nil:
		rt.m.session.Transactions.WithLabelValues(session.Unknown).Inc()
		rt.log.Error("ending the transaction failed; outcome unknown", zap.Error(err))
		// The coordinator cannot finish a transaction whose markers
		// the partitions' leaders refuse (NOT_ENOUGH_REPLICAS): it
		// answers CONCURRENT_TRANSACTIONS until they take them.
		rt.writeRefusalCause(context.Background(), rt.adm)
		rt.discardTxn()
		return session.EndFailed(err)
	case committed:
		// A record failed after the flush in end, which only a concurrent
		// producer error can do: the transaction is committed without it.
		rt.resetTxn()
		return fmt.Errorf("stream: transaction committed with a failed record: %w", perr)
	}
	rt.m.session.Transactions.WithLabelValues(session.Aborted).Inc()
	rt.discardTxn()
	if perr != nil {
		if errors.Is(perr, errUnwritten) {
			// The records waited unwritten for the whole transaction
			// timeout (a broker unreachable, no leader, in-sync replicas
			// below min.insync.replicas): rebuild the session, which
			// waits for the brokers. The error kgo then fails them with
			// (aborting, or INVALID_PRODUCER_EPOCH once the coordinator
			// timed the transaction out) follows from that: no fence by
			// another process, nor the producer's own state.
			rt.log.Warn("transaction aborted: its records could not be written within the transaction timeout; rebuilding the session", zap.Error(perr))
			rt.writeRefusalCause(context.Background(), rt.adm)
			return session.Restart(restartUnwritten, perr)
		}
		if producerStateError(perr) {
			// Fenced (a zombie whose group moved on) or the producer's
			// transactional state is gone: rebuild the session with the
			// same transactional ID, rejoin and restore (docs/design.md,
			// Exactly-once, 5).
			rt.log.Warn("transaction aborted: the producer was fenced or lost its state; rebuilding the session", zap.Error(perr))
			if session.Fenced(perr) {
				rt.m.fenced.Inc() // a zombie's commit, refused
				return session.Restart(session.RestartFenced, perr)
			}
			return session.Restart(restartProducerState, perr)
		}
		if rt.sequenceRestart(perr) {
			// A partition's sequence numbers were not reset when the
			// previous transaction ended (seqreset.go): rebuild the
			// session, whose new client starts them at 0.
			rt.log.Warn("transaction aborted: the broker refused a record's sequence number; rebuilding the session", zap.Error(perr))
			return session.Restart(restartOutOfOrderSequence, perr)
		}
		if rerr := rt.cfg.Kafka.Refused(perr); rerr != nil {
			// The producer's new connection was refused its login (the
			// password changed on the cluster): stop as every other
			// client of the stage does (refusedLogin, session.FetchError).
			rt.log.Error("transaction aborted: the brokers refuse the stage's login; stopping", zap.Error(perr))
			return fmt.Errorf("stream: %w; the password is read at start only: restart the stage with the current one", rerr)
		}
		// kgo retries what can be retried; a record the broker still
		// refused (INVALID_RECORD, a topic that is gone) would fail
		// again. Stop without loss: nothing of the transaction is
		// committed and the input is re-consumed after a restart.
		rt.log.Error("transaction aborted: a record could not be written; stopping", zap.Error(perr))
		return fmt.Errorf("stream: a record of the transaction could not be written (nothing committed): %w%s", perr, rt.writeACLHint(perr))
	}
	if !abort {
		rt.log.Info("transaction aborted: the group rebalanced or the commit was fenced; re-consuming from the committed offsets")
		rt.m.fenced.Inc()
	}
	return nil
}

// stateBytesEvery is how often a committing runtime refreshes
// meterline_stream_state_bytes (a metric only: wall time decides nothing
// here).
const stateBytesEvery = 10 * time.Second

// reportStateBytes sets the state's size on disk, at most every
// stateBytesEvery.
func (rt *Runtime) reportStateBytes() {
	if now := time.Now(); now.Sub(rt.stateBytesAt) >= stateBytesEvery {
		rt.stateBytesAt = now
		rt.m.stateBytes.Set(float64(rt.store.DB().Metrics().DiskSpaceUsage()))
	}
}

// apply writes the committed overlay and the checkpoints to Pebble in one
// atomic batch. A partition whose restore began since the transaction
// started (a new epoch) is skipped: that restore began after the
// transaction's changelog records were written (end aborts a transaction
// whose partition changed epoch before, staleEpochs), so it replays them,
// and writing here could overwrite newer replayed values. at dates
// the checkpoints (Checkpoint.At): taken before the transaction's changelog
// records were produced.
func (rt *Runtime) apply(at time.Time) error {
	rt.prodMu.Lock()
	ends := rt.changeEnd
	rt.prodMu.Unlock()
	rt.mu.Lock()
	defer rt.mu.Unlock()
	b := rt.store.newBatch()
	ps := sortedPartitions(rt.ovs)
	for i, p := range ps {
		ov := rt.ovs[p]
		st, ok := rt.parts[p]
		end, produced := ends[p]
		if !ok || st.epoch != rt.txEpoch[p] {
			continue
		}
		for _, rd := range ov.rangeDels {
			b.deleteRange(p, rd.lo, rd.hi)
		}
		for i, k := range ov.order {
			e := ov.vals[i]
			if e.gone {
				continue
			}
			if e.del {
				del(b, p, k)
			} else {
				set(b, p, k, e.val)
			}
		}
		for _, k := range ov.inputKeys() {
			set(b, p, k, encodeOffset(ov.inputNext[k]))
		}
		if produced {
			b.checkpoint(p, Checkpoint{Offset: end + 1, At: at})
			st.marker = end + 1
		}
		if i == len(ps)/2 {
			// Guarantee: the batch is not committed; a crash here leaves
			// Pebble at the previous checkpoint.
			rt.hit(fault.DuringApply)
		}
	}
	if err := b.commit(); err != nil {
		return fmt.Errorf("stream: apply committed state to Pebble: %w", err)
	}
	return nil
}
