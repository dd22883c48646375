package sink

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/ClickHouse/clickhouse-go/v2/lib/proto"
	"go.uber.org/zap"

	"github.com/meterline/meterline/internal/fault"
)

// Insert and split: writing one table's rows of a batch (docs/design.md,
// The ClickHouse ledger, "Refused blocks").
//
// Guarantees kept here: an unreachable ClickHouse is told apart from a
// refused block (classify); while unreachable, the sink backs off and
// retries, committing nothing (availability.go). A refused block is split
// in halves, first half first, so that each partition's rows are tried in
// offset order and its first refused row is found before any higher offset
// of the partition is inserted; the rows after it are held back. An
// INSERT that may have written some parts (several blocks, several table
// partitions) leaves its partitions dirty, so the resume rule skips the
// rows already there on the next attempt.

// batchTable is one table's rows of one INSERT batch.
type batchTable struct {
	t     *table
	parks []parked
	// prior: the window's stops from earlier batches; stops: this batch's
	// (committed to the window only if the batch succeeds).
	prior, stops map[tp]stop
	held         int // rows held back behind a stop
	// overLimit: a refusal took the table's refusedRun past
	// MaxRefusedInARow in this attempt; taken: a row was accepted after
	// the last such refusal. A table judged broken by its run of
	// refusals keeps trying the other rows of the batch (the refused
	// row's partition held back behind it): one row accepted shows it is
	// not, and the attempt's refusals are parked; none, and nothing of
	// the attempt is (errTooManyRefused).
	overLimit, taken bool
}

func (ft *batchTable) heldBack(r *row) bool {
	k := tp{ft.t.topic, r.partition()}
	return heldBack(ft.prior, k, r.offset()) || heldBack(ft.stops, k, r.offset())
}

// unheld drops the rows held back behind a stop.
func (ft *batchTable) unheld(rows []*row) []*row {
	if len(ft.prior) == 0 && len(ft.stops) == 0 {
		return rows
	}
	n := 0
	for _, r := range rows {
		if !ft.heldBack(r) {
			n++
		}
	}
	if n == len(rows) {
		return rows
	}
	out := make([]*row, 0, n)
	for _, r := range rows {
		if !ft.heldBack(r) {
			out = append(out, r)
		}
	}
	ft.held += len(rows) - n
	return out
}

// writeTable inserts rows (one table's rows of a batch, in poll order: each
// partition's in offset order), except those held back behind a refused
// row, and returns the rows to park and the partitions that stop. While the
// table refuses too many rows in a row it backs off and retries; rows
// already inserted are then skipped by the resume rule.
func (w *Writer) writeTable(ctx context.Context, t *table, rows []*row, prior map[tp]stop) (*batchTable, error) {
	for attempt := 0; ; attempt++ {
		ft := &batchTable{t: t, prior: prior, stops: map[tp]stop{}}
		err := w.writeRows(ctx, ft, rows)
		if err == nil && ft.overLimit && !ft.taken {
			err = errTooManyRefused
		}
		if !errors.Is(err, errTooManyRefused) {
			if err == nil {
				w.clearBlocked()
			}
			return ft, err
		}
		// Nothing found in this attempt is parked; the rows held back
		// behind its refusals were not inserted, and are tried again.
		w.markRowsDirty(t, rows)
		w.setBlocked(fmt.Sprintf("clickhouse refuses more than %d rows in a row of %s (schema drift? a failing MATERIALIZED column?); not parking them, retrying", w.cfg.MaxRefusedInARow, t.name))
		w.log.Error("table refuses most rows: backing off instead of parking them", zap.String("table", t.name),
			zap.Int("refused_in_a_row", t.refusedRun), zap.Int("rows", len(rows)))
		if err := w.backoffSleep(ctx, attempt); err != nil {
			return nil, err
		}
	}
}

// writeRows writes rows, retrying while ClickHouse is unavailable, and
// splitting a refused block in two, first half first, so that each
// partition's rows are handled in offset order: once a partition's first
// refused row is found, its later rows are held back (docs/design.md, The
// ClickHouse ledger: the row is parked before any higher offset of its
// partition is inserted).
func (w *Writer) writeRows(ctx context.Context, ft *batchTable, rows []*row) error {
	t := ft.t
	// lookedUp: a refused INSERT of one row was followed by the resume
	// lookup of the row (refusedOne).
	lookedUp := false
	for attempt := 0; ; attempt++ {
		rows = ft.unheld(rows)
		if len(rows) == 0 {
			return nil
		}
		if err := w.checkZoneAgain(ctx); errors.Is(err, ErrServerTimeZone) {
			return fmt.Errorf("%w (found when ClickHouse answered again after it was unavailable: restarted in another zone?); the sink stops before writing more rows, committing nothing of the window", err)
		} else if err != nil {
			// A refused login (a server back with the sink's password
			// changed) or a code the sink does not know is bounded as an
			// INSERT failing so is.
			if err := w.unknownSpell(t, err); err != nil {
				return err
			}
			w.unavailable(t, err, "time zone check")
			if err := w.backoffSleep(ctx, attempt); err != nil {
				return err
			}
			continue
		}
		todo, err := w.filterPresent(ctx, t, rows)
		if errors.Is(err, errAbandon) {
			return err
		}
		if err != nil {
			// A lookup failing with a code the sink does not know is bounded
			// as an INSERT failing with one is.
			if err := w.unknownSpell(t, err); err != nil {
				return err
			}
			w.unavailable(t, err, "resume lookup")
			if err := w.backoffSleep(ctx, attempt); err != nil {
				return err
			}
			continue
		}
		if len(todo) == 0 {
			// Every row is in the table: a spell of failures with an
			// unknown code that ends here is over, as after an INSERT.
			w.endUnknownSpell()
			return nil
		}
		err = w.insert(ctx, t, todo)
		switch {
		case err == nil:
			t.refusedRun = 0
			ft.taken = true
			w.endUnknownSpell()
			return nil
		case errors.Is(err, errAbandon):
			return err
		case len(todo) > 1 && tooManyPartitions(err):
			// The block, not a row, is refused: nothing of it was
			// written, and its halves are tried in turn, as a refused
			// block's. A single row is never parked for it.
			w.markRowsDirty(t, todo)
			return w.writeHalves(ctx, ft, todo, "block spans more table partitions than the server takes in one INSERT; splitting it", err)
		case classify(err) == classRefused:
			// Some parts of the block may be written (a failure after the
			// first partition's part, or after the first of several
			// blocks): the partitions are dirty.
			w.markRowsDirty(t, todo)
			w.m.insertErrors.WithLabelValues(t.name, errRefused).Inc()
			if len(todo) == 1 && !lookedUp {
				lookedUp = true
				w.refusedOne(t, todo[0], err)
				continue
			}
			if len(todo) == 1 {
				return w.refuse(ctx, ft, todo[0], err)
			}
			return w.writeHalves(ctx, ft, todo, "block refused; splitting it to find the refused rows", err)
		default:
			// Unreachable, unable to take any block, or an error code the
			// sink does not know: the outcome of the INSERT is unknown, so
			// the partitions are dirty. Nothing is parked.
			w.markRowsDirty(t, todo)
			if err := w.unknownSpell(t, err); err != nil {
				return err
			}
			w.unavailable(t, err, "insert")
			if err := w.backoffSleep(ctx, attempt); err != nil {
				return err
			}
		}
	}
}

// refusedOne logs a refused INSERT of one row, which writeRows then looks
// up (the resume lookup, its partition dirty) before parking it. ClickHouse
// writes a table, then its materialized views (docs/design.md, The
// ClickHouse ledger): a view that fails refuses the INSERT of a row the
// table took. Such a row is in the ledger, its view's month is one verify
// rebuilds, and parked too it would be in usage.rejected besides (a parked
// adjustment is late usage no invoice run bills: an invoice job would bill
// it twice). A row the table refused is not there: it is inserted again,
// and parked when refused again.
func (w *Writer) refusedOne(t *table, r *row, cause error) {
	w.log.Info("insert of one row refused; looking it up before parking it (a materialized view can fail after its table took the row)",
		zap.String("table", t.name), zap.String("record", describe(t, r.rec)), zap.Error(cause))
}

// writeHalves writes the first half of rows, then the second (writeRows
// drops the second half's rows held back behind a refusal found in the
// first), after logging why the block is split.
func (w *Writer) writeHalves(ctx context.Context, ft *batchTable, rows []*row, why string, cause error) error {
	w.log.Info(why, zap.String("table", ft.t.name), zap.Int("rows", len(rows)), zap.Error(cause))
	mid := len(rows) / 2
	if err := w.writeRows(ctx, ft, rows[:mid]); err != nil {
		return err
	}
	return w.writeRows(ctx, ft, rows[mid:])
}

// insert sends rows in one INSERT, column by column (one typed slice per
// column: no per-value boxing), as one block or, with InsertBlockRows, as
// several.
func (w *Writer) insert(ctx context.Context, t *table, rows []*row) error {
	w.insertMu.Lock()
	defer w.insertMu.Unlock()
	if w.revoked.Load() {
		return errAbandon
	}
	start := time.Now()
	// The INSERT runs to its own deadline even while the process stops: a
	// write cut half-way would only leave more for the resume rule.
	ictx, cancel := context.WithTimeout(context.WithoutCancel(ctx), w.cfg.InsertTimeout)
	defer cancel()
	block := len(rows)
	if w.cfg.InsertBlockRows > 0 {
		block = w.cfg.InsertBlockRows
		// Without these the server squashes small blocks into one before
		// writing; with them each block is written as its own parts when
		// it arrives.
		ictx = clickhouse.Context(ictx, clickhouse.WithSettings(clickhouse.Settings{
			"min_insert_block_size_rows": 0, "min_insert_block_size_bytes": 0}))
	}
	// Its own query_id, naming the rows' topic and partitions: an attempt
	// with an unknown outcome is waited for on the server before the
	// resume rule looks up its rows, by this instance and by the next
	// owner of the partitions (settle.go).
	id := w.newInsertID(t.topic, spansOf(rows))
	ictx = clickhouse.Context(ictx, clickhouse.WithQueryID(id))
	b, err := w.getConn().PrepareBatch(ictx, t.insertSQL(w.cfg.Database))
	if err != nil {
		// Nothing was sent: never a refusal of these rows.
		return &prepareError{err}
	}
	if err := w.sendBatch(b, t, rows, block); err != nil {
		if !answered(err) {
			// No answer from the server: the attempt may still run
			// there, and write rows after the lookup of the retry.
			w.settleInsert(ctx, id, start)
		}
		return err
	}
	if w.hook != nil {
		w.hook(hookEvent{kind: hookInsert, table: t.name, topic: t.topic, spans: spansOf(rows)})
	}
	w.setUp(nil)
	w.m.insertSeconds.WithLabelValues(t.name).Observe(time.Since(start).Seconds())
	w.m.insertRows.WithLabelValues(t.name).Observe(float64(len(rows)))
	w.m.rows.WithLabelValues(t.name, outcomeInserted).Add(float64(len(rows)))
	return nil
}

// sendBatch appends rows to the prepared INSERT b, block rows at a time
// (each block but the last flushed), and sends it.
func (w *Writer) sendBatch(b driver.Batch, t *table, rows []*row, block int) error {
	for i := 0; i < len(rows); i += block {
		chunk := rows[i:min(i+block, len(rows))]
		for j, c := range t.columns {
			if err := b.Column(j).Append(c.slice(chunk)); err != nil {
				_ = b.Abort()
				return &driverError{column: c.name, err: err}
			}
		}
		if i+block < len(rows) {
			if err := b.Flush(); err != nil {
				_ = b.Abort()
				return err
			}
			// Guarantee: the blocks sent so far are written as parts; the
			// rest of the INSERT is not. A crash here leaves some rows of
			// the batch in the table, which the resume rule skips.
			fault.Hit(FaultMidInsert)
		}
	}
	return b.Send()
}

// tooManyPartitions reports whether err is the server refusing an INSERT
// block whose rows fall into more table partitions than
// max_partitions_per_insert_block (current ClickHouse; 100 by default):
// code 252, TOO_MANY_PARTS, which otherwise means that merges are behind
// (transient).
func tooManyPartitions(err error) bool {
	var ex *proto.Exception
	return errors.As(err, &ex) && ex.Code == 252 && !errors.As(err, new(*prepareError)) &&
		strings.Contains(ex.Message, "Too many partitions for single INSERT block")
}

// driverError is the driver refusing a column's values for the table's
// current column types (after schema drift, a value a column can no longer
// hold). It is a refusal of some of the rows: the block is split.
type driverError struct {
	column string
	err    error
}

func (e *driverError) Error() string {
	return "driver refused column " + e.column + ": " + e.err.Error()
}

func (e *driverError) Unwrap() error { return e.err }

// prepareError wraps a failure to start an INSERT: nothing was sent, so it
// is never a refusal of the rows, whatever the server said (a table whose
// columns drifted away from the sink's list refuses every block).
type prepareError struct{ err error }

func (e *prepareError) Error() string { return "prepare insert: " + e.err.Error() }

func (e *prepareError) Unwrap() error { return e.err }
