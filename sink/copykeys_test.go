package sink

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/internal/kafka"
	"github.com/meterline/meterline/internal/session"
	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/schemas"
	chschema "github.com/meterline/meterline/schemas/clickhouse"
)

// Two accepted copies of one identity (a conflicting copy read after its
// original's dedup key expired, docs/design.md "Known limits") are two
// events the aggregator bills, and two late copies two adjustments. Only a
// replayed record (same partition and offset) may collapse
// (013_ledger_copy_keys.sql).

const copyKeysMigration = "013_ledger_copy_keys.sql"

// copyEvent is acme's api_calls event id at offset off of usage.deduped's
// partition 0, at 2024-01-10 09:00 (every copy has that event time),
// arriving at the broker at arrival.
func copyEvent(off int64, id string, q int64, arrival string) *kgo.Record {
	ts, _ := time.Parse(time.DateTime, arrival)
	et := time.Date(2024, 1, 10, 9, 0, 0, 0, time.UTC).UnixMilli()
	e := &schemas.DedupedEvent{EventID: id, CustomerID: "acme", Meter: "api_calls", Quantity: q, EventTime: et, Source: "gw",
		IngestTime: ts.UnixMilli(), SourcePartition: 0, SourceOffset: off}
	return &kgo.Record{Topic: testTopics().DedupedTopic(), Partition: 0, Offset: off, Key: []byte("acme/api_calls"),
		Value: schemas.MustEncode(e), Timestamp: ts}
}

// copyAdjustment is a late copy of acme's event id from January 2024,
// booked into February, at offset off of usage.adjustments' partition 0.
func copyAdjustment(off int64, id string, delta int64, arrival string) *kgo.Record {
	ts, _ := time.Parse(time.DateTime, arrival)
	ms := func(s string) int64 { t, _ := time.Parse(time.DateTime, s); return t.UnixMilli() }
	a := &schemas.Adjustment{EventID: id, CustomerID: "acme", Meter: "api_calls", Aggregation: "SUM",
		OriginalPeriodStart: ms("2024-01-01 00:00:00"), OriginalPeriodEnd: ms("2024-02-01 00:00:00"),
		BookedPeriodStart: ms("2024-02-01 00:00:00"), BookedPeriodEnd: ms("2024-03-01 00:00:00"),
		Delta: delta, Quantity: delta, EventTime: ms("2024-01-10 09:00:00"), IngestTime: ts.UnixMilli()}
	return &kgo.Record{Topic: testTopics().AdjustmentsTopic(), Partition: 0, Offset: off, Key: []byte("acme/api_calls"),
		Value: schemas.MustEncode(a), Timestamp: ts}
}

// twoAcceptedCopies: "dup" accepted twice, at offsets 100 and 40,100 of
// one partition (one 65,536-offset chunk), with the same event time and
// another quantity; "dup" booked late twice into February, at offsets 7
// and 9,000, with another delta, the first copy replayed (a zombie sink's
// INSERT). Each slice is one INSERT.
func twoAcceptedCopies() [][]*kgo.Record {
	return [][]*kgo.Record{
		{copyEvent(100, "dup", 5, "2024-01-10 09:01:00")},
		{copyEvent(40100, "dup", 7, "2024-01-12 18:00:00")},
		{copyAdjustment(7, "dup", 5, "2024-02-03 10:00:00")},
		{copyAdjustment(9000, "dup", 7, "2024-02-05 10:00:00")},
		{copyAdjustment(7, "dup", 5, "2024-02-03 10:00:00")},
	}
}

// copyTables are the tables that held one row of a copy each.
var copyTables = []string{TableEvents, TableAdjustments, TableEventsByCustomer, TableInvoiceLines}

// optimizeCopies forces the merges of copyTables' parts.
func optimizeCopies(db string) []string {
	var out []string
	for _, tb := range copyTables {
		out = append(out, "OPTIMIZE TABLE "+db+"."+tb+" FINAL")
	}
	return out
}

// copiesQuery: per table of copyTables (invoice_lines' adjustment lines),
// its rows after the merges, its rows read with FINAL, and the sum of
// their quantity (delta), TabSeparated on one line.
func copiesQuery(db string) string {
	var cols []string
	for _, tb := range copyTables {
		sum, where := "quantity", ""
		if tb == TableAdjustments || tb == TableInvoiceLines {
			sum = "delta"
		}
		if tb == TableInvoiceLines {
			where = " WHERE line_kind = 'adjustment'"
		}
		cols = append(cols, fmt.Sprintf("(SELECT count() FROM %[1]s.%[2]s%[3]s), (SELECT count() FROM %[1]s.%[2]s FINAL%[3]s), "+
			"(SELECT sum(%[4]s) FROM %[1]s.%[2]s FINAL%[3]s)", db, tb, where, sum))
	}
	return "SELECT " + strings.Join(cols, ", ")
}

// twoCopiesKept: both copies in every table, 5 + 7 each.
const twoCopiesKept = "2\t2\t12\t2\t2\t12\t2\t2\t12\t2\t2\t12\n"

// writeThroughSink writes each batch with the sink's INSERT (Writer.insert).
func writeThroughSink(ctx context.Context, t *testing.T, conn driver.Conn, db string, batches [][]*kgo.Record) {
	t.Helper()
	w, err := New(Config{Config: session.Config{Kafka: kafka.Config{Brokers: []string{"unused:9092"}}, InstanceID: "copies"},
		Topics: testTopics(), Conn: conn, Database: db})
	if err != nil {
		t.Fatal(err)
	}
	for _, recs := range batches {
		tb := w.byTopic[recs[0].Topic]
		var rows []*row
		for _, r := range recs {
			rw, err := tb.buildRow(r)
			if err != nil {
				t.Fatal(err)
			}
			rows = append(rows, rw)
		}
		if err := w.insert(ctx, tb, rows); err != nil {
			t.Fatal(err)
		}
	}
}

// sinkValues returns the sink's INSERT of each batch with its values
// inline (for chdb, which the driver does not reach): the columns the
// sink writes and the values it writes in them.
func sinkValues(t *testing.T, db string, batches [][]*kgo.Record) []string {
	t.Helper()
	byTopic := map[string]*table{}
	for _, tb := range newTables(testTopics()) {
		byTopic[tb.topic] = tb
	}
	var out []string
	for _, recs := range batches {
		tb := byTopic[recs[0].Topic]
		var tuples []string
		for _, r := range recs {
			rw, err := tb.buildRow(r)
			if err != nil {
				t.Fatal(err)
			}
			vals := make([]string, len(tb.columns))
			for i, c := range tb.columns {
				vals[i] = sqlLiteral(t, c.value(rw))
			}
			tuples = append(tuples, "("+strings.Join(vals, ", ")+")")
		}
		out = append(out, tb.insertSQL(db)+" VALUES "+strings.Join(tuples, ", "))
	}
	return out
}

func intsLiteral[T int32 | int64](v []T) string {
	q := make([]string, len(v))
	for i, n := range v {
		q[i] = fmt.Sprint(n)
	}
	return "[" + strings.Join(q, ", ") + "]"
}

func sqlLiteral(t *testing.T, v any) string {
	str := func(s string) string { return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(s) + "'" }
	switch v := v.(type) {
	case string:
		return str(v)
	case *string:
		if v == nil {
			return "NULL"
		}
		return str(*v)
	case []string:
		q := make([]string, len(v))
		for i, s := range v {
			q[i] = str(s)
		}
		return "[" + strings.Join(q, ", ") + "]"
	case int32, int64, uint8:
		return fmt.Sprint(v)
	case []int32:
		return intsLiteral(v)
	case []int64:
		return intsLiteral(v)
	}
	t.Fatalf("no literal for %T", v)
	return ""
}

// TestTwoAcceptedCopiesKept: on ClickHouse 18.16, both accepted copies of
// one identity stay in usage_events and events_by_customer, and both late
// copies in usage_adjustments and invoice_lines, after merges, written by
// the sink; the replayed adjustment collapses; verify finds every month
// equal.
func TestTwoAcceptedCopiesKept(t *testing.T) {
	conn, db := testenv.ClickHouseDB(t)
	ctx := ctxT(t, 5*time.Minute)
	if _, err := Migrate(ctx, conn); err != nil {
		t.Fatal(err)
	}
	writeThroughSink(ctx, t, conn, db, twoAcceptedCopies())
	for _, s := range optimizeCopies(db) {
		if err := conn.Exec(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	got, err := tsv(ctx, conn, copiesQuery(db))
	if err != nil {
		t.Fatal(err)
	}
	if got != twoCopiesKept {
		t.Errorf("rows, FINAL rows and sums of %v on 18.16:\n%q\nwant\n%q", copyTables, got, twoCopiesKept)
	}
	verifyEqual(ctx, t, conn, db, 202401)
}

// TestTwoAcceptedCopiesKeptOnChdb is TestTwoAcceptedCopiesKept on current
// ClickHouse (chdb, 26.x), verify's measures compared as verify does.
func TestTwoAcceptedCopiesKeptOnChdb(t *testing.T) {
	python := testenv.Chdb(t)
	const db = "copies"
	stmts := append(migrationStatements(t), sinkValues(t, db, twoAcceptedCopies())...)
	stmts = append(stmts, optimizeCopies(db)...)
	resp, ds := chdbMeasures(t, python, db, stmts, []string{copiesQuery(db)})
	if resp.Results[0] != twoCopiesKept {
		t.Errorf("rows, FINAL rows and sums of %v on chdb %s:\n%q\nwant\n%q", copyTables, resp.Version, resp.Results[0], twoCopiesKept)
	}
	for i, d := range ds {
		if led, der := resp.Results[1+2*i], resp.Results[2+2*i]; led != der {
			t.Errorf("verify's measures of %s on chdb %s differ:\nledger  %q\nderived %q", d.Name, resp.Version, led, der)
		}
	}
}

// Before 013: rows as the sink wrote them then (no record_offset), "a" and
// its replay (a zombie sink's INSERT, byte-identical) and "b", in
// usage_events and usage_adjustments, each row its own INSERT.
func oldCopyInserts(db string) []string {
	ev := func(off int, id string, q int) string {
		return fmt.Sprintf("INSERT INTO %s.usage_events (kafka_topic, kafka_partition, kafka_offset, kafka_timestamp, event_id, customer_id, meter, "+
			"quantity, event_time, ingest_time, source) SELECT 'usage.deduped', toInt32(0), toInt64(%d), toDateTime('2024-01-10 09:01:00'), '%s', "+
			"'acme', 'api_calls', toInt64(%d), toDateTime('2024-01-10 09:00:00'), toDateTime('2024-01-10 09:01:00'), 'gw'", db, off, id, q)
	}
	adj := func(off int, id string, d int) string {
		return fmt.Sprintf("INSERT INTO %s.usage_adjustments (kafka_topic, kafka_partition, kafka_offset, kafka_timestamp, event_id, customer_id, meter, "+
			"aggregation, original_period_start, original_period_end, booked_period_start, booked_period_end, delta, quantity, event_time) "+
			"SELECT 'usage.adjustments', toInt32(0), toInt64(%d), toDateTime('2024-02-03 10:00:00'), '%s', 'acme', 'api_calls', 'SUM', "+
			"toDateTime('2024-01-01 00:00:00'), toDateTime('2024-02-01 00:00:00'), toDateTime('2024-02-01 00:00:00'), toDateTime('2024-03-01 00:00:00'), "+
			"toInt64(%d), toInt64(%d), toDateTime('2024-01-10 09:00:00')", db, off, id, d, d)
	}
	return []string{ev(10, "a", 5), ev(10, "a", 5), ev(11, "b", 1), adj(3, "a", 5), adj(3, "a", 5), adj(4, "b", 1)}
}

// After 013, written by the sink: a second accepted copy of "a" (offset
// 20, same event time) and its replay, and a second late copy of "a"
// (offset 5) and its replay.
func newCopyBatches() [][]*kgo.Record {
	return [][]*kgo.Record{
		{copyEvent(20, "a", 7, "2024-01-10 09:02:00")},
		{copyEvent(20, "a", 7, "2024-01-10 09:02:00")},
		{copyAdjustment(5, "a", 7, "2024-02-03 10:05:00")},
		{copyAdjustment(5, "a", 7, "2024-02-03 10:05:00")},
	}
}

// copyMigrationQueries: the rows after the merges (the replays collapsed,
// the new copy kept), and where the rows of usage_events and
// events_by_customer are, by their new columns.
func copyMigrationQueries(db string) []string {
	return []string{copiesQuery(db),
		"SELECT event_id, kafka_offset, record_offset FROM " + db + ".usage_events FINAL ORDER BY kafka_offset",
		"SELECT event_id, kafka_offset, record_partition, record_offset FROM " + db + ".events_by_customer FINAL ORDER BY kafka_offset",
		"SELECT event_id, record_offset FROM " + db + ".usage_adjustments FINAL ORDER BY kafka_offset",
		"SELECT line_kind, event_id, record_offset FROM " + db + ".invoice_lines FINAL ORDER BY record_offset, event_id",
	}
}

// "a" 5 + 7 and "b" 1, in each table.
var copyMigrationWant = []string{
	"3\t3\t13\t3\t3\t13\t3\t3\t13\t3\t3\t13\n",
	"a\t10\t0\nb\t11\t0\na\t20\t20\n",
	"a\t10\t0\t0\nb\t11\t0\t0\na\t20\t0\t20\n",
	"a\t0\nb\t0\na\t5\n",
	"adjustment\ta\t0\nadjustment\tb\t0\nadjustment\ta\t5\n",
}

// TestLedgerCopyKeysMigration: a database migrated to 012 that holds rows
// (a replay among them) is migrated to 013 by a run interrupted after its
// first statements and a second run: it keeps its rows, records no
// rebuild, old rows still collapse their replays, and the copies written
// after it stay apart while their replays collapse. A third run applies
// nothing.
func TestLedgerCopyKeysMigration(t *testing.T) {
	conn, db := testenv.ClickHouseDB(t)
	ctx := ctxT(t, 5*time.Minute)
	ms, err := chschema.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	i := migrationIndex(t, ms, copyKeysMigration)
	if _, err := migrate(ctx, conn, ms[:i]); err != nil {
		t.Fatal(err)
	}
	for _, s := range oldCopyInserts(db) {
		if err := conn.Exec(ctx, s); err != nil {
			t.Fatalf("%v\n%s", err, s)
		}
	}
	// Killed after the events_by_customer ALTER, before its view.
	for _, s := range ms[i].Statements[:4] {
		if err := conn.Exec(ctx, s); err != nil {
			t.Fatalf("%v\n%s", err, s)
		}
	}
	res, err := Migrate(ctx, conn)
	if err != nil {
		t.Fatal(err)
	}
	if !res[i].Applied || res[i].Migration.Name != copyKeysMigration {
		t.Fatalf("migration %d: %+v, want %s applied", i, res[i], copyKeysMigration)
	}
	if err := CheckRebuilds(ctx, conn); err != nil {
		t.Errorf("after the migration: %v, want no rebuild", err)
	}
	writeThroughSink(ctx, t, conn, db, newCopyBatches())
	for _, s := range optimizeCopies(db) {
		if err := conn.Exec(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	for i, q := range copyMigrationQueries(db) {
		got, err := tsv(ctx, conn, q)
		if err != nil {
			t.Fatal(err)
		}
		if got != copyMigrationWant[i] {
			t.Errorf("%s on 18.16:\n%q\nwant\n%q", q, got, copyMigrationWant[i])
		}
	}
	res, err = Migrate(ctx, conn)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range res {
		if m.Applied {
			t.Errorf("third run applied %s", m.Migration.Name)
		}
	}
}

// TestLedgerCopyKeysMigrationOnChdb is TestLedgerCopyKeysMigration on
// current ClickHouse (chdb, 26.x), the migration run once.
func TestLedgerCopyKeysMigrationOnChdb(t *testing.T) {
	python := testenv.Chdb(t)
	const db = "copykeys"
	ms, err := chschema.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	i := migrationIndex(t, ms, copyKeysMigration)
	var stmts []string
	for _, m := range ms[:i] {
		stmts = append(stmts, m.Statements...)
	}
	stmts = append(append(stmts, oldCopyInserts(db)...), ms[i].Statements...)
	stmts = append(append(stmts, sinkValues(t, db, newCopyBatches())...), optimizeCopies(db)...)
	resp, err := runChdb(ctxT(t, 5*time.Minute), python, chdbRequest{Path: t.TempDir(), Database: db, Statements: stmts,
		Queries: append(copyMigrationQueries(db), "SELECT count() FROM meterline_rebuilds")})
	if err != nil {
		t.Fatal(err)
	}
	want := append(append([]string{}, copyMigrationWant...), "0\n")
	if len(resp.Results) != len(want) {
		t.Fatalf("chdb %s answered %d queries of %d", resp.Version, len(resp.Results), len(want))
	}
	for i, w := range want {
		if resp.Results[i] != w {
			t.Errorf("chdb %s, query %d:\n%q\nwant\n%q", resp.Version, i, resp.Results[i], w)
		}
	}
}

func migrationIndex(t *testing.T, ms []chschema.Migration, name string) int {
	t.Helper()
	for i, m := range ms {
		if m.Name == name {
			return i
		}
	}
	t.Fatalf("no migration %s", name)
	return 0
}
