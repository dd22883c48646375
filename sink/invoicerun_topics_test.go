package sink

import (
	"fmt"
	"testing"
)

// The invoice run's bounds are offsets of one topic (docs/analysts.md,
// Invoicing exactly once): those the sink's progress names for the
// adjustments topic. Each pipeline has a database of its own
// (docs/operations.md, One database per pipeline); still, a
// usage_adjustments that also holds the rows of another adjustments topic,
// whose offsets start at 0 too, bills the same run: the other topic's
// rows at offsets below the bounds are not this topic's adjustments.

// otherTopicInserts: invoiceRunInserts, and the adjustments of
// usage.adjustments.v2 at the offsets the run's bounds cover, booked into
// January and into invoiced December, with its own progress.
func otherTopicInserts(db string) []string {
	out := invoiceRunInserts(db)
	adj := func(p, off int, cust, booked, bookedEnd string, delta int) {
		out = append(out, fmt.Sprintf("INSERT INTO %s.usage_adjustments (kafka_topic, kafka_partition, kafka_offset, kafka_timestamp, event_id, "+
			"customer_id, meter, group_key, aggregation, original_period_start, booked_period_start, booked_period_end, delta, quantity, "+
			"record_offset) SELECT 'usage.adjustments.v2', toInt32(%d), toInt64(%d), toDateTime('2024-01-25 10:00:00'), 'v2-%d-%d', '%s', "+
			"'api_calls', '{}', 'SUM', toDateTime('2023-11-01 00:00:00'), toDateTime('%s'), toDateTime('%s'), toInt64(%d), toInt64(%d), toInt64(%d)",
			db, p, off, p, off, cust, booked, bookedEnd, delta, delta, off))
	}
	adj(0, 1, "acme", "2024-01-01 00:00:00", "2024-02-01 00:00:00", 100)
	adj(0, 3, "acme", "2023-12-01 00:00:00", "2024-01-01 00:00:00", 200)
	adj(1, 2, "globex", "2024-01-01 00:00:00", "2024-02-01 00:00:00", 300)
	return append(out, fmt.Sprintf("INSERT INTO %s.sink_progress (consumer_group, kafka_topic, kafka_partition, next_offset, written_at) "+
		"SELECT 'meterline-sink', 'usage.adjustments.v2', toInt32(0), toUInt64(4), toDateTime('2024-02-03 09:00:00')", db))
}

// TestInvoiceRunOneTopic: on ClickHouse 18.16, the progress and both runs
// of usage.adjustments answer as they do without the other topic's rows.
func TestInvoiceRunOneTopic(t *testing.T) {
	conn, _, ctx := migratedDB(t, otherTopicInserts)
	for i, q := range invoiceRunQueries(t) {
		got, err := tsv(ctx, conn, q)
		if err != nil {
			t.Fatalf("%v\n%s", err, q)
		}
		if got != invoiceRunWant[i] {
			t.Errorf("query %d on 18.16:\n%s\nwant\n%s", i, got, invoiceRunWant[i])
		}
	}
}

// TestInvoiceRunOneTopicOnChdb is TestInvoiceRunOneTopic on current
// ClickHouse (chdb, 26.x).
func TestInvoiceRunOneTopicOnChdb(t *testing.T) {
	checkInvoiceRunChdb(t, "invoiceruntopics", otherTopicInserts)
}
