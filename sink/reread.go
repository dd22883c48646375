package sink

import (
	"context"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/meterline/meterline/internal/topics"
	"github.com/meterline/meterline/schemas"
)

// Re-reading below the recorded progress: a partition whose committed
// offset is below the progress recorded for it (progress.go) is read
// again from there. Normally that is the tail of a window cut between its
// progress row and its commit (a crash, an aborted or fenced commit): its
// refused row, just below the progress, was parked in the aborted
// transaction only and must be parked now. After an operator moved the
// group's offset back on purpose (kafka-consumer-groups --reset-offsets
// --to-earliest, to replay), the rows refused between the offset and the
// progress were parked already, in committed transactions.
//
// Guarantee kept here: a row refused on such a re-read is parked unless a
// committed park of it exists (docs/design.md, The ClickHouse ledger: a row
// parked is never parked twice, and nothing is dropped). Whether one exists
// is looked up, once per partition and assignment, at its first refused row
// below the progress: the rows the sink parked from the partition between
// its committed offset and its progress, in usage_rejected, in
// usage_quarantine (a park ClickHouse refused as a row of usage_rejected),
// and in the records of usage.rejected not in either yet (read_committed,
// from each of its partitions' recorded progress, below which its records
// are in their tables, to its end). A park aborted with its window is in
// neither; one committed before the assignment is in one of them (only
// the partition's owner parks its rows, and a previous owner's commit is
// fenced). Rows at or past the progress, and every row of a partition
// read from its committed offset as usual, cost nothing more.

// rereadTailTimeout bounds the read of usage.rejected past its recorded
// progress (normally the few records the sink had not written yet).
const rereadTailTimeout = 5 * time.Minute

// rereadState is the part of pstate for a partition read again below its
// recorded progress.
type rereadState struct {
	// progress: rows below it were handled before (0: not a re-read).
	progress int64
	// parked: the offsets of the partition's rows parked below progress
	// (nil until looked up).
	parked map[int64]struct{}
}

// rereads returns, of the partitions whose committed offsets (-1: none)
// were just checked, those read again below their recorded progress, with
// that progress. Rows of the rejected topic are never parked: it has none.
func (w *Writer) rereads(rec recorded, committed map[tp]int64) map[tp]int64 {
	out := map[tp]int64{}
	for k, c := range committed {
		if t := w.byTopic[k.topic]; t == nil || t.rejected {
			continue
		}
		if progress, _, ok := rec.effective(k); ok && c < progress {
			out[k] = progress
		}
	}
	return out
}

// parkedBefore says whether the row at off of partition k, refused by
// ClickHouse (or the record there, which does not decode), was parked
// before: always false unless the partition is read again below its
// recorded progress and off is below it. While the lookup fails it backs
// off and retries.
func (w *Writer) parkedBefore(ctx context.Context, k tp, off int64) (bool, error) {
	w.mu.Lock()
	ps, ok := w.parts[k]
	if !ok {
		w.mu.Unlock()
		return false, errAbandon
	}
	from, rr := ps.committed, ps.reread
	w.mu.Unlock()
	if off >= rr.progress {
		return false, nil
	}
	if rr.parked == nil {
		for attempt := 0; ; attempt++ {
			found, err := w.lookupParked(ctx, k, from, rr.progress)
			if err == nil {
				rr.parked = found.parked
				break
			}
			// A code the sink does not know, or a refused login, is
			// bounded as for every other lookup (writeRows).
			if err := w.unknownSpell(w.byTopic[w.cfg.Topics.RejectedTopic()], err); err != nil {
				return false, err
			}
			w.setBlocked(fmt.Sprintf("cannot look up which rows of %s partition %d below its recorded progress %d are parked: %v; backing off, committing nothing", k.topic, k.p, rr.progress, err))
			w.log.Warn("cannot look up the rows parked below the recorded progress; retrying", zap.String("topic", k.topic),
				zap.Int32("partition", k.p), zap.Int64("progress", rr.progress), zap.Error(err))
			if err := w.backoffSleep(ctx, attempt); err != nil {
				return false, err
			}
		}
		w.clearBlocked()
		w.mu.Lock()
		if cur := w.parts[k]; cur == ps {
			cur.reread.parked = rr.parked
		}
		w.mu.Unlock()
	}
	_, parked := rr.parked[off]
	return parked, nil
}

// parkedLookup is what lookupParked found.
type parkedLookup struct {
	// parked: the offsets of the rows parked below the progress.
	parked map[int64]struct{}
	// read: the records of usage.rejected read past its recorded
	// progress; kept: those of them the lookup kept (as an offset in
	// parked: the sink's parks of the partition in the range), each other
	// one dropped as it was read.
	read, kept int
}

// lookupParked returns the offsets in [from, progress) (from -1: the
// partition's start) of the rows of partition k the sink parked in
// committed transactions.
func (w *Writer) lookupParked(ctx context.Context, k tp, from, progress int64) (parkedLookup, error) {
	from = max(from, 0)
	out := map[int64]struct{}{}
	// The records of usage.rejected below each partition's recorded
	// progress are in their tables: read the progress before the table,
	// so that the table holds at least those.
	rec, err := w.readProgress(ctx)
	if err != nil {
		return parkedLookup{}, err
	}
	rejected := w.cfg.Topics.RejectedTopic()
	tail := map[int32]int64{}
	for k, p := range rec.progress {
		if k.topic == rejected {
			tail[k.p] = p
		}
	}
	for k, o := range rec.others {
		if k.topic == rejected && o.progress > tail[k.p] {
			tail[k.p] = o.progress
		}
	}
	if err := w.parkedInTables(ctx, k, from, progress, out); err != nil {
		return parkedLookup{}, err
	}
	// The tail of usage.rejected may be long (a flood of rejections
	// during an outage): each record is filtered as it is read, and only
	// the offsets of this partition's parks in the range are kept.
	start := time.Now()
	inTable := len(out)
	found := parkedLookup{parked: out}
	rctx, rcancel := context.WithTimeout(ctx, rereadTailTimeout)
	defer rcancel()
	err = topics.ScanCommittedAs(rctx, w.cfg.Kafka, rejected, tail, func(r *kgo.Record) {
		found.read++
		var rej schemas.Rejected
		if schemas.DecodeInto(r.Value, &rej) != nil {
			return // not a park of the sink's: those decode
		}
		if rej.Stage == stage && rej.SourceTopic == k.topic && rej.SourcePartition == k.p && rej.SourceOffset >= from && rej.SourceOffset < progress {
			out[rej.SourceOffset] = struct{}{}
			found.kept++
		}
	})
	if err != nil {
		return parkedLookup{}, fmt.Errorf("sink: read %s past its recorded progress: %w", rejected, err)
	}
	w.log.Info("partition read again below its recorded progress: looked up its rows parked there",
		zap.String("topic", k.topic), zap.Int32("partition", k.p), zap.Int64("from", from), zap.Int64("progress", progress),
		zap.Int("parked_in_table", inTable), zap.Int("parked", len(out)),
		zap.Int("records_read_from_rejected_topic", found.read), zap.Int("records_kept", found.kept), zap.Duration("took", time.Since(start)))
	return found, nil
}

// parkedInTables adds to out the offsets in [from, progress) of the rows
// of partition k that the sink parked and that are rows of usage_rejected,
// or of usage_quarantine: a park that ClickHouse refused as a row of
// usage_rejected is kept there whole, and is a park all the same.
func (w *Writer) parkedInTables(ctx context.Context, k tp, from, progress int64, out map[int64]struct{}) error {
	qctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), w.cfg.QueryTimeout)
	defer cancel()
	fail := func(err error) error { return fmt.Errorf("sink: rows parked below the recorded progress: %w", err) }
	rows, err := w.getConn().Query(qctx, parkedQuery(w.cfg.Database, k, from, progress))
	if err != nil {
		return fail(err)
	}
	defer rows.Close()
	for rows.Next() {
		var off int64
		if err := rows.Scan(&off); err != nil {
			return fail(err)
		}
		out[off] = struct{}{}
	}
	if err := rows.Err(); err != nil {
		return fail(err)
	}
	qrows, err := w.getConn().Query(qctx, quarantinedParksQuery(w.cfg.Database, w.cfg.Topics.RejectedTopic()))
	if err != nil {
		return fail(err)
	}
	defer qrows.Close()
	for qrows.Next() {
		var v string
		if err := qrows.Scan(&v); err != nil {
			return fail(err)
		}
		var rej schemas.Rejected
		if schemas.DecodeInto([]byte(v), &rej) != nil {
			continue // not a park of the sink's: those decode
		}
		if rej.Stage == stage && rej.SourceTopic == k.topic && rej.SourcePartition == k.p && rej.SourceOffset >= from && rej.SourceOffset < progress {
			out[rej.SourceOffset] = struct{}{}
		}
	}
	if err := qrows.Err(); err != nil {
		return fail(err)
	}
	return nil
}

// quarantinedParksQuery reads the values of the records of the rejected
// topic that ClickHouse refused as rows of usage_rejected (reason
// uninsertable), kept in usage_quarantine: the sink's parks among them
// are parks (parkedInTables). Records that do not decode are left out by
// their reason.
func quarantinedParksQuery(db, rejected string) string {
	return fmt.Sprintf("SELECT assumeNotNull(raw_value) FROM %s.%s WHERE kafka_topic = %s AND reason = %s AND isNotNull(raw_value)",
		db, TableQuarantine, quote(rejected), quote(schemas.ReasonUninsertable))
}

// unparkedDecodes drops from parks (records that did not decode) those
// parked before, on a re-read below the recorded progress.
func (w *Writer) unparkedDecodes(ctx context.Context, parks []decodePark) ([]decodePark, error) {
	out := parks[:0:0]
	for _, d := range parks {
		before, err := w.parkedBefore(ctx, d.src, d.off)
		if err != nil {
			return nil, err
		}
		if !before {
			out = append(out, d)
			continue
		}
		w.log.Warn("record that does not decode read again below the recorded progress: parked already, not parked again",
			zap.String("topic", d.src.topic), zap.Int32("partition", d.src.p), zap.Int64("offset", d.off))
	}
	return out, nil
}

// parkedQuery reads the offsets in [from, progress) of the rows of
// partition k that usage_rejected holds as parked by the sink. Its sort
// key is usage.rejected's partition and offset, so it reads the table
// whole; it runs once per partition read again below its progress, at its
// first refused row there.
func parkedQuery(db string, k tp, from, progress int64) string {
	return fmt.Sprintf("SELECT source_offset FROM %s.%s WHERE stage = %s AND source_topic = %s AND source_partition = %d AND source_offset >= %d AND source_offset < %d ORDER BY source_offset",
		db, TableRejected, quote(stage), quote(k.topic), k.p, from, progress)
}
