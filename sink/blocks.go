package sink

import (
	"fmt"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/internal/topics"
)

// EventBlocks returns the rows of recs, usage.deduped records, as the sink
// writes them into db's usage_events table: the INSERT statement, and for
// each block of at most blockRows rows one typed slice per column (for
// driver.Batch.Column(i).Append, the driver's fastest path), with the
// number of rows. Watermark records are not rows; a record that does not
// decode is an error. The sink benchmark's baseline writes these blocks
// with a bare clickhouse-go loop.
func EventBlocks(db string, names topics.Names, recs []*kgo.Record, blockRows int) (query string, blocks [][]any, rows int, err error) {
	if blockRows <= 0 {
		return "", nil, 0, fmt.Errorf("sink: block rows must be positive (got %d)", blockRows)
	}
	t := newTables(names)[0]
	var rs []*row
	for _, r := range recs {
		row, err := t.buildRow(r)
		if err != nil {
			return "", nil, 0, fmt.Errorf("sink: %s: %w", describe(t, r), err)
		}
		if row != nil {
			rs = append(rs, row)
		}
	}
	for i := 0; i < len(rs); i += blockRows {
		chunk := rs[i:min(i+blockRows, len(rs))]
		cols := make([]any, len(t.columns))
		for j, c := range t.columns {
			cols[j] = c.slice(chunk)
		}
		blocks = append(blocks, cols)
	}
	return t.insertSQL(db), blocks, len(rs), nil
}
