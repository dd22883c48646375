package sink

import (
	"fmt"
	"strings"
	"time"
)

// AnalystQuery is a ready-made query over the analyst tables, for the
// analysts page, docs/analysts.md, which shows them verbatim (checked by
// internal/docscheck). Each one is run against real data with numbers
// worked out by hand (TestAnalystQueries), on ClickHouse 18.16 and on a
// current release with the same answers (TestClickHouseTwoVersions),
// and timed at 100 million events by `meterline bench queries`. Table
// names are unqualified: run them with the sink's database as the
// session's default (clickhouse-client --database meterline).
//
// ClickHouse 18.16 has no query parameters, so the queries carry example
// values: customer 'acme', meter 'api_calls', and the month of January
// 2024 (from '2024-01-01' to '2024-02-01'; February for the period that
// late usage is booked into). For swaps them for others.
type AnalystQuery struct {
	Name  string
	Title string
	SQL   string
}

// The example values of AnalystQueries.
const (
	exampleCustomer  = "'acme'"
	exampleMeter     = "'api_calls'"
	exampleMonth     = "2024-01-01"
	exampleNextMonth = "2024-02-01"
)

// QueryParams are values for the example values of an AnalystQuery.
type QueryParams struct {
	Customer string
	Meter    string
	// Month is the first instant of a month (UTC).
	Month time.Time
}

// For returns the query with the example values replaced by p's.
func (q AnalystQuery) For(p QueryParams) (string, error) {
	if p.Month.IsZero() || !p.Month.Equal(time.Date(p.Month.Year(), p.Month.Month(), 1, 0, 0, 0, 0, time.UTC)) {
		return "", fmt.Errorf("sink: query %s: month %s is not the first instant of a month (UTC)", q.Name, p.Month)
	}
	for _, s := range []string{p.Customer, p.Meter} {
		if strings.ContainsAny(s, `'\`) {
			return "", fmt.Errorf("sink: query %s: %q: quotes and backslashes are not supported", q.Name, s)
		}
	}
	r := strings.NewReplacer(
		exampleCustomer, "'"+p.Customer+"'",
		exampleMeter, "'"+p.Meter+"'",
		exampleMonth, p.Month.Format("2006-01-02"),
		exampleNextMonth, p.Month.AddDate(0, 1, 0).Format("2006-01-02"),
	)
	return r.Replace(q.SQL), nil
}

// AnalystQueries are the queries of docs/analysts.md, in its order.
var AnalystQueries = []AnalystQuery{
	{Name: "usage_by_day", Title: "A customer's billable usage by day, for one month", SQL: `
SELECT day, meter, sum(events) AS billable_events, sum(quantity) AS billable_quantity
FROM
(
    SELECT day, meter, toInt64(events) AS events, quantity
    FROM usage_daily
    WHERE customer_id = 'acme' AND day >= '2024-01-01' AND day < '2024-02-01'
    UNION ALL
    SELECT toDate(event_time) AS day, meter, -count() AS events, -sum(toDecimal128(quantity, 0)) AS quantity
    FROM events_by_customer FINAL
    PREWHERE event_id IN (SELECT event_id FROM unbilled_events WHERE customer_id = 'acme')
    WHERE customer_id = 'acme' AND event_time >= '2024-01-01 00:00:00' AND event_time < '2024-02-01 00:00:00'
      AND (meter, event_id, kafka_partition, kafka_offset) IN
          (SELECT meter, event_id, source_partition, source_offset FROM unbilled_events WHERE customer_id = 'acme')
    GROUP BY day, meter
)
GROUP BY day, meter
HAVING billable_events != 0
ORDER BY day, meter`},

	{Name: "current_values", Title: "The current value of each of a customer's aggregates", SQL: `
SELECT meter, group_key, period_start, period_end, status, revision, value
FROM aggregates_current FINAL
WHERE customer_id = 'acme'
ORDER BY meter, period_start, group_key`},

	{Name: "invoice_lines", Title: "Invoice lines for one period, all customers", SQL: `
SELECT customer_id, meter, group_key,
       sum(toDecimal128(value, 0)) AS usage_value,
       sum(toDecimal128(delta, 0)) AS adjustments,
       usage_value + adjustments   AS invoice_quantity,
       if(countIf(status = 'FINAL') > 0, 'final', 'open') AS line_status
FROM invoice_lines FINAL
WHERE period_start = '2024-01-01 00:00:00'
GROUP BY customer_id, meter, group_key
ORDER BY customer_id, meter, group_key`},

	{Name: "top_customers", Title: "Top 20 customers of a meter, for one month", SQL: `
SELECT customer_id, sum(toDecimal128(value, 0)) AS usage
FROM aggregates_current FINAL
WHERE meter = 'api_calls' AND aggregation IN ('SUM', 'COUNT')
  AND period_start >= '2024-01-01 00:00:00' AND period_start < '2024-02-01 00:00:00'
GROUP BY customer_id
HAVING usage > 0
ORDER BY length(toString(usage)) DESC, toString(usage) DESC, customer_id
LIMIT 20`},

	{Name: "late_usage", Title: "Late usage booked as adjustments into a period", SQL: `
SELECT original_period_start, customer_id, meter, count() AS late_events, sum(toDecimal128(delta, 0)) AS booked_delta
FROM invoice_lines FINAL
WHERE period_start = '2024-02-01 00:00:00' AND line_kind = 'adjustment'
GROUP BY original_period_start, customer_id, meter
ORDER BY original_period_start, customer_id, meter`},

	{Name: "duplicate_rate", Title: "Duplicate rate per source and day", SQL: `
SELECT day, source,
       sum(accepted)   AS accepted_events,
       sum(duplicates) AS dropped_copies,
       sum(conflicts)  AS conflicting_copies,
       round(dropped_copies / (accepted_events + dropped_copies), 4) AS duplicate_rate
FROM source_daily
WHERE day >= '2024-01-01' AND day < '2024-02-01'
GROUP BY day, source
ORDER BY day, source`},

	{Name: "rejections", Title: "Rejections by reason and day", SQL: `
SELECT toDate(kafka_timestamp) AS day, stage, reason, count() AS records
FROM usage_rejected FINAL
WHERE kafka_timestamp >= '2024-01-01 00:00:00' AND kafka_timestamp < '2024-02-01 00:00:00'
GROUP BY day, stage, reason
ORDER BY day, stage, reason`},

	{Name: "unbilled", Title: "A customer's unbilled events", SQL: `
SELECT meter, reason, count() AS events
FROM unbilled_events FINAL
WHERE customer_id = 'acme'
GROUP BY meter, reason
ORDER BY meter, reason`},

	{Name: "adjustments_progress", Title: "The sink's progress on usage.adjustments", SQL: `
SELECT kafka_partition, max(next_offset) AS next_offset
FROM sink_progress
WHERE kafka_topic = 'usage.adjustments'
GROUP BY kafka_partition
ORDER BY kafka_partition`},

	{Name: "invoice_run", Title: "An invoice run: a month's final lines and the adjustments since the last run", SQL: `
SELECT period_start, customer_id, meter, group_key,
       sum(usage_value) AS usage_value,
       sum(adjustments) AS adjustments,
       usage_value + adjustments AS invoice_quantity,
       if(period_start < '2024-01-01 00:00:00', 'invoiced', if(countIf(status = 'FINAL') > 0, 'final', 'open')) AS line_status
FROM
(
    SELECT period_start, customer_id, meter, group_key, toDecimal128(value, 0) AS usage_value, toDecimal128(0, 0) AS adjustments, status
    FROM invoice_lines FINAL
    WHERE period_start >= '2024-01-01 00:00:00' AND period_start < '2024-02-01 00:00:00' AND line_kind = 'usage'
    UNION ALL
    SELECT booked_period_start, customer_id, meter, group_key, toDecimal128(0, 0), toDecimal128(delta, 0), ''
    FROM usage_adjustments FINAL
    WHERE kafka_topic = 'usage.adjustments' AND kafka_offset < [5, 3][kafka_partition + 1]
      AND (booked_period_start >= '2024-01-01 00:00:00' AND booked_period_start < '2024-02-01 00:00:00'
           OR booked_period_start < '2024-01-01 00:00:00' AND kafka_offset >= [2, 1][kafka_partition + 1])
)
GROUP BY period_start, customer_id, meter, group_key
ORDER BY period_start, customer_id, meter, group_key`},
}
