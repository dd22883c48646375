-- usage_daily's quantity is the sum of a customer's accepted quantities of
-- one meter and day, and each quantity may be up to MaxInt64 (producers are
-- untrusted; DESIGN §8: sums never wrap). In Int64 the sum wrapped, in its
-- view's GROUP BY and when SummingMergeTree merged parts, and the billable
-- usage by day read a wrapped number. The column becomes Decimal128(0): an
-- integer of up to 38 digits, exact for 2^64 events of MaxInt64, which
-- SummingMergeTree sums like any number; the view sums into it.
--
-- The view is replaced by dropping it and creating it again (with the
-- sinks stopped, as every migration runs); on a database that holds data,
-- a rebuild of usage_daily is recorded, since its rows may hold wrapped
-- sums: a sink refuses to start until `meterline verify --backfill` has
-- rewritten them. Every statement can run again.
--
-- Features used (ClickHouse 18.16 and current releases): Decimal128,
-- toDecimal128, ALTER TABLE ... MODIFY COLUMN, and those of
-- 006_compact_views.sql.

INSERT INTO meterline_rebuilds (run_id, recorded_at, tables, reason, finished, version)
SELECT 'backfill 012_usage_daily_wide_quantity.sql', now(), ['usage_daily'],
       'migration 012_usage_daily_wide_quantity.sql widened usage_daily.quantity, whose sums may have wrapped', 0, 1
FROM system.one
WHERE (SELECT count() FROM usage_events) > 0;

DROP TABLE IF EXISTS usage_daily_mv;

ALTER TABLE usage_daily MODIFY COLUMN quantity Decimal128(0);

CREATE MATERIALIZED VIEW IF NOT EXISTS usage_daily_mv TO usage_daily AS
SELECT customer_id, meter, toDate(event_time) AS day, count() AS events, sum(toDecimal128(quantity, 0)) AS quantity
FROM usage_events
GROUP BY customer_id, meter, day;
