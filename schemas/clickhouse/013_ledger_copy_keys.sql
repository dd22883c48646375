-- Two accepted copies of one identity are two events (a conflicting copy
-- read after its original's dedup key expired, docs/design.md "Known
-- limits"), and the aggregator bills both. The sort keys of usage_events
-- and usage_adjustments named a row by partition, offset chunk and
-- identity: two such copies within 65,536 offsets of one partition (a
-- quiet partition) had one key, and ReplacingMergeTree kept one of them at
-- the next merge and in FINAL reads. events_by_customer (customer, meter,
-- event_time, event_id) collapsed copies with one event time, and
-- invoice_lines (period, customer, meter, group, line_kind, event_id)
-- collapsed late copies booked into one period: an adjustment the
-- aggregator billed vanished from the invoice.
--
-- The ledger tables end their sort key with record_offset, the record's
-- own kafka_offset (written by the sink), as usage_rejected does
-- (007_rejected_record_key.sql); the partition is in the key already. The
-- two derived tables end theirs with record_partition and record_offset,
-- the coordinates of the ledger row they come from, written by their
-- views. Only a replayed record (same partition and offset) collapses.
-- 18.16 adds a column to the sort key only in the ALTER that adds it, and
-- only without a default: one ALTER per table, applied whole or not at
-- all (the migrator counts it as applied when the columns and the sort
-- key are already there). Rows written before this migration read 0 in
-- the new columns and keep the old collapsing among themselves.
--
-- A view writes a column only if it selects it, so the views of the two
-- derived tables are dropped and created again (with the sinks stopped,
-- as every migration runs), as in 012_usage_daily_wide_quantity.sql. No
-- rebuild is recorded: every row of the derived tables is right for its
-- key (the new columns only split keys, they never merge rows), so sinks
-- may start at once. A month where copies were collapsed already in a
-- derived table but not in the ledger is one `meterline verify` reports
-- as differing; its rebuild writes the copies apart through the new
-- views. Copies the ledger collapsed already are gone from ClickHouse.
-- Every statement can run again.
--
-- Features used (ClickHouse 18.16 and current releases): ALTER TABLE ...
-- ADD COLUMN, MODIFY ORDER BY, and those of 004_analyst_tables.sql and
-- 006_compact_views.sql.

ALTER TABLE usage_events
    ADD COLUMN record_offset Int64,
    MODIFY ORDER BY (kafka_partition, intDiv(kafka_offset, 65536), customer_id, meter, event_id, record_offset);

ALTER TABLE usage_adjustments
    ADD COLUMN record_offset Int64,
    MODIFY ORDER BY (kafka_partition, intDiv(kafka_offset, 65536), customer_id, meter, event_id, record_offset);

DROP TABLE IF EXISTS events_by_customer_mv;

ALTER TABLE events_by_customer
    ADD COLUMN record_partition Int32,
    ADD COLUMN record_offset Int64,
    MODIFY ORDER BY (customer_id, meter, event_time, event_id, record_partition, record_offset);

CREATE MATERIALIZED VIEW IF NOT EXISTS events_by_customer_mv TO events_by_customer AS
SELECT customer_id, meter, event_time, event_id, event_time_ms, quantity, source,
       property_names, property_values, ingest_time, ingest_time_ms, kafka_partition, kafka_offset,
       kafka_partition AS record_partition, kafka_offset AS record_offset
FROM usage_events;

DROP TABLE IF EXISTS invoice_lines_usage_mv;

DROP TABLE IF EXISTS invoice_lines_adjustments_mv;

ALTER TABLE invoice_lines
    ADD COLUMN record_partition Int32,
    ADD COLUMN record_offset Int64,
    MODIFY ORDER BY (period_start, customer_id, meter, group_key, line_kind, event_id, record_partition, record_offset);

CREATE MATERIALIZED VIEW IF NOT EXISTS invoice_lines_usage_mv TO invoice_lines AS
SELECT period_start, customer_id, meter, group_key, 'usage' AS line_kind, '' AS event_id,
       period_end, aggregation, toUInt64(revision) AS revision, status,
       value, toInt64(0) AS delta, period_start AS original_period_start,
       toInt32(0) AS record_partition, toInt64(0) AS record_offset
FROM usage_aggregates
ORDER BY revision DESC
LIMIT 1 BY period_start, customer_id, meter, group_key;

CREATE MATERIALIZED VIEW IF NOT EXISTS invoice_lines_adjustments_mv TO invoice_lines AS
SELECT booked_period_start AS period_start, customer_id, meter, group_key, 'adjustment' AS line_kind, event_id,
       booked_period_end AS period_end, aggregation, toUInt64(0) AS revision, '' AS status,
       toInt64(0) AS value, delta, original_period_start,
       kafka_partition AS record_partition, kafka_offset AS record_offset
FROM usage_adjustments;
