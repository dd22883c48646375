-- usage.balances records carry caps_until (docs/entitlements.md, Balances
-- in ClickHouse): the broker time from which the balance's caps and
-- unmetered are no longer those in effect, by the entitlements records
-- the aggregator had read (a version scheduled for later, or the default
-- plan's); 0: no such change known. No balance is written when such a
-- change takes effect, only at the customer's next change, so a query of
-- caps over balances_current needs it to leave out caps that have
-- expired. usage_balances and balances_current get it as the other
-- broker times: caps_until (DateTime, whole seconds, at the nearest end
-- of DateTime's range) and caps_until_ms (exact); 0 and 1970-01-01: none.
--
-- 18.16 has no IF NOT EXISTS on ALTER ... ADD COLUMN: one ALTER per
-- table, applied whole or not at all (the migrator counts it as applied
-- when its columns are already there). Rows written before this migration
-- read 0 in the new columns, as balances written before the field do.
-- The view writes a column only if it selects it, so it is dropped and
-- created again (with the sinks stopped, as every migration runs), the
-- new columns last, in the table's order (a rebuild fills a copy of the
-- table with the view's SELECT). No rebuild is recorded: every row of
-- balances_current stays right (0 in both tables), so sinks may start at
-- once. Every statement can run again.
--
-- Features used (ClickHouse 18.16 and current releases): ALTER TABLE ...
-- ADD COLUMN, and those of 005_balances.sql.

ALTER TABLE usage_balances
    ADD COLUMN caps_until DateTime,
    ADD COLUMN caps_until_ms Int64;

DROP TABLE IF EXISTS balances_current_mv;

ALTER TABLE balances_current
    ADD COLUMN caps_until DateTime,
    ADD COLUMN caps_until_ms Int64;

CREATE MATERIALIZED VIEW IF NOT EXISTS balances_current_mv TO balances_current AS
SELECT customer_id, toUInt64(revision) AS revision, plan, unmetered, updated_at, updated_at_ms, period_start, period_end,
       meter_names, meter_usage, meter_limits, meter_on_limit,
       grant_ids, grant_priorities, grant_effective_from_ms, grant_expires_at, grant_expires_at_ms,
       grant_amounts, grant_consumed, grant_remaining,
       overdraft_policy, overdraft_limit, overdrawn, kafka_partition, kafka_offset,
       caps_until, caps_until_ms
FROM usage_balances;
