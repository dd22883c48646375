package sink

import "testing"

// Verify compares the columns of a derived row that the documented
// queries read, not only its key, counts and sums: a month whose rows
// are all there, with the right keys, values and revisions, but another
// group label (group_values, how docs/analysts.md says to read a group),
// an event's time moved across midnight (the day usage_by_day takes an
// unbilled event back from) or another rejection reason (the unbilled
// events query groups by it), differs. The data is written through
// views edited to change one such column each, as a change by hand
// would.

// columnEdits change, in January 2024: every group value of
// aggregates_current, every event time of events_by_customer (by an
// hour: acme's event of 23:30 on the 10th moves to the 11th), every
// reason of unbilled_events.
var columnEdits = map[string][2]string{
	"aggregates_current_mv": {"group_values, aggregation", "arrayMap(v -> concat(v, '-x'), group_values) AS group_values, aggregation"},
	"events_by_customer_mv": {"meter, event_time, event_id", "meter, addHours(event_time, 1) AS event_time, event_id"},
	"unbilled_events_mv":    {"reason, detail", "'over_limit' AS reason, detail"},
}

// columnDiffers are the tables whose January 2024 columnEdits change.
var columnDiffers = map[string]bool{TableAggregatesCurrent: true, TableEventsByCustomer: true, TableUnbilledEvents: true}

// columnInserts: two events of acme (the first at 23:30 on January 10th,
// which the aggregator rejected for no_credit), and an aggregate of acme
// in the group region=eu.
func columnInserts(db string) []string {
	ev := func(off, id, at string) string {
		return "SELECT 'usage.deduped.v2' AS t, toInt32(0) AS p, toInt64(" + off + ") AS o, toDateTime('" + at + "') AS ts, '" + id +
			"' AS e, 'acme' AS c, 'api_calls' AS m, toInt64(2) AS q, toDateTime('" + at + "') AS et, 'gw' AS s, toDateTime('" + at +
			"') AS it, toInt64(" + off + ") AS ro"
	}
	return []string{
		"INSERT INTO " + db + ".usage_events (kafka_topic, kafka_partition, kafka_offset, kafka_timestamp, event_id, customer_id, meter, " +
			"quantity, event_time, source, ingest_time, record_offset) SELECT * FROM (" +
			ev("0", "e1", "2024-01-10 23:30:00") + " UNION ALL " + ev("1", "e2", "2024-01-12 08:00:00") + ")",
		"INSERT INTO " + db + ".usage_rejected (kafka_topic, kafka_partition, kafka_offset, kafka_timestamp, reason, detail, stage, " +
			"source_topic, source_partition, source_offset, customer_id, meter, event_id, record_offset) " +
			"SELECT 'usage.rejected', toInt32(0), toInt64(0), toDateTime('2024-01-10 23:31:00'), 'no_credit', 'grants spent', 'aggregator', " +
			"'usage.deduped.v2', toInt32(0), toInt64(0), 'acme', 'api_calls', 'e1', toInt64(0)",
		"INSERT INTO " + db + ".usage_aggregates (kafka_topic, kafka_partition, kafka_offset, kafka_timestamp, customer_id, meter, group_key, " +
			"group_names, group_values, aggregation, period_start, period_end, revision, status, value, event_count) " +
			"SELECT 'usage.aggregates', toInt32(0), toInt64(0), toDateTime('2024-01-12 09:00:00'), 'acme', 'api_calls', '{\"region\":\"eu\"}', " +
			"['region'], ['eu'], 'SUM', toDateTime('2024-01-01 00:00:00'), toDateTime('2024-02-01 00:00:00'), toInt64(1), 'OPEN', toInt64(2), toInt64(1)",
	}
}

// TestVerifyComparesQueriedColumns: on ClickHouse 18.16, the months of
// aggregates_current, events_by_customer and unbilled_events whose group
// label, event time or rejection reason differ from the ledger's differ;
// every other month is equal.
func TestVerifyComparesQueriedColumns(t *testing.T) {
	checkEditedMonths(t, columnEdits, columnInserts, columnDiffers)
}

// TestVerifyComparesQueriedColumnsOnChdb computes verify's measures of
// the same data on current ClickHouse (chdb, 26.x): the same tables
// differ, the others are equal.
func TestVerifyComparesQueriedColumnsOnChdb(t *testing.T) {
	checkEditedMeasuresChdb(t, "verifycolumns", columnEdits, columnInserts, columnDiffers)
}
