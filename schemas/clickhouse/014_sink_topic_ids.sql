-- sink_topic_ids: the Kafka topic ID of each input topic whose records
-- this database holds. The ledger tables and sink_progress name a record
-- by (kafka_topic, kafka_partition, kafka_offset), and the resume rule
-- skips a record whose coordinates are in a table. A topic deleted and
-- created again under its name (a broker's data wiped, topics recreated
-- at another partition count) is another log whose offsets start at 0
-- again: its records at offsets the old log wrote would be skipped as
-- present. The sink records a topic's ID the first time it is assigned
-- a partition of it, and refuses a topic whose ID is another than the
-- one recorded, before it uses any record of it (docs/operations.md,
-- Outages). A broker without topic IDs records nothing.
--
-- Features used (ClickHouse 18.16 and current releases): those of
-- 001_tables.sql.

CREATE TABLE IF NOT EXISTS sink_topic_ids (
    kafka_topic  String,
    topic_id     String,
    recorded_at  DateTime
) ENGINE = ReplacingMergeTree
ORDER BY (kafka_topic, topic_id);
