package sink

// AnalystQuery is a ready-made query over the sink's tables, for the
// analysts page, docs/analysts.md. Each one is run against real data, and
// its numbers checked, by TestAnalystQueries. Table names are unqualified:
// run them with the sink's database as the session's default
// (clickhouse-client --database meterline).
type AnalystQuery struct {
	Name  string
	Title string
	SQL   string
}

// AnalystQueries are the queries of docs/analysts.md, in its order.
var AnalystQueries = []AnalystQuery{
	{Name: "usage_per_customer_period", Title: "Usage per customer and period (latest revision of each aggregate)", SQL: `
SELECT customer_id, meter, group_key, period_start, period_end,
       argMax(value, revision)  AS latest_value,
       argMax(status, revision) AS latest_status,
       max(revision)            AS latest_revision
FROM usage_aggregates
GROUP BY customer_id, meter, group_key, period_start, period_end
ORDER BY customer_id, meter, period_start, group_key`},

	{Name: "raw_usage_per_customer_month", Title: "Raw usage per customer and calendar month, from the events (SUM meters)", SQL: `
SELECT customer_id, meter, toStartOfMonth(event_time) AS month,
       count() AS events, sum(quantity) AS quantity
FROM usage_events
GROUP BY customer_id, meter, month
ORDER BY customer_id, meter, month`},

	{Name: "invoice_quantities", Title: "Invoice quantities: FINAL value plus the adjustments booked into the period", SQL: `
SELECT customer_id, meter, group_key, period_start,
       sum(f)                                AS final_value,
       sum(a)                                AS adjustments,
       final_value + adjustments             AS invoice_quantity,
       max(h)                                AS finalized
FROM
(
    SELECT customer_id, meter, group_key, period_start,
           argMax(value, revision) AS f, toInt64(0) AS a, toUInt8(1) AS h
    FROM usage_aggregates
    WHERE status = 'FINAL'
    GROUP BY customer_id, meter, group_key, period_start
    UNION ALL
    SELECT customer_id, meter, group_key, booked_period_start AS period_start,
           toInt64(0) AS f, sum(delta) AS a, toUInt8(0) AS h
    FROM usage_adjustments
    GROUP BY customer_id, meter, group_key, period_start
)
GROUP BY customer_id, meter, group_key, period_start
ORDER BY customer_id, meter, period_start, group_key`},

	{Name: "adjustments_per_period", Title: "Adjustments per period (late events booked into a later period)", SQL: `
SELECT booked_period_start, original_period_start, customer_id, meter,
       count()    AS late_events,
       sum(delta) AS delta
FROM usage_adjustments
GROUP BY booked_period_start, original_period_start, customer_id, meter
ORDER BY booked_period_start, original_period_start, customer_id, meter`},

	{Name: "duplicate_rate_per_source", Title: "Duplicate rate per source", SQL: `
SELECT source,
       sum(d)                                AS duplicates,
       sum(c)                                AS conflicts,
       sum(n)                                AS accepted,
       duplicates / (accepted + duplicates)  AS duplicate_rate
FROM
(
    SELECT source, count() AS d, countIf(conflict = 1) AS c, toUInt64(0) AS n
    FROM usage_duplicates
    GROUP BY source
    UNION ALL
    SELECT source, toUInt64(0) AS d, toUInt64(0) AS c, count() AS n
    FROM usage_events
    GROUP BY source
)
GROUP BY source
ORDER BY duplicate_rate DESC, source`},

	{Name: "rejected_by_reason", Title: "Rejected records by reason", SQL: `
SELECT reason, stage, count() AS records,
       min(kafka_timestamp) AS first_seen, max(kafka_timestamp) AS last_seen
FROM usage_rejected
GROUP BY reason, stage
ORDER BY records DESC, reason, stage`},

	{Name: "top_customers_this_month", Title: "Top 10 customers this month, per meter (SUM and COUNT meters, open periods included)", SQL: `
SELECT meter, customer_id, sum(v) AS usage
FROM
(
    SELECT meter, customer_id, group_key, period_start, argMax(value, revision) AS v
    FROM usage_aggregates
    WHERE toStartOfMonth(period_start) = toStartOfMonth(now())
      AND aggregation IN ('SUM', 'COUNT')
    GROUP BY meter, customer_id, group_key, period_start
)
GROUP BY meter, customer_id
ORDER BY meter, usage DESC, customer_id
LIMIT 10 BY meter`},
}
