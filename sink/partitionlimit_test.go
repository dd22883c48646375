package sink

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/ClickHouse/clickhouse-go/v2/lib/proto"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/schemas"
)

// Current ClickHouse (26.x) refuses an INSERT block whose rows fall into
// more than max_partitions_per_insert_block (100) partitions of a table,
// with code 252, TOO_MANY_PARTS, the code of a server whose merges are
// behind. It refuses the block, not a row: any half of it may be
// inserted. 18.16 has no such limit, so partitionLimitConn enforces one
// on the ledger tables' months, as 26.x refuses such a block: before
// anything of it is written.

// partitionLimitConn refuses, as 26.x does, an INSERT of rows of more
// than limit months of kafka_timestamp.
type partitionLimitConn struct {
	driver.Conn
	limit int
}

func (c partitionLimitConn) PrepareBatch(ctx context.Context, query string, opts ...driver.PrepareBatchOption) (driver.Batch, error) {
	b, err := c.Conn.PrepareBatch(ctx, query, opts...)
	if err != nil || !strings.Contains(query, "kafka_timestamp") {
		return b, err
	}
	return &partitionLimitBatch{Batch: b, limit: c.limit, months: map[int]bool{}}, nil
}

type partitionLimitBatch struct {
	driver.Batch
	limit  int
	months map[int]bool
}

// kafkaTimestampColumn is the index of kafka_timestamp (commonColumns).
const kafkaTimestampColumn = 3

func (b *partitionLimitBatch) Column(i int) driver.BatchColumn {
	c := b.Batch.Column(i)
	if i != kafkaTimestampColumn {
		return c
	}
	return monthColumn{BatchColumn: c, months: b.months}
}

func (b *partitionLimitBatch) Send() error {
	if len(b.months) > b.limit {
		_ = b.Batch.Abort()
		return &proto.Exception{Code: 252, Name: "DB::Exception", Message: fmt.Sprintf(
			"Too many partitions for single INSERT block (more than %d). The limit is controlled by 'max_partitions_per_insert_block' setting.", b.limit)}
	}
	return b.Batch.Send()
}

type monthColumn struct {
	driver.BatchColumn
	months map[int]bool
}

func (c monthColumn) Append(v any) error {
	for _, s := range v.([]int64) {
		t := time.Unix(s, 0).UTC()
		c.months[t.Year()*100+int(t.Month())] = true
	}
	return c.BatchColumn.Append(v)
}

// TestBlockOfTooManyMonths: records of usage.rejected written in 12
// months, read in one batch, against a server that takes rows of at most
// 5 months per INSERT: 12 rejections, and 12 records that do not decode
// (rows of usage_quarantine). The sink inserts them in smaller blocks:
// every row is written once, in its table.
func TestBlockOfTooManyMonths(t *testing.T) {
	e := newEnv(t, 1)
	now := time.Now().UTC()
	var recs []*kgo.Record
	for i := 0; i < 12; i++ {
		ts := now.AddDate(0, -i, 0)
		r := &schemas.Rejected{Reason: schemas.ReasonTooOld, Stage: "dedup", SourceTopic: "usage.events", SourceOffset: int64(i)}
		recs = append(recs, &kgo.Record{Topic: e.names.RejectedTopic(), Value: schemas.MustEncode(r), Timestamp: ts},
			&kgo.Record{Topic: e.names.RejectedTopic(), Value: []byte("not avro"), Timestamp: ts})
	}
	e.produce(recs...)
	r := e.start(func(c *Config) {
		c.Conn = partitionLimitConn{Conn: e.conn, limit: 5}
		c.MaxBatchWait = 2 * time.Second // one batch of the 24 records
	})
	e.waitCaughtUp(time.Minute, e.names.RejectedTopic())
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	e.exact(TableRejected, 12)
	e.exact(TableQuarantine, 12)
}
