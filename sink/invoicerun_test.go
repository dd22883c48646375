package sink

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/meterline/meterline/internal/testenv"
)

// invoiceRunInserts: a database as an invoice job finds it when it
// invoices January 2024 (docs/analysts.md, Invoicing exactly once). Its
// previous run invoiced December with usage.adjustments' partitions read
// up to offsets [2, 1]; this run reads the sink's progress [5, 3].
//
// Adjustments (partition/offset: customer, booked period, delta):
//
//	0/0 acme Dec 1      billed by the December run (below its bound 2)
//	0/1 acme Jan 4      this run: January
//	0/2 acme Dec 2      this run: booked into invoiced December, its
//	                    kafka_timestamp before the December run (it
//	                    reached ClickHouse after that run read its bound)
//	0/3 hooli Jan 6     this run: a line of adjustments only
//	0/4 globex Feb 2    no run yet: February is not invoiced
//	0/5 acme Jan 9      the next run: at this run's bound 5
//	1/0 initech Dec 3   billed by the December run
//	1/1 acme Dec 1      this run: booked into invoiced December
//	1/2 globex Jan 2    this run: January
//	1/3 acme Dec 7      the next run: at this run's bound 3
//
// 0/1 is in usage_adjustments twice, as a zombie sink can write it.
//
// Aggregates: acme's December FINAL 50 and January 3 then FINAL 6,
// globex's January FINAL 7, hooli's and initech's FINAL 0 (lines of
// adjustments only), acme's February OPEN 5.
func invoiceRunInserts(db string) []string {
	// No merge collapses the zombie's row before the queries read it.
	out := []string{"SYSTEM STOP MERGES " + db + ".usage_adjustments"}
	agg := func(off int, cust, start, end string, rev int, status string, v int) {
		out = append(out, fmt.Sprintf("INSERT INTO %s.usage_aggregates (kafka_topic, kafka_partition, kafka_offset, kafka_timestamp, customer_id, "+
			"meter, group_key, aggregation, period_start, period_end, revision, status, value) SELECT 'usage.aggregates', toInt32(0), toInt64(%d), "+
			"toDateTime('%s'), '%s', 'api_calls', '{}', 'SUM', toDateTime('%s'), toDateTime('%s'), toInt64(%d), '%s', toInt64(%d)",
			db, off, end, cust, start, end, rev, status, v))
	}
	const nov, dec, jan, feb, mar = "2023-11-01 00:00:00", "2023-12-01 00:00:00", "2024-01-01 00:00:00", "2024-02-01 00:00:00", "2024-03-01 00:00:00"
	agg(0, "acme", dec, jan, 1, "FINAL", 50)
	agg(1, "initech", dec, jan, 1, "FINAL", 0)
	agg(2, "acme", jan, feb, 1, "OPEN", 3)
	agg(3, "acme", jan, feb, 2, "FINAL", 6)
	agg(4, "globex", jan, feb, 1, "FINAL", 7)
	agg(5, "hooli", jan, feb, 1, "FINAL", 0)
	agg(6, "acme", feb, mar, 1, "OPEN", 5)
	adj := func(p, off int, cust, orig, booked, bookedEnd string, delta int, at string) {
		out = append(out, fmt.Sprintf("INSERT INTO %s.usage_adjustments (kafka_topic, kafka_partition, kafka_offset, kafka_timestamp, event_id, "+
			"customer_id, meter, group_key, aggregation, original_period_start, booked_period_start, booked_period_end, delta, quantity, "+
			"record_offset) SELECT 'usage.adjustments', toInt32(%d), toInt64(%d), toDateTime('%s'), 'late-%d-%d', '%s', 'api_calls', '{}', "+
			"'SUM', toDateTime('%s'), toDateTime('%s'), toDateTime('%s'), toInt64(%d), toInt64(%d), toInt64(%d)",
			db, p, off, at, p, off, cust, orig, booked, bookedEnd, delta, delta, off))
	}
	adj(0, 0, "acme", nov, dec, jan, 1, "2023-12-20 10:00:00")
	adj(0, 1, "acme", dec, jan, feb, 4, "2024-01-10 10:00:00")
	adj(0, 2, "acme", dec, dec, jan, 2, "2024-01-01 23:59:00")
	adj(0, 3, "hooli", dec, jan, feb, 6, "2024-01-20 10:00:00")
	adj(0, 4, "globex", jan, feb, mar, 2, "2024-02-02 10:00:00")
	adj(0, 5, "acme", dec, jan, feb, 9, "2024-02-03 10:00:00")
	adj(1, 0, "initech", nov, dec, jan, 3, "2023-12-21 10:00:00")
	adj(1, 1, "acme", nov, dec, jan, 1, "2024-01-15 10:00:00")
	adj(1, 2, "globex", dec, jan, feb, 2, "2024-01-16 10:00:00")
	adj(1, 3, "acme", nov, dec, jan, 7, "2024-02-04 10:00:00")
	// A zombie sink's INSERT of 0/1 again: a byte-identical row
	// (docs/design.md, The ClickHouse ledger).
	adj(0, 1, "acme", dec, jan, feb, 4, "2024-01-10 10:00:00")
	progress := func(topic string, p, next int, at string) {
		out = append(out, fmt.Sprintf("INSERT INTO %s.sink_progress (consumer_group, kafka_topic, kafka_partition, next_offset, written_at) "+
			"SELECT 'meterline-sink', '%s', toInt32(%d), toUInt64(%d), toDateTime('%s')", db, topic, p, next, at))
	}
	progress("usage.adjustments", 0, 2, "2024-01-02 00:00:00")
	progress("usage.adjustments", 1, 1, "2024-01-02 00:00:00")
	progress("usage.adjustments", 0, 5, "2024-02-03 09:00:00")
	progress("usage.adjustments", 1, 3, "2024-02-03 09:00:00")
	progress("usage.aggregates", 0, 7, "2024-02-03 09:00:00")
	return out
}

// invoiceRunQueries: the sink's progress, this run's invoice (January,
// the documented example values), and the previous run's (December, from
// offsets [0, 0] to [2, 1]).
func invoiceRunQueries(t *testing.T) []string {
	run := namedQuery(t, AnalystQueries, "invoice_run")
	prev, err := AnalystQuery{Name: "invoice_run", SQL: run}.For(QueryParams{Customer: "acme", Meter: "api_calls",
		Month: time.Date(2023, 12, 1, 0, 0, 0, 0, time.UTC)})
	if err != nil {
		t.Fatal(err)
	}
	prev = strings.NewReplacer("[5, 3]", "[2, 1]", "[2, 1]", "[0, 0]").Replace(prev)
	return []string{namedQuery(t, AnalystQueries, "adjustments_progress"), run, prev}
}

// invoiceRunWant: the progress of usage.adjustments per partition; this
// run bills January's FINAL values with the adjustments booked into
// January below the bounds, and the adjustments booked into December
// since the December run (0/2, 1/1); the December run billed December's
// FINAL value with 0/0 and 1/0. Every adjustment below this run's bounds
// and booked into an invoiced period is in exactly one of the two runs.
var invoiceRunWant = []string{
	"0\t5\n1\t3\n",
	"2023-12-01 00:00:00\tacme\tapi_calls\t{}\t0\t3\t3\tinvoiced\n" +
		"2024-01-01 00:00:00\tacme\tapi_calls\t{}\t6\t4\t10\tfinal\n" +
		"2024-01-01 00:00:00\tglobex\tapi_calls\t{}\t7\t2\t9\tfinal\n" +
		"2024-01-01 00:00:00\thooli\tapi_calls\t{}\t0\t6\t6\tfinal\n",
	"2023-12-01 00:00:00\tacme\tapi_calls\t{}\t50\t1\t51\tfinal\n" +
		"2023-12-01 00:00:00\tinitech\tapi_calls\t{}\t0\t3\t3\tfinal\n",
}

// TestInvoiceRunExactlyOnce: the invoice run of docs/analysts.md bills
// each adjustment once across runs, an adjustment that reached ClickHouse
// after the previous run with a kafka_timestamp before it included, on
// ClickHouse 18.16; run twice, it bills the same.
func TestInvoiceRunExactlyOnce(t *testing.T) {
	conn, _, ctx := migratedDB(t, invoiceRunInserts)
	qs := invoiceRunQueries(t)
	for round := 0; round < 2; round++ {
		for i, q := range qs {
			got, err := tsv(ctx, conn, q)
			if err != nil {
				t.Fatalf("%v\n%s", err, q)
			}
			if got != invoiceRunWant[i] {
				t.Errorf("round %d, query %d on 18.16:\n%s\nwant\n%s", round, i, got, invoiceRunWant[i])
			}
		}
	}
}

// TestInvoiceRunExactlyOnceOnChdb is TestInvoiceRunExactlyOnce on current
// ClickHouse (chdb, 26.x).
func TestInvoiceRunExactlyOnceOnChdb(t *testing.T) {
	checkInvoiceRunChdb(t, "invoicerun", invoiceRunInserts)
}

// checkInvoiceRunChdb runs invoiceRunQueries on chdb (ClickHouse 26.x),
// in database db with the statements of inserts, and compares the
// answers with invoiceRunWant.
func checkInvoiceRunChdb(t *testing.T, db string, inserts func(db string) []string) {
	t.Helper()
	python := testenv.Chdb(t)
	stmts := append(migrationStatements(t), inserts(db)...)
	resp, err := runChdb(ctxT(t, 5*time.Minute), python, chdbRequest{Path: t.TempDir(), Database: db, Statements: stmts,
		Queries: invoiceRunQueries(t)})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(resp.Results, "|") != strings.Join(invoiceRunWant, "|") {
		t.Errorf("on chdb %s:\n%q\nwant\n%q", resp.Version, resp.Results, invoiceRunWant)
	}
}

// zombieRejectedInserts: three rejections of January 2024 in
// usage_rejected, one of them written twice (a zombie sink's INSERT: a
// byte-identical row, docs/design.md, The ClickHouse ledger), with no
// merge to collapse it before the query reads it.
func zombieRejectedInserts(db string) []string {
	out := []string{"SYSTEM STOP MERGES " + db + ".usage_rejected"}
	rej := func(off int, reason string) {
		out = append(out, fmt.Sprintf("INSERT INTO %s.usage_rejected (kafka_topic, kafka_partition, kafka_offset, kafka_timestamp, reason, stage, "+
			"source_topic, source_partition, source_offset, record_offset) SELECT 'usage.rejected', toInt32(0), toInt64(%d), "+
			"toDateTime('2024-01-04 10:00:00'), '%s', 'dedup', 'usage.events', toInt32(0), toInt64(%d), toInt64(%d)", db, off, reason, off, off))
	}
	rej(0, "too_old")
	rej(1, "too_old")
	rej(2, "invalid")
	rej(1, "too_old")
	return out
}

const zombieRejectedWant = "2024-01-04\tdedup\tinvalid\t1\n2024-01-04\tdedup\ttoo_old\t2\n"

// TestRejectionsSkipZombieRow: the rejections query counts a rejection
// that a zombie sink wrote twice once, on ClickHouse 18.16.
func TestRejectionsSkipZombieRow(t *testing.T) {
	checkQuery1816(t, zombieRejectedInserts, namedQuery(t, AnalystQueries, "rejections"), zombieRejectedWant)
}

// TestRejectionsSkipZombieRowOnChdb is TestRejectionsSkipZombieRow on
// current ClickHouse (chdb, 26.x).
func TestRejectionsSkipZombieRowOnChdb(t *testing.T) {
	checkQueryChdb(t, "zombierejected", zombieRejectedInserts, namedQuery(t, AnalystQueries, "rejections"), zombieRejectedWant)
}

// checkQuery1816 runs q on a new database of the test server, migrated,
// with the statements of inserts, and compares its TabSeparated answer
// with want.
func checkQuery1816(t *testing.T, inserts func(db string) []string, q, want string) {
	t.Helper()
	conn, _, ctx := migratedDB(t, inserts)
	got, err := tsv(ctx, conn, q)
	if err != nil {
		t.Fatal(err)
	}
	if got != want {
		t.Errorf("on 18.16:\n%q\nwant\n%q\n%s", got, want, q)
	}
}

// checkQueryChdb is checkQuery1816 on chdb (ClickHouse 26.x), in database
// db.
func checkQueryChdb(t *testing.T, db string, inserts func(db string) []string, q, want string) {
	t.Helper()
	python := testenv.Chdb(t)
	resp, err := runChdb(ctxT(t, 5*time.Minute), python, chdbRequest{Path: t.TempDir(), Database: db,
		Statements: append(migrationStatements(t), inserts(db)...), Queries: []string{q}})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Results) != 1 || resp.Results[0] != want {
		t.Errorf("on chdb %s:\n%q\nwant\n%q\n%s", resp.Version, resp.Results, want, q)
	}
}
