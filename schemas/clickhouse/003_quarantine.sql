-- usage_quarantine: records of usage.rejected that the sink cannot write to
-- usage_rejected, because their value does not decode (reason undecodable
-- or unknown_schema) or because ClickHouse refused the row (uninsertable).
-- Rows of usage.rejected are never parked again (DESIGN §7), so without
-- this table such a record would be skipped and gone with the topic's
-- retention. Each row keeps the record whole: its Kafka coordinates, key,
-- value and headers, and why it is here (reason, a code of DESIGN §8, and
-- detail, the decoder's or the server's error).
--
-- Exactly once: the sink writes a record here before it commits the
-- offset past it, and first looks up its (topic, partition, offset), so a
-- crash between the two never writes it twice. A record of usage.rejected
-- is in usage_rejected or here, never both.
--
-- An operator reads it with, for example:
--   SELECT kafka_partition, kafka_offset, reason, detail, length(raw_value)
--   FROM usage_quarantine ORDER BY kafka_timestamp DESC LIMIT 20
--
-- Features used are those of 001_tables.sql (present in ClickHouse 18.16
-- and current releases).

CREATE TABLE IF NOT EXISTS usage_quarantine (
    kafka_topic         String,
    kafka_partition     Int32,
    kafka_offset        Int64,
    kafka_timestamp     DateTime,
    kafka_timestamp_ms  Int64,
    reason              String,
    detail              String,
    raw_key             Nullable(String),
    raw_value           Nullable(String),
    header_keys         Array(String),
    header_values       Array(String)
) ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(kafka_timestamp)
ORDER BY (kafka_partition, intDiv(kafka_offset, 65536), kafka_offset);
