-- unbilled_events holds the events dedup accepted that the aggregator
-- rejected. Its view of 004_analyst_tables.sql took every rejection of
-- stage 'aggregator', and the aggregator also rejects records that are no
-- event: a record of usage.deduped it cannot decode, a watermark or a
-- record of another kind, a record of usage.entitlements it refuses. Those
-- rows had an empty customer_id, meter and event_id, and counted as
-- unbilled events in the table's months.
--
-- The aggregator names the event (customer_id, meter, event_id) in a
-- rejection exactly when the rejected record is an event
-- (aggregator/output.go), and every event dedup accepts has a non-empty
-- event_id (schemas.UsageEvent.Validate). The view keeps those rows. The
-- source topic would not do: its name has the deployment's prefix, and the
-- reason codes would not either: invalid and undecodable apply to events
-- and to other records alike.
--
-- The view is replaced by dropping it and creating it again (with the
-- sinks stopped, as every migration runs), and then the rows it wrote of
-- records that are no event are deleted: a mutation (ALTER ... DELETE,
-- which 18.16 has), done by the server in the background, that matches
-- only rows with an empty event_id, which no row of an event has. Every
-- statement can run again: the delete then matches nothing.

DROP TABLE IF EXISTS unbilled_events_mv;

CREATE MATERIALIZED VIEW IF NOT EXISTS unbilled_events_mv TO unbilled_events AS
SELECT customer_id, meter, event_id, source_partition, source_offset, reason, detail,
       kafka_timestamp, kafka_partition, kafka_offset
FROM usage_rejected
WHERE stage = 'aggregator' AND event_id != '';

ALTER TABLE unbilled_events DELETE WHERE event_id = '';
