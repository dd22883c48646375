package sink

import (
	"context"
	"fmt"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/internal/topics"
)

// BaselineInsert is the benchmark's baseline: it writes the rows of recs
// (usage.deduped records) into db.usage_events with a bare clickhouse-go
// batch loop, batchRows rows per INSERT, each column appended as one typed
// slice (the driver's fastest path), and returns the time the loop took
// and the rows written. The rows are decoded and their column slices built
// before the clock starts, so the baseline is the cost of the INSERTs
// alone; the sink adds consuming, decoding and committing to it.
func BaselineInsert(ctx context.Context, conn driver.Conn, db string, names topics.Names, recs []*kgo.Record, batchRows int) (time.Duration, int, error) {
	t := newTables(names)[0]
	var rows []*row
	for _, r := range recs {
		row, err := t.buildRow(r)
		if err != nil {
			return 0, 0, err
		}
		if row != nil {
			rows = append(rows, row)
		}
	}
	var batches [][]any
	for i := 0; i < len(rows); i += batchRows {
		chunk := rows[i:min(i+batchRows, len(rows))]
		cols := make([]any, len(t.columns))
		for j, c := range t.columns {
			cols[j] = c.slice(chunk)
		}
		batches = append(batches, cols)
	}
	q := t.insertSQL(db)
	start := time.Now()
	for _, cols := range batches {
		ictx, cancel := context.WithTimeout(ctx, time.Minute)
		b, err := conn.PrepareBatch(ictx, q)
		if err != nil {
			cancel()
			return 0, 0, fmt.Errorf("baseline: %w", err)
		}
		for j, c := range cols {
			if err := b.Column(j).Append(c); err != nil {
				cancel()
				return 0, 0, fmt.Errorf("baseline: %w", err)
			}
		}
		err = b.Send()
		cancel()
		if err != nil {
			return 0, 0, fmt.Errorf("baseline: %w", err)
		}
	}
	return time.Since(start), len(rows), nil
}
