package sink

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/internal/topics"
	"github.com/meterline/meterline/schemas"
	chschema "github.com/meterline/meterline/schemas/clickhouse"
)

// aggregatorRejections are rejections as the aggregator writes them
// (aggregator/output.go): of an event, with its customer, meter and event
// ID, and of records that are no event (an undecodable record of
// usage.deduped, a watermark too far ahead of its broker time, a record of
// usage.entitlements refused), with none. Two sink rejections come last.
func aggregatorRejections(names topics.Names) []*schemas.Rejected {
	ev := func(reason, id string, off int64) *schemas.Rejected {
		return &schemas.Rejected{Reason: reason, Stage: "aggregator", SourceTopic: names.DedupedTopic(), SourcePartition: 1, SourceOffset: off,
			CustomerID: "acme", Meter: "api_calls", EventID: id}
	}
	return []*schemas.Rejected{
		ev(schemas.ReasonOverLimit, "e1", 10),
		ev(schemas.ReasonInvalid, "e2", 11),
		{Reason: schemas.ReasonUndecodable, Stage: "aggregator", SourceTopic: names.DedupedTopic(), SourcePartition: 1, SourceOffset: 12},
		{Reason: schemas.ReasonInvalid, Stage: "aggregator", SourceTopic: names.DedupedTopic(), SourcePartition: 1, SourceOffset: 13,
			Detail: "watermark 2026-02-01T00:00:00Z is more than 1h0m0s after the record's broker time"},
		{Reason: schemas.ReasonInvalid, Stage: "aggregator", SourceTopic: names.EntitlementsTopic(), SourcePartition: 1, SourceOffset: 14},
		{Reason: schemas.ReasonUndecodable, Stage: "aggregator", SourceTopic: names.EntitlementsTopic(), SourcePartition: 2, SourceOffset: 15},
		{Reason: schemas.ReasonUninsertable, Stage: "sink", SourceTopic: names.DedupedTopic(), SourcePartition: 1, SourceOffset: 10,
			CustomerID: "acme", Meter: "api_calls", EventID: "e1"},
		{Reason: schemas.ReasonUndecodable, Stage: "sink", SourceTopic: names.DedupedTopic(), SourcePartition: 1, SourceOffset: 16},
	}
}

const unbilledMigration = "011_unbilled_events_only.sql"

const unbilledWant = "acme | api_calls | e1 | over_limit\nacme | api_calls | e2 | invalid\n"

// TestUnbilledEventsAreEvents writes the aggregator's rejections of
// events and of records that are no event through the sink: only the
// events are in unbilled_events, and verify finds the table equal to the
// ledger.
func TestUnbilledEventsAreEvents(t *testing.T) {
	w, conn, db, ctx := offlineWriter(t, "i1")
	names := testTopics()
	rt := w.byTopic[names.RejectedTopic()]
	var rows []*row
	for i, rej := range aggregatorRejections(names) {
		r, err := rt.buildRow(&kgo.Record{Topic: names.RejectedTopic(), Partition: 0, Offset: int64(100 + i), Value: schemas.MustEncode(rej), Timestamp: base})
		if err != nil {
			t.Fatal(err)
		}
		rows = append(rows, r)
	}
	if err := w.insert(ctx, rt, rows); err != nil {
		t.Fatal(err)
	}
	got := render(queryStrings(t, conn, "SELECT customer_id, meter, event_id, reason FROM "+db+".unbilled_events FINAL ORDER BY event_id"))
	if got != unbilledWant {
		t.Errorf("unbilled_events:\n%s\nwant\n%s", got, unbilledWant)
	}
	verifyEqual(ctx, t, conn, db, 202601)
}

// TestUnbilledEventsMigration migrates a database whose unbilled_events
// holds rejections of records that are no event (written by the view of
// 004_analyst_tables.sql): the migration that narrows the view deletes
// them, leaving only the events, without a rebuild that would hold up the
// sink; migrating again applies nothing.
func TestUnbilledEventsMigration(t *testing.T) {
	conn, db := testenv.ClickHouseDB(t)
	ctx := ctxT(t, 5*time.Minute)
	migrateUpTo(ctx, t, conn, unbilledMigration)
	if err := conn.Exec(ctx, rejectedInsert(db, 100)); err != nil {
		t.Fatal(err)
	}
	unbilled := func() string {
		return render(queryStrings(t, conn, "SELECT customer_id, meter, event_id, reason FROM "+db+".unbilled_events FINAL ORDER BY event_id, source_offset"))
	}
	if n := strings.Count(unbilled(), "\n"); n <= 2 {
		t.Fatalf("before the migration, unbilled_events holds %d rows: want the rejections that are no event too", n)
	}
	if _, err := Migrate(ctx, conn); err != nil {
		t.Fatal(err)
	}
	// The migration deletes the rows of records that are no event by a
	// mutation, which the server does in the background; it records no
	// rebuild, so a sink starts at once.
	for deadline := time.Now().Add(time.Minute); unbilled() != unbilledWant; {
		if time.Now().After(deadline) {
			t.Fatalf("unbilled_events a minute after the migration:\n%s\nwant\n%s", unbilled(), unbilledWant)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if runs, err := unfinishedRebuilds(ctx, conn, db); err != nil || len(runs) != 0 {
		t.Errorf("unfinished rebuilds after the migration: %v, %v; want none", runs, err)
	}
	verifyEqual(ctx, t, conn, db, 202601)
	res, err := Migrate(ctx, conn)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range res {
		if m.Applied {
			t.Errorf("second migrate applied %s", m.Migration.Name)
		}
	}
}

// rejectedInsert inserts aggregatorRejections into db's usage_rejected as
// the sink writes them, at offsets from off of usage.rejected.
func rejectedInsert(db string, off int) string {
	names := testTopics()
	var vals []string
	for i, r := range aggregatorRejections(names) {
		vals = append(vals, fmt.Sprintf("SELECT '%s' AS t, toInt32(0) AS p, toInt64(%[2]d) AS o, toDateTime('2026-01-31 23:00:00') AS ts, toInt64(1769900400000) AS ms, "+
			"'%s' AS re, '%s' AS st, '%s' AS sto, toInt32(%d) AS sp, toInt64(%d) AS so, '%s' AS c, '%s' AS m, '%s' AS e, toInt64(%[2]d) AS ro",
			names.RejectedTopic(), off+i, r.Reason, r.Stage, r.SourceTopic, r.SourcePartition, r.SourceOffset, r.CustomerID, r.Meter, r.EventID))
	}
	return "INSERT INTO " + db + ".usage_rejected (kafka_topic, kafka_partition, kafka_offset, kafka_timestamp, kafka_timestamp_ms, reason, stage, " +
		"source_topic, source_partition, source_offset, customer_id, meter, event_id, record_offset) SELECT * FROM (" + strings.Join(vals, " UNION ALL ") + ")"
}

// TestUnbilledEventsMigrationOnChdb runs the migration on current
// ClickHouse (chdb, 26.x) as on 18.16: twice, on a database whose
// unbilled_events holds rejections that are no event. It records no
// rebuild, deletes those rows, and the rejections written after it reach
// unbilled_events only when they are of events.
func TestUnbilledEventsMigrationOnChdb(t *testing.T) {
	python := testenv.Chdb(t)
	ms, err := chschema.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	var stmts []string
	var last chschema.Migration
	for _, m := range ms {
		if m.Name == unbilledMigration {
			last = m
			break
		}
		stmts = append(stmts, m.Statements...)
	}
	if last.Name == "" {
		t.Fatalf("no migration %s", unbilledMigration)
	}
	const db = "unbilled"
	// The delete is a mutation: chdb does it before the next statement
	// with mutations_sync (18.16 has no such setting; the test on it waits).
	stmts = append(stmts, rejectedInsert(db, 100), "SET mutations_sync = 1")
	stmts = append(append(stmts, last.Statements...), last.Statements...)
	stmts = append(stmts, rejectedInsert(db, 200))
	resp, err := runChdb(ctxT(t, 5*time.Minute), python, chdbRequest{Path: t.TempDir(), Database: db, Statements: stmts, Queries: []string{
		"SELECT count() FROM meterline_rebuilds FINAL WHERE has(tables, 'unbilled_events') AND run_id LIKE '%" + unbilledMigration + "%'",
		"SELECT customer_id, meter, event_id, reason FROM unbilled_events FINAL WHERE kafka_offset >= 200 ORDER BY event_id",
		"SELECT count() FROM unbilled_events WHERE kafka_offset < 200",
	}})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"0\n", "acme\tapi_calls\te1\tover_limit\nacme\tapi_calls\te2\tinvalid\n", "2\n"}
	if len(resp.Results) != len(want) {
		t.Fatalf("chdb %s answered %d queries of %d", resp.Version, len(resp.Results), len(want))
	}
	for i, w := range want {
		if resp.Results[i] != w {
			t.Errorf("chdb %s, query %d: %q, want %q", resp.Version, i, resp.Results[i], w)
		}
	}
}
