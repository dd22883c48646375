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
-- The view is replaced by dropping it and creating it again, and the rows
-- it wrote before are removed by rebuilding the table from the ledger: on
-- a database that holds rejections of the aggregator this migration
-- records a backfill of unbilled_events (as 006_compact_views.sql does),
-- and a sink refuses to start until `meterline verify --backfill` has
-- rebuilt it through the new view. Every statement can run again.

INSERT INTO meterline_rebuilds (run_id, recorded_at, tables, reason, finished, version)
SELECT 'backfill 011_unbilled_events_only.sql', now(),
       ['unbilled_events'],
       'migration 011_unbilled_events_only.sql replaced the view of unbilled_events on a database that holds rejections of the aggregator', 0, 1
FROM system.one
WHERE (SELECT count() FROM usage_rejected WHERE stage = 'aggregator') > 0;

DROP TABLE IF EXISTS unbilled_events_mv;

CREATE MATERIALIZED VIEW IF NOT EXISTS unbilled_events_mv TO unbilled_events AS
SELECT customer_id, meter, event_id, source_partition, source_offset, reason, detail,
       kafka_timestamp, kafka_partition, kafka_offset
FROM usage_rejected
WHERE stage = 'aggregator' AND event_id != '';
