-- sink_offset_skips: records a group's Kafka offsets moved past what the
-- database holds, accepted on purpose by `meterline sink accept-offsets`
-- (docs/operations.md, "Committed offsets ahead of the database"). One row
-- per partition and acceptance: records from_offset .. to_offset - 1 of
-- the partition are in no table of this database. from_offset is the
-- partition's recorded progress in sink_progress before the acceptance,
-- or, with none recorded (had_progress = 0), its log start offset then;
-- progress_group names the group that recorded that progress when it was
-- another one (a database written under another group name), else ''.
-- The same command then writes to_offset into sink_progress, so the sink
-- starts; this table is what an analyst reads to see the gap later.
--
-- Features used (ClickHouse 18.16 and current releases): those of
-- 001_tables.sql.

CREATE TABLE IF NOT EXISTS sink_offset_skips (
    consumer_group   String,
    kafka_topic      String,
    kafka_partition  Int32,
    from_offset      UInt64,
    to_offset        UInt64,
    had_progress     UInt8,
    progress_group   String,
    accepted_at      DateTime,
    accepted_by      String
) ENGINE = MergeTree
ORDER BY (consumer_group, kafka_topic, kafka_partition, accepted_at);
