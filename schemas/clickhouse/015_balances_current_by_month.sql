-- balances_current keeps the latest balance of each customer in each month
-- of its billing periods (docs/entitlements.md, Balances in ClickHouse),
-- read with FINAL. Its sort key was customer_id alone, and FINAL collapses
-- rows of one sort key across partitions as well as within them, on
-- ClickHouse 18.16 and on current releases alike: a customer's balances of
-- earlier months vanished from every read with FINAL whose WHERE did not
-- exclude the later months' partitions (December's overdraft once
-- January's first balance was out), and `meterline verify` found every
-- such month to differ from the ledger, rebuilt it, and found it to differ
-- again. The sort key becomes (customer_id, period_start): still one
-- customer's rows first, one row per customer and billing period under
-- FINAL (a month by default).
--
-- ClickHouse cannot change a table's sort key in place, so the view and
-- the table are dropped and created again; on a database that holds
-- balances this migration records a rebuild of the table, and a sink
-- refuses to start until `meterline verify --backfill` has rewritten it
-- from usage_balances. Every statement can run again: the rebuild is
-- recorded one version above the run's latest record, so that a run again
-- after a backfill finished it (the table it rebuilt is dropped again)
-- leaves it unfinished, as the first run did.
--
-- Features used (ClickHouse 18.16 and current releases): those of
-- 005_balances.sql and 006_compact_views.sql.

INSERT INTO meterline_rebuilds (run_id, recorded_at, tables, reason, finished, version)
SELECT 'backfill 015_balances_current_by_month.sql', now(), ['balances_current'],
       'migration 015_balances_current_by_month.sql created balances_current again with the sort key (customer_id, period_start)', 0,
       (SELECT max(version) FROM meterline_rebuilds WHERE run_id = 'backfill 015_balances_current_by_month.sql') + 1
FROM system.one
WHERE (SELECT count() FROM usage_balances) > 0;

DROP TABLE IF EXISTS balances_current_mv;

DROP TABLE IF EXISTS balances_current;

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
ORDER BY (customer_id, period_start);

CREATE MATERIALIZED VIEW IF NOT EXISTS balances_current_mv TO balances_current AS
SELECT customer_id, toUInt64(revision) AS revision, plan, unmetered, updated_at, updated_at_ms, period_start, period_end,
       meter_names, meter_usage, meter_limits, meter_on_limit,
       grant_ids, grant_priorities, grant_effective_from_ms, grant_expires_at, grant_expires_at_ms,
       grant_amounts, grant_consumed, grant_remaining,
       overdraft_policy, overdraft_limit, overdrawn, kafka_partition, kafka_offset
FROM usage_balances;
