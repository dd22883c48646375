-- sink_progress: how far the sink's ledger tables reflect each Kafka
-- partition (DESIGN §6.6 and §7). At the end of every commit window, after
-- the window's rows are in their tables and before the Kafka transaction
-- commits the group's offsets, the sink writes one row per partition of
-- the window: the offset it is about to commit (after a refused row: just
-- past its parked row). The recorded progress of a partition is
-- max(next_offset); ReplacingMergeTree keeps that row when parts merge.
--
-- On assignment the sink compares it with the group's committed offset. A
-- committed offset above the progress (or, with no progress, above the
-- partition's log start offset) means the offsets are ahead of this
-- database: records in between are in no table. The sink stops and names
-- the partition instead of skipping them (docs/operations.md, "Committed
-- offsets ahead of the database"). Progress at or above the committed
-- offset is normal (a crash between this insert and the commit).
--
-- A row with an empty consumer_group and kafka_topic is the adoption
-- marker: this database held ledger rows when the table was created (an
-- existing deployment), so a partition without progress accepts the
-- group's committed offset once, and has progress from its next window.
-- A database created empty has no marker.
--
-- Features used (ClickHouse 18.16 and current releases): those of
-- 001_tables.sql, ReplacingMergeTree(UInt64 version), INSERT ... SELECT.

CREATE TABLE IF NOT EXISTS sink_progress (
    consumer_group   String,
    kafka_topic      String,
    kafka_partition  Int32,
    next_offset      UInt64,
    written_at       DateTime
) ENGINE = ReplacingMergeTree(next_offset)
ORDER BY (consumer_group, kafka_topic, kafka_partition);

INSERT INTO sink_progress (consumer_group, kafka_topic, kafka_partition, next_offset, written_at)
SELECT '', '', 0, 0, now()
FROM (
    SELECT (SELECT count() FROM usage_events) + (SELECT count() FROM usage_aggregates)
         + (SELECT count() FROM usage_adjustments) + (SELECT count() FROM usage_duplicates)
         + (SELECT count() FROM usage_rejected) + (SELECT count() FROM usage_quarantine)
         + (SELECT count() FROM usage_balances) AS ledger_rows
)
WHERE ledger_rows > 0;
