-- Analyst tables (DESIGN §7), derived from the ledger tables of
-- 001_tables.sql by materialized views. The ledger is ordered for the
-- sink's resume rule; these are ordered for the questions analysts and
-- billing systems ask (docs/analysts.md). ClickHouse writes a ledger table,
-- then its views, in one INSERT: a view that fails after the ledger insert
-- leaves the derived table short, and the sink's resume rule will not send
-- those rows again; `meterline verify` compares every derived table with
-- the ledger per month and rebuilds a month that differs (sink/verify.go).
--
-- Every view selects its target's columns in the target's order. The
-- idempotent tables (ReplacingMergeTree) collapse a replayed or zombie row
-- at merge time and read exactly with FINAL; the daily rollups
-- (SummingMergeTree, read with sum()) count such a row twice until verify
-- repairs the month.
--
-- Features used (ClickHouse 18.16 and current releases): MergeTree-family
-- CREATE TABLE IF NOT EXISTS, ReplacingMergeTree(UInt64 version),
-- SummingMergeTree, CREATE MATERIALIZED VIEW IF NOT EXISTS ... TO,
-- INSERT ... SELECT with scalar subqueries.

-- Events by customer: usage_events, customer first. One customer's range is
-- a prefix of the sort key, so a query for one customer and month reads
-- that customer's granules of one partition, whatever the table's size.
CREATE TABLE IF NOT EXISTS events_by_customer (
    customer_id      String,
    meter            String,
    event_time       DateTime,
    event_id         String,
    event_time_ms    Int64,
    quantity         Int64,
    source           String,
    property_names   Array(String),
    property_values  Array(String),
    ingest_time      DateTime,
    ingest_time_ms   Int64,
    kafka_partition  Int32,
    kafka_offset     Int64
) ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(event_time)
ORDER BY (customer_id, meter, event_time, event_id);

CREATE MATERIALIZED VIEW IF NOT EXISTS events_by_customer_mv TO events_by_customer AS
SELECT customer_id, meter, event_time, event_id, event_time_ms, quantity, source,
       property_names, property_values, ingest_time, ingest_time_ms, kafka_partition, kafka_offset
FROM usage_events;

-- The current value of every aggregate: one row per (customer, meter,
-- period, group) after merges, the highest revision.
CREATE TABLE IF NOT EXISTS aggregates_current (
    customer_id          String,
    meter                String,
    period_start         DateTime,
    group_key            String,
    period_end           DateTime,
    group_names          Array(String),
    group_values         Array(String),
    aggregation          String,
    revision             UInt64,
    status               String,
    value                Int64,
    event_count          Int64,
    first_event_time_ms  Int64,
    last_event_time_ms   Int64,
    updated_at_ms        Int64
) ENGINE = ReplacingMergeTree(revision)
PARTITION BY toYYYYMM(period_start)
ORDER BY (customer_id, meter, period_start, group_key);

CREATE MATERIALIZED VIEW IF NOT EXISTS aggregates_current_mv TO aggregates_current AS
SELECT customer_id, meter, period_start, group_key, period_end, group_names, group_values, aggregation,
       toUInt64(revision) AS revision, status, value, event_count,
       first_event_time_ms, last_event_time_ms, updated_at_ms
FROM usage_aggregates;

-- Invoice lines, period first. Each billing line (period, customer, meter,
-- group) is the sum of its rows here: one 'usage' row, the aggregate's
-- latest revision (its value, and status FINAL once the period is final),
-- and one 'adjustment' row per late event booked into the period (its
-- delta). The invoice quantity is value + sum(delta) (DESIGN §3).
CREATE TABLE IF NOT EXISTS invoice_lines (
    period_start           DateTime,
    customer_id            String,
    meter                  String,
    group_key              String,
    line_kind              String,
    event_id               String,
    period_end             DateTime,
    aggregation            String,
    revision               UInt64,
    status                 String,
    value                  Int64,
    delta                  Int64,
    original_period_start  DateTime
) ENGINE = ReplacingMergeTree(revision)
PARTITION BY toYYYYMM(period_start)
ORDER BY (period_start, customer_id, meter, group_key, line_kind, event_id);

CREATE MATERIALIZED VIEW IF NOT EXISTS invoice_lines_usage_mv TO invoice_lines AS
SELECT period_start, customer_id, meter, group_key, 'usage' AS line_kind, '' AS event_id,
       period_end, aggregation, toUInt64(revision) AS revision, status,
       value, toInt64(0) AS delta, period_start AS original_period_start
FROM usage_aggregates;

CREATE MATERIALIZED VIEW IF NOT EXISTS invoice_lines_adjustments_mv TO invoice_lines AS
SELECT booked_period_start AS period_start, customer_id, meter, group_key, 'adjustment' AS line_kind, event_id,
       booked_period_end AS period_end, aggregation, toUInt64(0) AS revision, '' AS status,
       toInt64(0) AS value, delta, original_period_start
FROM usage_adjustments;

-- Events dedup accepted that the aggregator rejected (over_limit,
-- no_credit, unknown_meter, invalid): in usage_events and
-- events_by_customer, but never billed. Event-level queries exclude them.
CREATE TABLE IF NOT EXISTS unbilled_events (
    customer_id       String,
    meter             String,
    event_id          String,
    source_partition  Int32,
    source_offset     Int64,
    reason            String,
    detail            String,
    kafka_timestamp   DateTime,
    kafka_partition   Int32,
    kafka_offset      Int64
) ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(kafka_timestamp)
ORDER BY (customer_id, meter, event_id, source_partition, source_offset);

CREATE MATERIALIZED VIEW IF NOT EXISTS unbilled_events_mv TO unbilled_events AS
SELECT customer_id, meter, event_id, source_partition, source_offset, reason, detail,
       kafka_timestamp, kafka_partition, kafka_offset
FROM usage_rejected
WHERE stage = 'aggregator';

-- A customer's accepted usage per meter and day of event time. A
-- customer's month is at most 31 rows per meter, whatever its volume.
CREATE TABLE IF NOT EXISTS usage_daily (
    customer_id  String,
    meter        String,
    day          Date,
    events       UInt64,
    quantity     Int64
) ENGINE = SummingMergeTree
PARTITION BY toYYYYMM(day)
ORDER BY (customer_id, meter, day);

-- One row per event: SummingMergeTree adds them up when parts merge. A
-- GROUP BY here would cost more than it saves at the sink's block size,
-- where most (customer, meter, day) keys of a block are distinct.
CREATE MATERIALIZED VIEW IF NOT EXISTS usage_daily_mv TO usage_daily AS
SELECT customer_id, meter, toDate(event_time) AS day, toUInt64(1) AS events, quantity
FROM usage_events;

-- Accepted events, dropped copies and conflicts per source and arrival
-- day, for the duplicate rate.
CREATE TABLE IF NOT EXISTS source_daily (
    day         Date,
    source      String,
    accepted    UInt64,
    duplicates  UInt64,
    conflicts   UInt64
) ENGINE = SummingMergeTree
PARTITION BY toYYYYMM(day)
ORDER BY (day, source);

CREATE MATERIALIZED VIEW IF NOT EXISTS source_daily_events_mv TO source_daily AS
SELECT toDate(ingest_time) AS day, source, count() AS accepted, toUInt64(0) AS duplicates, toUInt64(0) AS conflicts
FROM usage_events
GROUP BY day, source;

CREATE MATERIALIZED VIEW IF NOT EXISTS source_daily_duplicates_mv TO source_daily AS
SELECT toDate(duplicate_arrival) AS day, source, toUInt64(0) AS accepted, count() AS duplicates, countIf(conflict = 1) AS conflicts
FROM usage_duplicates
GROUP BY day, source;

-- Rebuilds of derived tables (sink/verify.go). A row with finished = 0 is
-- a rebuild that has not finished: the sink refuses to start while one
-- exists, and `meterline verify --backfill` finishes it. The highest
-- version of a run_id wins; recorded_at is when that version was written.
CREATE TABLE IF NOT EXISTS meterline_rebuilds (
    run_id      String,
    recorded_at DateTime,
    tables      Array(String),
    reason      String,
    finished    UInt8,
    version     UInt64
) ENGINE = ReplacingMergeTree(version)
ORDER BY run_id;

-- On a database that already holds data, the views above see only new
-- rows: the derived tables need a backfill before a sink writes again.
INSERT INTO meterline_rebuilds (run_id, recorded_at, tables, reason, finished, version)
SELECT 'backfill 004_analyst_tables.sql', now(),
       ['events_by_customer', 'usage_daily', 'aggregates_current', 'invoice_lines', 'unbilled_events', 'source_daily'],
       'migration 004_analyst_tables.sql created derived tables on a database that holds data', 0, 1
FROM system.one
WHERE (SELECT count() FROM usage_events) + (SELECT count() FROM usage_aggregates) + (SELECT count() FROM usage_adjustments)
    + (SELECT count() FROM usage_duplicates) + (SELECT count() FROM usage_rejected) > 0;
