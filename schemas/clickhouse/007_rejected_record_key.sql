-- usage_rejected's sort key names a row by the source record it is about
-- (source_topic, source_partition, source_offset), and two records of
-- usage.rejected can be about one source record: the aggregator rejects
-- an event of usage.deduped (over_limit, or a record it cannot decode) and
-- the sink parks the same record (uninsertable, or undecodable). In one
-- partition and 65,536-offset chunk of usage.rejected, ReplacingMergeTree
-- kept one of the two at the next merge: a rejection vanished from the
-- ledger, and verify then took an unbilled event out of unbilled_events.
--
-- record_offset (the record's own kafka_offset, written by the sink) ends
-- the sort key, so only a replayed record (same partition and offset)
-- collapses. Rows written before this migration read 0 there and keep the
-- old collapsing among themselves. 18.16 adds a column to the sort key
-- only in the ALTER that adds it, and only without a default: one
-- statement, applied whole or not at all (the migrator counts it as
-- applied when the column and the sort key are already there).
ALTER TABLE usage_rejected
    ADD COLUMN record_offset Int64,
    MODIFY ORDER BY (kafka_partition, intDiv(kafka_offset, 65536), source_topic, source_partition, source_offset, record_offset);
