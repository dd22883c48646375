package sink

import (
	"context"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/meterline/meterline/schemas"
)

// Park and quarantine: where a row that cannot be inserted goes
// (docs/design.md, The ClickHouse ledger, "Refused blocks"; docs/design.md,
// Bad input).
//
// Guarantees kept here: a refused row is parked in usage.rejected with
// reason uninsertable, bounded (docs/design.md, Bad input), and stops its
// partition for the rest of the window (commit.go commits the offset just
// past it). Rows read from usage.rejected are never parked again: one that
// does not decode or that ClickHouse refuses is written whole to
// usage_quarantine, once across crashes (looked up before each write),
// before its offset is committed.

func (w *Writer) parkRecord(r *kgo.Record, id identity, reason, detail string) (*kgo.Record, error) {
	rej := &schemas.Rejected{
		Reason: reason, Detail: detail, Stage: "sink",
		SourceTopic: r.Topic, SourcePartition: r.Partition, SourceOffset: r.Offset, SourceTimestamp: r.Timestamp.UnixMilli(),
		CustomerID: id.customer, Meter: id.meter, EventID: id.eventID,
		RawKey: r.Key, RawValue: r.Value,
	}
	rej.Bound() // raw bytes: a prefix, the length and a SHA-256 (docs/design.md, Bad input)
	v, err := schemas.Encode(rej)
	if err != nil {
		return nil, fmt.Errorf("sink: encode rejected record for %s/%d@%d: %w", r.Topic, r.Partition, r.Offset, err)
	}
	var key []byte
	if id.customer != "" && id.meter != "" && id.eventID != "" {
		key = schemas.Identity{CustomerID: id.customer, Meter: id.meter, EventID: id.eventID}.Key()
	}
	return &kgo.Record{Topic: w.cfg.Topics.RejectedTopic(), Key: key, Value: v}, nil
}

// parked is a row refused by ClickHouse, on its way to usage.rejected.
type parked struct {
	table *table
	row   *row
	rec   *kgo.Record // the Rejected record; nil for a row of usage.rejected
	err   string
}

// refuse records a row refused by ClickHouse or the driver. A row to park
// stops its partition for the rest of the window.
func (w *Writer) refuse(ctx context.Context, ft *batchTable, r *row, cause error) error {
	ft.t.refusedRun++
	if ft.t.refusedRun > w.cfg.MaxRefusedInARow {
		if ft.t.rejected {
			// Its quarantine below is written at once, not with the
			// window: no row of a table judged broken goes there.
			return errTooManyRefused
		}
		// Parked only if the table accepts a row later in this attempt
		// (writeTable): the partition stops here as for any refused row,
		// and the batch's other partitions are tried.
		ft.overLimit, ft.taken = true, false
	}
	detail := fmt.Sprintf("sink: clickhouse refused the row for %s: %v", ft.t.name, cause)
	if ft.t.rejected {
		// Never park a row of the rejected topic: it would loop. It goes
		// to usage_quarantine now, before any later row is inserted; the
		// resume rule then never writes it to usage_rejected too.
		return w.writeQuarantine(ctx, []*row{quarantineRow(r.rec, schemas.ReasonUninsertable, detail)})
	}
	k := tp{ft.t.topic, r.partition()}
	if before, err := w.parkedBefore(ctx, k, r.offset()); err != nil {
		return err
	} else if before {
		// A re-read below the recorded progress (an operator moved the
		// group's offset back): the row was parked in a committed
		// transaction. It is not parked again and does not stop its
		// partition.
		w.m.rows.WithLabelValues(ft.t.name, outcomeParkedBefore).Inc()
		w.log.Warn("row refused again on a re-read below the recorded progress: parked already, not parked again",
			zap.String("table", ft.t.name), zap.String("record", describe(ft.t, r.rec)), zap.Error(cause))
		return nil
	}
	rec, err := w.parkRecord(r.rec, r.id, schemas.ReasonUninsertable, detail)
	if err != nil {
		return err
	}
	ft.parks = append(ft.parks, parked{table: ft.t, row: r, rec: rec, err: cause.Error()})
	// Rows are tried in offset order per partition and held back behind a
	// stop, so this is the partition's first refused row of the window.
	ft.stops[k] = stop{offset: r.offset(), epoch: r.rec.LeaderEpoch}
	w.log.Info("row refused: its partition's later rows are held back until it is parked",
		zap.String("table", ft.t.name), zap.Int32("partition", r.partition()), zap.Int64("offset", r.offset()))
	return nil
}

// writeQuarantine writes records of the rejected topic that cannot be rows
// of usage_rejected to usage_quarantine, with their raw bytes, each once:
// it first looks up which of their (partition, offset) pairs the table
// already holds (a crash, an aborted window or a rebalance may fall after
// an earlier INSERT of them and before the offset commit), and inserts the
// others. Guarantee on return without error: every one of rows is in
// usage_quarantine, and the window's offsets may move past them. While
// that fails it backs off and retries, as when ClickHouse is unavailable
// (the quarantine is where such records go last: they are never skipped);
// an error code it does not know, of its lookup or its INSERT, stops the
// sink after UnknownErrorLimit, and a refused login at once.
func (w *Writer) writeQuarantine(ctx context.Context, rows []*row) error {
	q := w.quarantine
	for attempt := 0; ; attempt++ {
		what := "resume lookup"
		todo, err := w.quarantineMissing(ctx, rows)
		if err == nil && len(todo) > 0 {
			what = "insert"
			err = w.insert(ctx, q, todo)
		}
		if err == nil {
			w.endUnknownSpell()
			w.clearBlocked()
			for _, r := range todo {
				u := r.msg.(*unreadable)
				w.m.quarantined.WithLabelValues(u.reason).Inc()
				w.m.rows.WithLabelValues(TableRejected, outcomeQuarantined).Inc()
				w.log.Error("record of the rejected topic cannot be written to "+TableRejected+" and is never parked again: written to "+TableQuarantine+" with its raw bytes",
					zap.String("record", describe(q, r.rec)), zap.String("reason", u.reason), zap.String("detail", u.detail))
			}
			return nil
		}
		if errors.Is(err, errAbandon) {
			return err
		}
		if what == "insert" && len(todo) > 1 && tooManyPartitions(err) {
			// The block, not a row, is refused (insert.go): its halves
			// are written in turn.
			w.markRowsDirty(q, todo)
			mid := len(todo) / 2
			if err := w.writeQuarantine(ctx, todo[:mid]); err != nil {
				return err
			}
			return w.writeQuarantine(ctx, todo[mid:])
		}
		if what == "insert" {
			w.markRowsDirty(q, todo) // q's topic is the rejected topic
		}
		// A lookup failing with a code the sink does not know is bounded
		// as an INSERT failing with one is (writeRows).
		if err := w.unknownSpell(q, err); err != nil {
			return err
		}
		w.unavailable(q, err, what)
		if err := w.backoffSleep(ctx, attempt); err != nil {
			return err
		}
	}
}

// quarantineRow is a usage_quarantine row for record r.
func quarantineRow(r *kgo.Record, reason, detail string) *row {
	return &row{rec: r, msg: &unreadable{reason: reason, detail: detail}}
}

// quarantineMissing returns the rows whose (partition, offset) is not in
// usage_quarantine yet.
func (w *Writer) quarantineMissing(ctx context.Context, rows []*row) ([]*row, error) {
	// This lookup runs for every write, not once per dirty spell as the
	// resume rule's: each waits for INSERTs of the rows' partitions that
	// still run (an instance's that lost them).
	spans := spansOf(rows)
	if err := w.awaitInserts(ctx, w.quarantine, sortedKeys(spans)); err != nil {
		return nil, err
	}
	present, err := w.lookup(ctx, w.quarantine, "kafka_offset", rangeConds(spans), false)
	if err != nil {
		return nil, err
	}
	out := make([]*row, 0, len(rows))
	for _, r := range rows {
		if !present.has(r.partition(), r.offset()) {
			out = append(out, r)
		}
	}
	return out, nil
}
