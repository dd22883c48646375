-- One table per topic (DESIGN §7). Every row carries the Kafka coordinates
-- of the record it came from: kafka_topic, kafka_partition, kafka_offset and
-- the record timestamp (kafka_timestamp, kafka_timestamp_ms). Every other
-- column is derived from the record alone, so a replayed row is
-- byte-identical to the first copy.
--
-- Sort key: (kafka_partition, intDiv(kafka_offset, 65536), <identity>...).
-- The sink's resume lookup ("which offsets >= the committed offset of this
-- partition are already in the table?") names kafka_partition and a range
-- of intDiv(kafka_offset, 65536), so the primary index bounds it to the
-- 65,536-offset chunks it touches, whatever the size of the table and
-- however fast data arrived. Within a chunk, rows are sorted by identity
-- (usage_events) or by aggregate key and revision (usage_aggregates). A
-- replayed row has the same partition and offset, hence the same chunk and
-- the same identity, so ReplacingMergeTree collapses it at merge time: a
-- backstop only (a zombie sink's in-flight INSERT); correctness comes from
-- the resume rule, and plain count() is exact without FINAL.
--
-- PARTITION BY month of the Kafka timestamp: old months can be dropped
-- (ALTER TABLE ... DROP PARTITION 202601), and one INSERT spanning a month
-- boundary writes one part per month.
--
-- Features used (present in ClickHouse 18.16 and current releases):
-- MergeTree-family CREATE TABLE IF NOT EXISTS with PARTITION BY / ORDER BY
-- expressions, ReplacingMergeTree, String, Int32, Int64, UInt8, DateTime,
-- Array(String), Nullable(String), toYYYYMM, intDiv.

CREATE TABLE IF NOT EXISTS usage_events (
    kafka_topic         String,
    kafka_partition     Int32,
    kafka_offset        Int64,
    kafka_timestamp     DateTime,
    kafka_timestamp_ms  Int64,
    event_id            String,
    customer_id         String,
    meter               String,
    quantity            Int64,
    event_time          DateTime,
    event_time_ms       Int64,
    source              String,
    property_names      Array(String),
    property_values     Array(String),
    ingest_time         DateTime,
    ingest_time_ms      Int64,
    source_partition    Int32,
    source_offset       Int64
) ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(kafka_timestamp)
ORDER BY (kafka_partition, intDiv(kafka_offset, 65536), customer_id, meter, event_id);

CREATE TABLE IF NOT EXISTS usage_aggregates (
    kafka_topic         String,
    kafka_partition     Int32,
    kafka_offset        Int64,
    kafka_timestamp     DateTime,
    kafka_timestamp_ms  Int64,
    customer_id         String,
    meter               String,
    group_key           String,
    group_names         Array(String),
    group_values        Array(String),
    aggregation         String,
    period_start        DateTime,
    period_end          DateTime,
    revision            Int64,
    status              String,
    value               Int64,
    event_count         Int64,
    first_event_time_ms Int64,
    last_event_time_ms  Int64,
    updated_at_ms       Int64
) ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(kafka_timestamp)
ORDER BY (kafka_partition, intDiv(kafka_offset, 65536), customer_id, meter, group_key, period_start, revision);

CREATE TABLE IF NOT EXISTS usage_adjustments (
    kafka_topic           String,
    kafka_partition       Int32,
    kafka_offset          Int64,
    kafka_timestamp       DateTime,
    kafka_timestamp_ms    Int64,
    event_id              String,
    customer_id           String,
    meter                 String,
    group_key             String,
    group_names           Array(String),
    group_values          Array(String),
    aggregation           String,
    original_period_start DateTime,
    original_period_end   DateTime,
    booked_period_start   DateTime,
    booked_period_end     DateTime,
    delta                 Int64,
    quantity              Int64,
    event_time            DateTime,
    event_time_ms         Int64,
    ingest_time           DateTime,
    ingest_time_ms        Int64
) ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(kafka_timestamp)
ORDER BY (kafka_partition, intDiv(kafka_offset, 65536), customer_id, meter, event_id);

CREATE TABLE IF NOT EXISTS usage_duplicates (
    kafka_topic           String,
    kafka_partition       Int32,
    kafka_offset          Int64,
    kafka_timestamp       DateTime,
    kafka_timestamp_ms    Int64,
    event_id              String,
    customer_id           String,
    meter                 String,
    source                String,
    conflict              UInt8,
    quantity              Int64,
    event_time            DateTime,
    event_time_ms         Int64,
    original_partition    Int32,
    original_offset       Int64,
    original_arrival_ms   Int64,
    duplicate_partition   Int32,
    duplicate_offset      Int64,
    duplicate_arrival     DateTime,
    duplicate_arrival_ms  Int64
) ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(kafka_timestamp)
ORDER BY (kafka_partition, intDiv(kafka_offset, 65536), customer_id, meter, event_id, duplicate_partition, duplicate_offset);

CREATE TABLE IF NOT EXISTS usage_rejected (
    kafka_topic          String,
    kafka_partition      Int32,
    kafka_offset         Int64,
    kafka_timestamp      DateTime,
    kafka_timestamp_ms   Int64,
    reason               String,
    detail               String,
    stage                String,
    source_topic         String,
    source_partition     Int32,
    source_offset        Int64,
    source_timestamp     DateTime,
    source_timestamp_ms  Int64,
    customer_id          String,
    meter                String,
    event_id             String,
    raw_key              Nullable(String),
    raw_value            Nullable(String)
) ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(kafka_timestamp)
ORDER BY (kafka_partition, intDiv(kafka_offset, 65536), source_topic, source_partition, source_offset);
