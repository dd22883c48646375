package sink

import (
	"fmt"
	"strings"
	"time"

	"github.com/meterline/meterline/internal/topics"
)

// SyntheticData is a data set generated inside ClickHouse by INSERT ...
// SELECT FROM numbers() into the ledger tables, so that it flows through
// the real views: for `meterline bench queries` and for the tests that run
// the documented queries on two ClickHouse versions. Every value is a pure
// integer function of the row number (intHash64, intDiv, modulo; no
// floating point, no random), so any ClickHouse version generates the
// same rows.
//
// Customers are skewed: customer index ⌊u⁴/C³⌋ for u uniform in [0, C),
// so that P(index < x) = (x/C)^¼. With C = 20,000, cust-0 sends about
// 8% of the events, the 10 largest 15% and the largest 1,000 nearly half.
type SyntheticData struct {
	// Events is the number of usage_events rows.
	Events int64
	// Revisions is about the number of usage_aggregates rows: OPEN
	// revisions, plus one FINAL per (customer, meter, region, closed
	// month).
	Revisions int64
	// Customers is C above.
	Customers int64
	// Months of event time from January 2024; all but the last are closed
	// (their aggregates have a FINAL revision).
	Months int
	// Partitions of the Kafka topics.
	Partitions int64
	// Chunk is the most rows one INSERT generates. Default: 10,000,000.
	Chunk int64
}

// SyntheticStart is the first instant of SyntheticData.
var SyntheticStart = time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)

// Shares of the events, per 1,000, that also appear as a duplicate, an
// adjustment, a rejection by dedup (a separate identity) or a rejection by
// the aggregator (the event itself: accepted, then unbilled).
const (
	synDuplicatesPer1000  = 20
	synAdjustmentsPer1000 = 5
	synDedupRejectPer1000 = 1
	synAggRejectPer1000   = 1
)

// Statements returns the INSERTs that generate the data set into db.
func (s SyntheticData) Statements(db string) []string {
	if s.Chunk <= 0 {
		s.Chunk = 10_000_000
	}
	end := SyntheticStart.AddDate(0, s.Months, 0)
	g := synGen{SyntheticData: s, db: db, t0: SyntheticStart.UnixMilli(), spanMs: end.Sub(SyntheticStart).Milliseconds(),
		// The rows' kafka_topic is the default deduped topic, as a sink with
		// the default names writes it (ResumeLookupAt looks it up).
		deduped: topics.DefaultNames().DedupedTopic()}
	var out []string
	out = append(out, g.chunks(s.Events, g.events)...)
	out = append(out, g.chunks(s.Events, g.duplicates)...)
	out = append(out, g.chunks(s.Events, g.adjustments)...)
	lo := int(synDuplicatesPer1000 + synAdjustmentsPer1000)
	out = append(out, g.chunks(s.Events, g.rejected("dedup", lo, lo+synDedupRejectPer1000,
		"['too_old', 'in_future', 'invalid', 'undecodable']", "concat('rej-', toString(n))", "usage.events"))...)
	lo += synDedupRejectPer1000
	out = append(out, g.chunks(s.Events, g.rejected("aggregator", lo, lo+synAggRejectPer1000,
		"['unknown_meter', 'invalid']", "concat('ev-', toString(n))", g.deduped))...)
	out = append(out, g.aggregates()...)
	for i := range out {
		out[i] = strings.TrimSpace(out[i])
	}
	return out
}

// synGen writes the statements of a SyntheticData into db: t0 and spanMs
// are the first instant and the span of its event times (epoch ms).
type synGen struct {
	SyntheticData
	db      string
	t0      int64
	spanMs  int64
	deduped string
}

// ev is the SELECT of the derived events of rows from to from + count:
// customer index c, hashes h and h2, event time ets and arrival its
// (epoch ms).
func (g synGen) ev(from, count int64) string {
	return fmt.Sprintf(`SELECT n, h, h2, c, ets, ets + toInt64(intDiv(h2, 1099511627776) %% 5000) AS its,
       concat('cust-', toString(c)) AS customer,
       ['api_calls', 'tokens', 'storage_bytes', 'compute_ms', 'egress_bytes'][1 + h2 %% 5] AS meter_name,
       toInt64(1 + intDiv(h2, 1024) %% 97) AS qty,
       ['gateway', 'batch', 'mobile', 'web', 'ingest', 'partner'][1 + intDiv(h2, 65536) %% 6] AS src,
       ['eu', 'us'][1 + intDiv(h2, 16777216) %% 2] AS region,
       intDiv(h, 4294967296) %% 1000 AS sel,
       toInt32(n %% %[5]d) AS part, toInt64(intDiv(n, %[5]d)) AS off
FROM (
    SELECT n, h, h2, intDiv(intDiv(intDiv(u * u, %[3]d) * u, %[3]d) * u, %[3]d) AS c,
           toInt64(%[6]d + intDiv(n * %[7]d, %[8]d) + intDiv(h2, 4294967296) %% 600000) AS ets
    FROM (
        SELECT number + %[1]d AS n, intHash64(number + %[1]d) AS h, intHash64(number + %[1]d + 1000000000000) AS h2,
               h %% %[3]d AS u
        FROM numbers(%[2]d)
    )
)`, from, count, g.Customers, 0, g.Partitions, g.t0, g.spanMs, g.Events)
}

// chunks splits total rows into INSERTs of at most Chunk rows, each
// written by f.
func (g synGen) chunks(total int64, f func(from, count int64) string) []string {
	var out []string
	for from := int64(0); from < total; from += g.Chunk {
		out = append(out, f(from, min(g.Chunk, total-from)))
	}
	return out
}

// events inserts the usage_events of rows from to from + count.
func (g synGen) events(from, count int64) string {
	return fmt.Sprintf(`INSERT INTO %s.usage_events (kafka_topic, kafka_partition, kafka_offset, kafka_timestamp, kafka_timestamp_ms,
    event_id, customer_id, meter, quantity, event_time, event_time_ms, source, property_names, property_values,
    ingest_time, ingest_time_ms, source_partition, source_offset)
SELECT '%s', part, off, toDateTime(intDiv(its, 1000)), its,
       concat('ev-', toString(n)), customer, meter_name, qty, toDateTime(intDiv(ets, 1000)), ets, src,
       ['region'], [region], toDateTime(intDiv(its, 1000)), its, part, off
FROM (%s)`, g.db, g.deduped, g.ev(from, count))
}

// duplicates inserts a duplicate of synDuplicatesPer1000 of the events.
func (g synGen) duplicates(from, count int64) string {
	return fmt.Sprintf(`INSERT INTO %s.usage_duplicates (kafka_topic, kafka_partition, kafka_offset, kafka_timestamp, kafka_timestamp_ms,
    event_id, customer_id, meter, source, conflict, quantity, event_time, event_time_ms,
    original_partition, original_offset, original_arrival_ms, duplicate_partition, duplicate_offset, duplicate_arrival, duplicate_arrival_ms)
SELECT 'usage.duplicates', part, off, toDateTime(intDiv(its + 60000, 1000)), its + 60000,
       concat('ev-', toString(n)), customer, meter_name, src, toUInt8(intDiv(h2, 281474976710656) %% 10 = 0), qty,
       toDateTime(intDiv(ets, 1000)), ets, part, off, its, part, off + 1000000000,
       toDateTime(intDiv(its + 60000, 1000)), its + 60000
FROM (%s)
WHERE sel < %d`, g.db, g.ev(from, count), synDuplicatesPer1000)
}

// adjustments inserts an adjustment, booked a month after the event's, of
// the next synAdjustmentsPer1000 of the events.
func (g synGen) adjustments(from, count int64) string {
	return fmt.Sprintf(`INSERT INTO %[1]s.usage_adjustments (kafka_topic, kafka_partition, kafka_offset, kafka_timestamp, kafka_timestamp_ms,
    event_id, customer_id, meter, group_key, group_names, group_values, aggregation,
    original_period_start, original_period_end, booked_period_start, booked_period_end, delta, quantity,
    event_time, event_time_ms, ingest_time, ingest_time_ms)
SELECT 'usage.adjustments', part, off, booked, toInt64(toUInt32(booked)) * 1000,
       concat('ev-', toString(n)), customer, meter_name, concat('{"region":"', region, '"}'), ['region'], [region], 'SUM',
       toDateTime(orig), toDateTime(addMonths(orig, 1)), booked, toDateTime(addMonths(orig, 2)), qty, qty,
       toDateTime(intDiv(ets, 1000)), ets, booked, toInt64(toUInt32(booked)) * 1000
FROM (
    SELECT *, toStartOfMonth(toDateTime(intDiv(ets, 1000))) AS orig, toDateTime(addMonths(orig, 1)) AS booked
    FROM (%[2]s)
    WHERE sel >= %[3]d AND sel < %[4]d
)`, g.db, g.ev(from, count), synDuplicatesPer1000, synDuplicatesPer1000+synAdjustmentsPer1000)
}

// rejected inserts a rejection by stage, for one of reasons, of the events
// whose sel is in [lo, hi).
func (g synGen) rejected(stage string, lo, hi int, reasons, idExpr, topic string) func(from, count int64) string {
	return func(from, count int64) string {
		return fmt.Sprintf(`INSERT INTO %[1]s.usage_rejected (kafka_topic, kafka_partition, kafka_offset, kafka_timestamp, kafka_timestamp_ms,
    reason, detail, stage, source_topic, source_partition, source_offset, source_timestamp, source_timestamp_ms,
    customer_id, meter, event_id, raw_key, raw_value)
SELECT 'usage.rejected', part, off, toDateTime(intDiv(its, 1000)), its,
       %[4]s[1 + intDiv(h2, 281474976710656) %% length(%[4]s)], 'synthetic', '%[5]s', '%[7]s', part, off,
       toDateTime(intDiv(its, 1000)), its, customer, meter_name, %[6]s, NULL, NULL
FROM (%[2]s)
WHERE sel >= %[3]s`, g.db, g.ev(from, count), fmt.Sprintf("%d AND sel < %d", lo, hi), reasons, stage, idExpr, topic)
	}
}

// aggregates inserts the aggregates: OPEN revisions spread over the months,
// then one FINAL per key of each closed month with a higher revision.
func (g synGen) aggregates() []string {
	closed := int64(g.Months - 1)
	finals := g.Customers * 10 * closed
	open := max(g.Revisions-finals, 0)
	spanS := g.spanMs / 1000
	var out []string
	for from := int64(0); from < open; from += g.Chunk {
		count := min(g.Chunk, open-from)
		out = append(out, g.aggregatesFrom(fmt.Sprintf(`
    SELECT i, intDiv(intDiv(intDiv(u * u, %[3]d) * u, %[3]d) * u, %[3]d) AS c, intDiv(hi, 4294967296) %% 5 AS m,
           intDiv(hi, 1099511627776) %% 2 AS r, addMonths(toDate('2024-01-01'), toUInt32(intDiv(i * %[4]d, %[5]d))) AS ps,
           toDateTime(%[6]d + intDiv(i * %[7]d, %[5]d)) AS kts, toInt64(i + 1) AS rev, 'OPEN' AS st,
           toInt64(intDiv(i, 7) %% 1000000) AS val
    FROM (SELECT number + %[1]d AS i, intHash64(number + %[1]d + 3000000000000) AS hi, hi %% %[3]d AS u FROM numbers(%[2]d))`,
			from, count, g.Customers, g.Months, open, SyntheticStart.Unix(), spanS)))
	}
	if finals > 0 {
		out = append(out, g.aggregatesFrom(fmt.Sprintf(`
    SELECT i, intDiv(k, %[2]d) AS c, intDiv(k %% %[2]d, %[3]d) %% 5 AS m, intDiv(k %% %[2]d, %[3]d * 5) AS r,
           addMonths(toDate('2024-01-01'), toUInt32(k %% %[3]d)) AS ps, toDateTime(addMonths(ps, 1)) + 172800 AS kts,
           toInt64(%[4]d + k + 1) AS rev, 'FINAL' AS st, toInt64(intHash64(k) %% 100000) AS val
    FROM (SELECT number + %[4]d AS i, number AS k FROM numbers(%[1]d))`,
			finals, 10*closed, closed, open)))
	}
	return out
}

// aggregatesFrom inserts the usage_aggregates rows that sel selects.
func (g synGen) aggregatesFrom(sel string) string {
	return fmt.Sprintf(`INSERT INTO %s.usage_aggregates (kafka_topic, kafka_partition, kafka_offset, kafka_timestamp, kafka_timestamp_ms,
    customer_id, meter, group_key, group_names, group_values, aggregation, period_start, period_end,
    revision, status, value, event_count, first_event_time_ms, last_event_time_ms, updated_at_ms)
SELECT 'usage.aggregates', toInt32(i %% %d), toInt64(intDiv(i, %d)), kts, toInt64(toUInt32(kts)) * 1000,
       concat('cust-', toString(c)), ['api_calls', 'tokens', 'storage_bytes', 'compute_ms', 'egress_bytes'][1 + m],
       concat('{"region":"', ['eu', 'us'][1 + r], '"}'), ['region'], [['eu', 'us'][1 + r]],
       'SUM', toDateTime(ps), toDateTime(addMonths(ps, 1)), rev, st, val, toInt64(val %% 1000 + 1),
       toInt64(toUInt32(toDateTime(ps))) * 1000, toInt64(toUInt32(kts)) * 1000, toInt64(toUInt32(kts)) * 1000
FROM (%s)`, g.db, g.Partitions, g.Partitions, sel)
}
