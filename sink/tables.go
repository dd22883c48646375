package sink

import (
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/internal/topics"
	"github.com/meterline/meterline/schemas"
)

// Table names, one per topic (docs/design.md, The ClickHouse ledger). The
// DDL is in schemas/clickhouse.
const (
	TableEvents      = "usage_events"
	TableAggregates  = "usage_aggregates"
	TableAdjustments = "usage_adjustments"
	TableDuplicates  = "usage_duplicates"
	TableRejected    = "usage_rejected"
	// TableQuarantine holds the records of usage.rejected that cannot be
	// rows of usage_rejected (their value does not decode, or ClickHouse
	// refused the row), with their raw bytes, Kafka coordinates and the
	// reason. Such records are never parked again (docs/design.md, The
	// ClickHouse ledger); without it they would be gone with the topic's
	// retention.
	TableQuarantine = "usage_quarantine"
)

// resumeChunk is the offset chunk of every table's sort key,
// intDiv(kafka_offset, 65536); it must match the DDL.
const resumeChunk = 65536

// table is one topic → table mapping.
type table struct {
	name    string
	topic   string
	columns []column // the INSERT's columns, the Kafka coordinates first
	// rejected marks the usage.rejected table: its rows are never parked.
	rejected bool
	// recordsIn counts the topic's polled records (set by New).
	recordsIn prometheus.Counter
	// timeIn counts the topic's polled records that are no row (its
	// watermark records), a part of recordsIn (set by New).
	timeIn prometheus.Counter
	// refusedRun counts the rows ClickHouse refused in a row, with no row
	// accepted in between (the inserter goroutine's).
	refusedRun int
	// decode decodes a record's value. skip: the record is not a row (a
	// watermark).
	decode func(v []byte) (msg any, id identity, skip bool, err error)
}

// column is one column of a table and how to get its values from rows.
// Every value is derived from the record alone, so a replayed row is
// byte-identical to the first copy.
type column struct {
	name string
	// slice returns the rows' values as a typed slice, for
	// Batch.Column(i).Append: no per-value boxing.
	slice func(rows []*row) any
	// value returns one row's value, for Batch.Append, which names the row
	// the driver refuses.
	value func(r *row) any
}

// rcol is a column read from the Kafka record.
func rcol[T any](name string, f func(r *kgo.Record) T) column {
	return column{name: name,
		slice: func(rows []*row) any {
			out := make([]T, len(rows))
			for i, r := range rows {
				out[i] = f(r.rec)
			}
			return out
		},
		value: func(r *row) any { return f(r.rec) },
	}
}

// mcol is a column read from the decoded message M.
func mcol[M any, T any](name string, f func(m *M) T) column {
	return column{name: name,
		slice: func(rows []*row) any {
			out := make([]T, len(rows))
			for i, r := range rows {
				out[i] = f(r.msg.(*M))
			}
			return out
		},
		value: func(r *row) any { return f(r.msg.(*M)) },
	}
}

// identity is what a parked record carries to identify the row, when known.
type identity struct{ customer, meter, eventID string }

func (t *table) insertSQL(db string) string {
	names := make([]string, len(t.columns))
	for i, c := range t.columns {
		names[i] = c.name
	}
	return "INSERT INTO " + db + "." + t.name + " (" + strings.Join(names, ", ") + ")"
}

func (t *table) columnNames() []string {
	out := make([]string, len(t.columns))
	for i, c := range t.columns {
		out[i] = c.name
	}
	return out
}

// values returns one row's values in column order.
func (t *table) values(r *row) []any {
	out := make([]any, len(t.columns))
	for i, c := range t.columns {
		out[i] = c.value(r)
	}
	return out
}

// row is one record on its way to a table.
type row struct {
	rec *kgo.Record
	id  identity
	msg any // the decoded message: *schemas.DedupedEvent, ...
}

func (r *row) partition() int32 { return r.rec.Partition }
func (r *row) offset() int64    { return r.rec.Offset }

// buildRow decodes a record. It returns a nil row for a record that is not
// a row (a watermark), and an error for a value that does not decode.
func (t *table) buildRow(rec *kgo.Record) (*row, error) {
	msg, id, skip, err := t.decode(rec.Value)
	if err != nil || skip {
		return nil, err
	}
	return &row{rec: rec, id: id, msg: msg}, nil
}

// secs converts epoch milliseconds to epoch seconds for a DateTime column,
// rounding down, and saturating at the ends of DateTime's range (an
// unsigned 32-bit number of seconds: 1970-01-01 00:00:00 to 2106-02-07
// 06:28:15). The driver would otherwise wrap a time outside it around to
// another date without an error (a grant expiring in 2200 read 2063, an
// event of 1969 read 2106); the _ms column beside it keeps the time
// exactly.
func secs(ms int64) int64 {
	s := ms / 1000
	if ms%1000 < 0 {
		s--
	}
	return min(max(s, 0), math.MaxUint32)
}

func names(ps []schemas.Property) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.Name
	}
	return out
}

func values(ps []schemas.Property) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.Value
	}
	return out
}

// groupKey is the canonical text of a group: a JSON object with the
// properties in their (sorted) order, "{}" for none. Analysts can read it
// with visitParamExtractString(group_key, 'region'). Names and values are
// quoted as Go quotes them, which is JSON for printable text; a value with
// another control character than \b \f \n \r \t, or an unprintable rune
// past U+FFFF, gets an escape JSON lacks (docs/analysts.md says to read
// group_values then). It stays so: it is part of the aggregate's key, and
// another quoting would give existing aggregates a second row.
func groupKey(ps []schemas.Property) string {
	var b strings.Builder
	b.WriteByte('{')
	for i, p := range ps {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Quote(p.Name))
		b.WriteByte(':')
		b.WriteString(strconv.Quote(p.Value))
	}
	b.WriteByte('}')
	return b.String()
}

func boolU8(b bool) uint8 {
	if b {
		return 1
	}
	return 0
}

func nullableBytes(b []byte) *string {
	if b == nil {
		return nil
	}
	s := string(b)
	return &s
}

// decoder returns a decode function for message type M.
func decoder[M any, PM interface {
	*M
	schemas.Message
}](id func(*M) identity) func(v []byte) (any, identity, bool, error) {
	return func(v []byte) (any, identity, bool, error) {
		m := PM(new(M))
		if err := schemas.DecodeInto(v, m); err != nil {
			return nil, identity{}, false, err
		}
		return (*M)(m), id((*M)(m)), false, nil
	}
}

// unreadable is the message of a usage_quarantine row: why the record
// could not be a row of its own table.
type unreadable struct {
	reason string // a reason code (docs/design.md, Bad input): undecodable, unknown_schema, uninsertable
	detail string
}

// commonColumns are the Kafka coordinates every table starts with.
func commonColumns() []column {
	return []column{
		rcol("kafka_topic", func(r *kgo.Record) string { return r.Topic }),
		rcol("kafka_partition", func(r *kgo.Record) int32 { return r.Partition }),
		rcol("kafka_offset", func(r *kgo.Record) int64 { return r.Offset }),
		rcol("kafka_timestamp", func(r *kgo.Record) int64 { return secs(r.Timestamp.UnixMilli()) }),
		rcol("kafka_timestamp_ms", func(r *kgo.Record) int64 { return r.Timestamp.UnixMilli() }),
	}
}

// newQuarantine is the usage_quarantine table, for records of the rejected
// topic. It is not one of the tables records are routed to by topic.
func newQuarantine(n topics.Names) *table {
	type un = unreadable
	return &table{
		name: TableQuarantine, topic: n.RejectedTopic(),
		columns: append(commonColumns(),
			mcol("reason", func(u *un) string { return u.reason }),
			mcol("detail", func(u *un) string { return u.detail }),
			rcol("raw_key", func(r *kgo.Record) *string { return nullableBytes(r.Key) }),
			rcol("raw_value", func(r *kgo.Record) *string { return nullableBytes(r.Value) }),
			rcol("header_keys", func(r *kgo.Record) []string {
				out := make([]string, len(r.Headers))
				for i, h := range r.Headers {
					out[i] = h.Key
				}
				return out
			}),
			rcol("header_values", func(r *kgo.Record) []string {
				out := make([]string, len(r.Headers))
				for i, h := range r.Headers {
					out[i] = string(h.Value)
				}
				return out
			}),
		),
	}
}

func newTables(n topics.Names) []*table {
	common := commonColumns()
	cols := func(specific ...column) []column { return append(append([]column{}, common...), specific...) }

	type ev = schemas.DedupedEvent
	eventDecode := decoder[ev](func(e *ev) identity { return identity{e.CustomerID, e.Meter, e.EventID} })
	type ag = schemas.Aggregate
	type ad = schemas.Adjustment
	type du = schemas.Duplicate
	type rj = schemas.Rejected
	return []*table{
		{
			name: TableEvents, topic: n.DedupedTopic(),
			columns: cols(
				mcol("event_id", func(e *ev) string { return e.EventID }),
				mcol("customer_id", func(e *ev) string { return e.CustomerID }),
				mcol("meter", func(e *ev) string { return e.Meter }),
				mcol("quantity", func(e *ev) int64 { return e.Quantity }),
				mcol("event_time", func(e *ev) int64 { return secs(e.EventTime) }),
				mcol("event_time_ms", func(e *ev) int64 { return e.EventTime }),
				mcol("source", func(e *ev) string { return e.Source }),
				mcol("property_names", func(e *ev) []string { return names(e.Properties) }),
				mcol("property_values", func(e *ev) []string { return values(e.Properties) }),
				mcol("ingest_time", func(e *ev) int64 { return secs(e.IngestTime) }),
				mcol("ingest_time_ms", func(e *ev) int64 { return e.IngestTime }),
				mcol("source_partition", func(e *ev) int32 { return e.SourcePartition }),
				mcol("source_offset", func(e *ev) int64 { return e.SourceOffset }),
				// The end of the sort key (013_ledger_copy_keys.sql): two
				// accepted copies of one identity never collapse.
				rcol("record_offset", func(r *kgo.Record) int64 { return r.Offset }),
			),
			decode: func(v []byte) (any, identity, bool, error) {
				k, err := schemas.PeekKind(v)
				if err != nil {
					return nil, identity{}, false, err
				}
				if k == schemas.KindWatermark {
					return nil, identity{}, true, nil
				}
				return eventDecode(v)
			},
		},
		{
			name: TableAggregates, topic: n.AggregatesTopic(),
			columns: cols(
				mcol("customer_id", func(a *ag) string { return a.CustomerID }),
				mcol("meter", func(a *ag) string { return a.Meter }),
				mcol("group_key", func(a *ag) string { return groupKey(a.Group) }),
				mcol("group_names", func(a *ag) []string { return names(a.Group) }),
				mcol("group_values", func(a *ag) []string { return values(a.Group) }),
				mcol("aggregation", func(a *ag) string { return a.Aggregation }),
				mcol("period_start", func(a *ag) int64 { return secs(a.PeriodStart) }),
				mcol("period_end", func(a *ag) int64 { return secs(a.PeriodEnd) }),
				mcol("revision", func(a *ag) int64 { return a.Revision }),
				mcol("status", func(a *ag) string { return string(a.Status) }),
				mcol("value", func(a *ag) int64 { return a.Value }),
				mcol("event_count", func(a *ag) int64 { return a.EventCount }),
				mcol("first_event_time_ms", func(a *ag) int64 { return a.FirstEventTime }),
				mcol("last_event_time_ms", func(a *ag) int64 { return a.LastEventTime }),
				mcol("updated_at_ms", func(a *ag) int64 { return a.UpdatedAt }),
			),
			decode: decoder[ag](func(a *ag) identity { return identity{customer: a.CustomerID, meter: a.Meter} }),
		},
		{
			name: TableAdjustments, topic: n.AdjustmentsTopic(),
			columns: cols(
				mcol("event_id", func(a *ad) string { return a.EventID }),
				mcol("customer_id", func(a *ad) string { return a.CustomerID }),
				mcol("meter", func(a *ad) string { return a.Meter }),
				mcol("group_key", func(a *ad) string { return groupKey(a.Group) }),
				mcol("group_names", func(a *ad) []string { return names(a.Group) }),
				mcol("group_values", func(a *ad) []string { return values(a.Group) }),
				mcol("aggregation", func(a *ad) string { return a.Aggregation }),
				mcol("original_period_start", func(a *ad) int64 { return secs(a.OriginalPeriodStart) }),
				mcol("original_period_end", func(a *ad) int64 { return secs(a.OriginalPeriodEnd) }),
				mcol("booked_period_start", func(a *ad) int64 { return secs(a.BookedPeriodStart) }),
				mcol("booked_period_end", func(a *ad) int64 { return secs(a.BookedPeriodEnd) }),
				mcol("delta", func(a *ad) int64 { return a.Delta }),
				mcol("quantity", func(a *ad) int64 { return a.Quantity }),
				mcol("event_time", func(a *ad) int64 { return secs(a.EventTime) }),
				mcol("event_time_ms", func(a *ad) int64 { return a.EventTime }),
				mcol("ingest_time", func(a *ad) int64 { return secs(a.IngestTime) }),
				mcol("ingest_time_ms", func(a *ad) int64 { return a.IngestTime }),
				// The end of the sort key (013_ledger_copy_keys.sql): two
				// late copies of one identity never collapse.
				rcol("record_offset", func(r *kgo.Record) int64 { return r.Offset }),
			),
			decode: decoder[ad](func(a *ad) identity { return identity{a.CustomerID, a.Meter, a.EventID} }),
		},
		{
			name: TableDuplicates, topic: n.DuplicatesTopic(),
			columns: cols(
				mcol("event_id", func(d *du) string { return d.EventID }),
				mcol("customer_id", func(d *du) string { return d.CustomerID }),
				mcol("meter", func(d *du) string { return d.Meter }),
				mcol("source", func(d *du) string { return d.Source }),
				mcol("conflict", func(d *du) uint8 { return boolU8(d.Conflict) }),
				mcol("quantity", func(d *du) int64 { return d.Quantity }),
				mcol("event_time", func(d *du) int64 { return secs(d.EventTime) }),
				mcol("event_time_ms", func(d *du) int64 { return d.EventTime }),
				mcol("original_partition", func(d *du) int32 { return d.OriginalPartition }),
				mcol("original_offset", func(d *du) int64 { return d.OriginalOffset }),
				mcol("original_arrival_ms", func(d *du) int64 { return d.OriginalArrival }),
				mcol("duplicate_partition", func(d *du) int32 { return d.DuplicatePartition }),
				mcol("duplicate_offset", func(d *du) int64 { return d.DuplicateOffset }),
				mcol("duplicate_arrival", func(d *du) int64 { return secs(d.DuplicateArrival) }),
				mcol("duplicate_arrival_ms", func(d *du) int64 { return d.DuplicateArrival }),
			),
			decode: decoder[du](func(d *du) identity { return identity{d.CustomerID, d.Meter, d.EventID} }),
		},
		{
			name: TableRejected, topic: n.RejectedTopic(), rejected: true,
			columns: cols(
				mcol("reason", func(r *rj) string { return r.Reason }),
				mcol("detail", func(r *rj) string { return r.Detail }),
				mcol("stage", func(r *rj) string { return r.Stage }),
				mcol("source_topic", func(r *rj) string { return r.SourceTopic }),
				mcol("source_partition", func(r *rj) int32 { return r.SourcePartition }),
				mcol("source_offset", func(r *rj) int64 { return r.SourceOffset }),
				mcol("source_timestamp", func(r *rj) int64 { return secs(r.SourceTimestamp) }),
				mcol("source_timestamp_ms", func(r *rj) int64 { return r.SourceTimestamp }),
				mcol("customer_id", func(r *rj) string { return r.CustomerID }),
				mcol("meter", func(r *rj) string { return r.Meter }),
				mcol("event_id", func(r *rj) string { return r.EventID }),
				mcol("raw_key", func(r *rj) *string { return nullableBytes(r.RawKey) }),
				mcol("raw_value", func(r *rj) *string { return nullableBytes(r.RawValue) }),
				mcol("raw_key_length", func(r *rj) int64 { return r.RawKeyLength }),
				mcol("raw_key_sha256", func(r *rj) string { return hex.EncodeToString(r.RawKeySHA256) }),
				mcol("raw_value_length", func(r *rj) int64 { return r.RawValueLength }),
				mcol("raw_value_sha256", func(r *rj) string { return hex.EncodeToString(r.RawValueSHA256) }),
				// The end of the sort key (007_rejected_record_key.sql):
				// two records about one source record never collapse.
				rcol("record_offset", func(r *kgo.Record) int64 { return r.Offset }),
			),
			decode: decoder[rj](func(r *rj) identity { return identity{r.CustomerID, r.Meter, r.EventID} }),
		},
		balancesTable(n, cols),
	}
}

// decodeReason maps a decode error to a reason code (docs/design.md, Bad
// input).
func decodeReason(err error) string {
	if errors.Is(err, schemas.ErrUnknownSchema) {
		return schemas.ReasonUnknownSchema
	}
	return schemas.ReasonUndecodable
}

func describe(t *table, r *kgo.Record) string {
	return fmt.Sprintf("%s/%d@%d", t.topic, r.Partition, r.Offset)
}
