-- usage_balances: the records of usage.balances (DESIGN §12), one row per
-- balance the aggregator emitted: a customer's usage against each capped
-- meter in the current period, and what each grant has left. A ledger
-- table like those of 001_tables.sql: the Kafka coordinates first, sorted
-- by (kafka_partition, intDiv(kafka_offset, 65536), ...) for the sink's
-- resume lookup, every column derived from the record alone.
--
-- Maps are parallel arrays (18.16 has no Map): meter_names[i] has
-- meter_usage[i] of meter_limits[i]; grant_ids[i] has grant_remaining[i],
-- expiring at grant_expires_at[i] (1970-01-01 and 0 ms: never).
--
-- balances_current: the latest balance of every customer in each month of
-- its billing periods (the highest revision), derived by a materialized
-- view and read with FINAL (or argMax by revision). Partitioned by month
-- like the other analyst tables, so that `meterline verify` compares and
-- rebuilds it month by month and dropping old ledger months leaves it
-- intact; a customer's current balance is its row of the latest month
-- (ORDER BY customer_id, period_start DESC LIMIT 1 BY customer_id). Its
-- order is the analyst's: one customer's rows are found by the primary key
-- whatever the size of the ledger.
--
-- Features used (ClickHouse 18.16 and current releases): those of
-- 001_tables.sql, Array(Int32), Array(Int64), Array(DateTime),
-- ReplacingMergeTree(UInt64 version), CREATE MATERIALIZED VIEW IF NOT
-- EXISTS ... TO.

CREATE TABLE IF NOT EXISTS usage_balances (
    kafka_topic              String,
    kafka_partition          Int32,
    kafka_offset             Int64,
    kafka_timestamp          DateTime,
    kafka_timestamp_ms       Int64,
    customer_id              String,
    plan                     String,
    unmetered                UInt8,
    revision                 Int64,
    updated_at               DateTime,
    updated_at_ms            Int64,
    period_start             DateTime,
    period_end               DateTime,
    meter_names              Array(String),
    meter_usage              Array(Int64),
    meter_limits             Array(Int64),
    meter_on_limit           Array(String),
    grant_ids                Array(String),
    grant_priorities         Array(Int32),
    grant_effective_from_ms  Array(Int64),
    grant_expires_at         Array(DateTime),
    grant_expires_at_ms      Array(Int64),
    grant_amounts            Array(Int64),
    grant_consumed           Array(Int64),
    grant_remaining          Array(Int64),
    overdraft_policy         String,
    overdraft_limit          Int64,
    overdrawn                Int64
) ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(kafka_timestamp)
ORDER BY (kafka_partition, intDiv(kafka_offset, 65536), customer_id, revision);

CREATE TABLE IF NOT EXISTS balances_current (
    customer_id              String,
    revision                 UInt64,
    plan                     String,
    unmetered                UInt8,
    updated_at               DateTime,
    updated_at_ms            Int64,
    period_start             DateTime,
    period_end               DateTime,
    meter_names              Array(String),
    meter_usage              Array(Int64),
    meter_limits             Array(Int64),
    meter_on_limit           Array(String),
    grant_ids                Array(String),
    grant_priorities         Array(Int32),
    grant_effective_from_ms  Array(Int64),
    grant_expires_at         Array(DateTime),
    grant_expires_at_ms      Array(Int64),
    grant_amounts            Array(Int64),
    grant_consumed           Array(Int64),
    grant_remaining          Array(Int64),
    overdraft_policy         String,
    overdraft_limit          Int64,
    overdrawn                Int64,
    kafka_partition          Int32,
    kafka_offset             Int64
) ENGINE = ReplacingMergeTree(revision)
PARTITION BY toYYYYMM(period_start)
ORDER BY customer_id;

CREATE MATERIALIZED VIEW IF NOT EXISTS balances_current_mv TO balances_current AS
SELECT customer_id, toUInt64(revision) AS revision, plan, unmetered, updated_at, updated_at_ms, period_start, period_end,
       meter_names, meter_usage, meter_limits, meter_on_limit,
       grant_ids, grant_priorities, grant_effective_from_ms, grant_expires_at, grant_expires_at_ms,
       grant_amounts, grant_consumed, grant_remaining,
       overdraft_policy, overdraft_limit, overdrawn, kafka_partition, kafka_offset
FROM usage_balances;
