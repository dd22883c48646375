package sink

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/meterline/meterline/internal/fault"
	"github.com/meterline/meterline/internal/kafka"
	"github.com/meterline/meterline/internal/session"
	"github.com/meterline/meterline/schemas"
)

// Commit and rewind: the end of a commit window (docs/design.md, The
// ClickHouse ledger; the sink's crash windows: docs/design.md,
// Exactly-once, "Crash windows").
//
// Guarantees kept here, each stated at its step in commit: the offsets of
// a window are committed only after its rows are in their tables; a row
// ClickHouse refused is parked (produced to usage.rejected) in the same
// transaction that commits its partition's offset just past it — never at
// a higher offset, so a crash never parks a row twice and never skips the
// rows held back behind it (rewind); and an aborted or unknown outcome
// leaves the partitions dirty, so the resume rule checks them again.

// commit ends a commit window: it moves the stopped partitions' offsets
// back to just past their parked rows (rewind), produces the parked
// records in the window's transaction and ends it, committing unless
// abandon (the window cannot commit: revoked, or stopping while
// ClickHouse is unavailable). parks, stops and held are the inserter's
// report of the window (inserter.wait).
func (w *Writer) commit(ctx context.Context, win *window, parks []parked, stops map[tp]stop, held int, abandon bool) error {
	if !abandon {
		// Guarantee: every row of the window is in its table (inserted
		// now, or found there by the resume rule), or refused and about to
		// be parked, or held back behind a refused row of its partition
		// (never inserted); no offset is committed. A crash here
		// re-consumes from the committed offsets, and the resume rule
		// skips the rows already in the tables.
		fault.Hit(FaultAfterInsert)
	}
	decodeParks := win.parksBefore(stops)
	if !abandon && len(decodeParks) > 0 {
		// Guarantee: a record that did not decode, read again below the
		// recorded progress and parked already, is not parked again.
		var err error
		if decodeParks, err = w.unparkedDecodes(ctx, decodeParks); errors.Is(err, errAbandon) {
			abandon = true
		} else if err != nil {
			return err
		}
	}
	if !abandon && len(stops) > 0 && !w.rewind(win, stops) {
		// Revoked meanwhile (the transaction could not commit anyway), or
		// kgo did not take the offsets: commit nothing, re-consume.
		abandon = true
	}
	if !abandon {
		// Guarantee: the progress recorded in ClickHouse reaches the
		// offsets this transaction commits before they are committed
		// (progress.go).
		if err := w.recordProgressBackingOff(ctx, windowProgress(win, stops)); errors.Is(err, errAbandon) {
			abandon = true
		} else if err != nil {
			return err
		}
	}
	start := time.Now()
	if err := w.sess.Begin(); err != nil {
		return fmt.Errorf("sink: begin transaction: %w", w.cfg.TransactionalIDError(err))
	}
	var produced firstError
	if !abandon {
		w.produceParks(decodeParks, parks, &produced)
	}
	try := kgo.TryCommit
	if abandon {
		try = kgo.TryAbort
	}
	// End is never cancelled half-way (kgo: that leaves the client in an
	// invalid state); the deadline bounds it.
	ectx, cancel := w.cfg.EndContext(ctx)
	defer cancel()
	if !abandon && (len(decodeParks) > 0 || len(parks) > 0) {
		// Guarantee: offsets past a record are committed only with its
		// parked copy. kgo commits a transaction whose records failed
		// (its End does not look at them): wait for every parked record's
		// answer, and abort when one failed.
		_ = w.sess.Client().Flush(ectx) // an error is ectx's end; End then fails too
		if produced.get() != nil {
			try = kgo.TryAbort
		}
	}
	committed, err := w.sess.End(ectx, try)
	w.m.session.CommitSeconds.Observe(time.Since(start).Seconds())
	w.revoked.Store(false)
	switch {
	case err != nil:
		w.m.session.Transactions.WithLabelValues(session.Unknown).Inc()
		w.log.Error("ending the transaction failed; outcome unknown", zap.Error(err))
		return session.EndFailed(err)
	case !committed:
		w.m.session.Transactions.WithLabelValues(session.Aborted).Inc()
		w.markDirty(win.last)
		switch perr := produced.get(); {
		case errors.Is(perr, kerr.TopicAuthorizationFailed):
			// A missing ACL: re-consuming would fail the same way, for ever.
			return fmt.Errorf("sink: park refused records in %s: %w (%s needs Write on topic %s: docs/operations.md, Security and ACLs)",
				w.cfg.Topics.RejectedTopic(), perr, w.cfg.Kafka.Principal(), w.cfg.Topics.RejectedTopic())
		case kafka.SASLRefused(perr):
			// The producer's new connection was refused its login (the
			// password changed on the cluster): no retry makes it right.
			return fmt.Errorf("sink: park refused records in %s: %w; the password is read at start only: restart the sink with the current one",
				w.cfg.Topics.RejectedTopic(), w.cfg.Kafka.Refused(perr))
		case kafka.RecordRefused(perr):
			// The same parked record would be refused at every attempt,
			// and its window aborted with every partition's rows: stop
			// rather than re-consume for ever. Nothing is committed.
			return fmt.Errorf("sink: park refused records in %s: %w (the broker refuses the parked record for good: check the topic's max.message.bytes and the brokers' logs; nothing of the window was committed)",
				w.cfg.Topics.RejectedTopic(), perr)
		case perr != nil:
			// A transient error (the topic's leader unreachable until
			// the records timed out or the transaction aborted: kgo fails
			// records it never sent with its last attempt's error).
			w.log.Warn("transaction aborted: producing a parked row failed; re-consuming from the committed offsets", zap.Error(perr))
		case abandon && ctx.Err() != nil:
			w.log.Info("window abandoned while stopping; its records are re-consumed on restart")
			return errAbandon
		default:
			w.log.Info("transaction aborted: the group rebalanced or the commit was fenced; re-consuming from the committed offsets")
		}
		return nil
	}
	// Guarantee: the offsets of every polled record — of a stopped
	// partition, the offset just past its parked row — and the parked
	// rows are committed together.
	w.m.session.Transactions.WithLabelValues(session.Committed).Inc()
	first := w.afterCommit(win, decodeParks, parks, stops, held)
	w.recordFirstCommits(ctx, first)
	return nil
}

// firstError keeps the first error of the records produced in a
// transaction (promise is their kgo promise).
type firstError struct {
	mu  sync.Mutex
	err error
}

func (f *firstError) promise(r *kgo.Record, err error) {
	if err == nil {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err == nil {
		f.err = fmt.Errorf("produce to %s: %w", r.Topic, err)
	}
}

func (f *firstError) get() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.err
}

// produceParks produces, in the window's open transaction, the records
// that did not decode and the rows ClickHouse refused (a refused row of
// usage.rejected has no record: it went to usage_quarantine).
func (w *Writer) produceParks(decodeParks []decodePark, parks []parked, produced *firstError) {
	n := 0
	for _, d := range decodeParks {
		w.sess.Produce(context.Background(), d.rec, produced.promise)
		n++
	}
	for _, p := range parks {
		if p.rec != nil {
			w.sess.Produce(context.Background(), p.rec, produced.promise)
			n++
		}
	}
	if n > 0 {
		// Guarantee: the parked rows are produced in the open
		// transaction, not visible; a crash aborts them with the
		// offsets, and the restart refuses and parks the rows again,
		// once.
		fault.Hit(FaultAfterPark)
	}
}

// afterCommit records a committed window: the partitions' committed
// offsets (advance), the metrics and log lines of what it parked, and the
// test hook. It returns the partitions the group committed for the first
// time (advance).
func (w *Writer) afterCommit(win *window, decodeParks []decodePark, parks []parked, stops map[tp]stop, held int) (first map[tp]int64) {
	heldRecs := win.heldRecords(stops)
	w.m.committed.Add(float64(win.records - heldRecs))
	first = w.advance(win.last, stops)
	if w.hook != nil {
		ev := hookEvent{kind: hookCommit}
		for _, p := range parks {
			if p.rec != nil {
				ev.parked = append(ev.parked, parkedAt{topic: p.table.topic, partition: p.row.partition(), offset: p.row.offset()})
			}
		}
		w.hook(ev)
	}
	for _, d := range decodeParks {
		w.m.rejected.WithLabelValues(stage, reasonOf(d.rec)).Inc()
	}
	if len(decodeParks) > 0 {
		w.log.Warn("records that do not decode parked in the rejected topic", zap.Int("records", len(decodeParks)))
	}
	if len(stops) > 0 {
		w.log.Info("window ended early at refused rows: each partition's offset committed just past its parked row; the rows held back behind it are fetched again",
			zap.Int("partitions", len(stops)), zap.Int("records_held_back", heldRecs), zap.Int("rows_held_back_before_insert", held))
	}
	parkedRows := 0
	for _, p := range parks {
		if p.rec == nil {
			continue
		}
		parkedRows++
		w.m.rows.WithLabelValues(p.table.name, outcomeParked).Inc()
		w.m.rejected.WithLabelValues(stage, schemas.ReasonUninsertable).Inc()
		w.log.Warn("row refused by clickhouse: parked in the rejected topic with reason uninsertable",
			zap.String("table", p.table.name), zap.String("record", describe(p.table, p.row.rec)),
			zap.String("customer_id", p.row.id.customer), zap.String("meter", p.row.id.meter),
			zap.String("event_id", p.row.id.eventID), zap.String("error", p.err))
	}
	if parkedRows > 0 {
		// Guarantee: the refused rows are parked and their partitions'
		// offsets committed just past them; no row after them is in the
		// table (unless an earlier owner put it there). A crash here
		// re-consumes from just past each parked row: it is not parked
		// again, and the resume rule skips what is present.
		fault.Hit(FaultAfterParkCommit)
	}
	return first
}

// rewind moves each stopped partition's consumed offset back to just past
// its parked row, so that End commits that offset, not the last polled
// one, and the rows held back behind it are fetched again. It returns
// false when the window must not commit (revoked meanwhile, or kgo did
// not take the offsets).
//
// What it relies on in kgo (v1.22.3): GroupTransactSession.End commits
// Client.UncommittedOffsets, each polled partition's "dirty" offset.
// Client.SetOffsets sets a partition's dirty and head offsets
// (applySetOffsets) and re-seats its fetch cursor there, discarding
// buffered, unpolled fetches (assignSetMatching stops the fetch session;
// the other partitions' cursors stay just past their last polled records).
// A revoke or loss calls onRevoked before kgo forgets or reassigns a
// partition; onRevoked sets w.revoked and then waits for insertMu, held
// here, so no partition is revoked or reassigned between the check and
// SetOffsets. A revoke after it makes End abort, and an abort resets every
// partition to its committed offset.
func (w *Writer) rewind(win *window, stops map[tp]stop) bool {
	w.insertMu.Lock()
	defer w.insertMu.Unlock()
	if w.revoked.Load() {
		return false
	}
	cl := w.sess.Client()
	before := cl.UncommittedOffsets()
	set := map[string]map[int32]kgo.EpochOffset{}
	for k, st := range stops {
		last, ok := win.last[k]
		if got := before[k.topic][k.p]; !ok || got.Offset != last+1 {
			w.log.Error("kafka client's consumed offset is not the window's: not committing the window",
				zap.String("topic", k.topic), zap.Int32("partition", k.p), zap.Int64("client", got.Offset), zap.Int64("window", last+1))
			return false
		}
		if st.offset >= last {
			continue // the refused row was the last polled: nothing to move
		}
		if set[k.topic] == nil {
			set[k.topic] = map[int32]kgo.EpochOffset{}
		}
		set[k.topic][k.p] = kgo.EpochOffset{Epoch: st.epoch, Offset: st.offset + 1}
	}
	cl.SetOffsets(set)
	after := cl.UncommittedOffsets()
	for k, st := range stops {
		if got := after[k.topic][k.p]; got.Offset != st.offset+1 {
			w.log.Error("kafka client did not take the offset past a parked row: not committing the window",
				zap.String("topic", k.topic), zap.Int32("partition", k.p), zap.Int64("client", got.Offset), zap.Int64("want", st.offset+1))
			return false
		}
	}
	return true
}

func reasonOf(r *kgo.Record) string {
	var rej schemas.Rejected
	if err := schemas.DecodeInto(r.Value, &rej); err != nil {
		return "unknown"
	}
	return rej.Reason
}

// advance records a committed window: each partition's committed offset
// moves past its last polled record (a stopped partition's: past its
// parked row), and a partition whose present rows all lie below it is
// clean again. It returns the partitions that had no committed offset of
// the group before this window, with their new committed offset.
func (w *Writer) advance(last map[tp]int64, stops map[tp]stop) map[tp]int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	first := map[tp]int64{}
	for k, off := range last {
		ps, ok := w.parts[k]
		if !ok {
			continue
		}
		if st, ok := stops[k]; ok && st.offset < off {
			off = st.offset
		}
		ps.committed = off + 1
		if !ps.fromCommitted {
			first[k] = ps.committed
		}
		ps.fromCommitted = true
		if ps.dirty && ps.maxKnown && ps.presentMax < ps.committed {
			ps.dirty = false
			ps.maxKnown = false
		}
	}
	return first
}

// markDirty marks partitions as possibly holding rows past their committed
// offset (after a write with an unknown outcome, or an aborted window).
func (w *Writer) markDirty(parts map[tp]int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for k := range parts {
		if ps, ok := w.parts[k]; ok {
			ps.dirty = true
			ps.maxKnown = false
		}
	}
}

func (w *Writer) markRowsDirty(t *table, rows []*row) {
	parts := map[tp]int64{}
	for _, r := range rows {
		parts[tp{t.topic, r.partition()}] = r.offset()
	}
	w.markDirty(parts)
}

// recordProgressBackingOff records the window's progress, and while
// ClickHouse cannot take it backs off and retries, as an INSERT of rows
// does (writeRows): blocked, fetching paused, not ready, nothing
// committed; a refused login, or an error code the sink does not know
// for UnknownErrorLimit, stops it (unknownSpell). It returns errAbandon
// when the process is stopping or the partitions were revoked meanwhile
// (the window cannot commit).
func (w *Writer) recordProgressBackingOff(ctx context.Context, progress map[tp]int64) error {
	for attempt := 0; ; attempt++ {
		err := w.recordProgress(ctx, progress)
		if err == nil {
			if attempt > 0 {
				w.endUnknownSpell()
				w.clearBlocked()
				w.resumeFetching()
			}
			return nil
		}
		if err := w.unknownSpell(progressTable, err); err != nil {
			return err
		}
		// Logged, counted and shown as an INSERT of rows that ClickHouse
		// cannot take: an outage first met by the progress is the same
		// outage.
		w.unavailable(progressTable, err, "recording the window's progress")
		if err := w.backoffSleep(ctx, attempt); err != nil {
			return err
		}
	}
}

// progressTable names sink_progress where a failure is reported as a
// table's (unknownSpell).
var progressTable = &table{name: "sink_progress"}
