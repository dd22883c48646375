package sink

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/meterline/meterline/internal/testenv"
)

// A month of an analyst table that the ledger has no row of (written there
// by hand, or its ledger rows deleted) differs, and its rebuild empties it:
// the staging table holds nothing of the month to swap in. Current
// ClickHouse refuses REPLACE PARTITION from a source without parts in the
// partition, so the month is dropped instead.

// emptyMonthInserts: one event of acme in January 2024 in the ledger, and
// a row in events_by_customer's February 2024 that no ledger row backs.
func emptyMonthInserts(db string) []string {
	return []string{
		fmt.Sprintf("INSERT INTO %s.usage_events (kafka_topic, kafka_partition, kafka_offset, kafka_timestamp, event_id, "+
			"customer_id, meter, quantity, event_time, ingest_time, record_offset) "+
			"SELECT 'usage.deduped', toInt32(0), toInt64(1), toDateTime('2024-01-10 09:01:00'), 'e-1', 'acme', 'api_calls', "+
			"toInt64(3), toDateTime('2024-01-10 09:00:00'), toDateTime('2024-01-10 09:01:00'), toInt64(1)", db),
		fmt.Sprintf("INSERT INTO %s.events_by_customer (customer_id, meter, event_time, event_id, quantity, kafka_partition, kafka_offset) "+
			"SELECT 'acme', 'api_calls', toDateTime('2024-02-03 00:00:00'), 'by-hand', toInt64(5), toInt32(0), toInt64(99)", db),
	}
}

var emptyMonths = []uint32{202401, 202402}

// TestRebuildEmptiesAMonthTheLedgerLacks: on ClickHouse 18.16, verify
// rebuilds February of events_by_customer to nothing, and it then equals
// the ledger.
func TestRebuildEmptiesAMonthTheLedgerLacks(t *testing.T) {
	conn, db, ctx := migratedDB(t, emptyMonthInserts)
	rep, err := Verify(ctx, VerifyConfig{Conn: conn, Database: db, Since: 202401, Repair: true, Tables: []string{TableEventsByCustomer},
		Logger: zaptest.NewLogger(t), SinkMembers: func(context.Context) ([]string, error) { return nil, nil }})
	if err != nil {
		t.Fatal(err)
	}
	st := statuses(rep)
	if st["events_by_customer/202402"] != MonthRebuilt || st["events_by_customer/202401"] != MonthEqual || rep.Differs != 0 {
		t.Fatalf("statuses %v, %d differ", st, rep.Differs)
	}
	got, err := tsv(ctx, conn, "SELECT count() FROM "+db+".events_by_customer WHERE toYYYYMM(event_time) = 202402")
	if err != nil {
		t.Fatal(err)
	}
	if got != "0\n" {
		t.Errorf("February after the rebuild: %q rows", got)
	}
}

// TestRebuildEmptiesAMonthTheLedgerLacksOnChdb runs the rebuild's
// statements of both months on current ClickHouse (chdb, 26.x): the
// staging fill, the count of each month staged, then each month's swap.
// Afterwards the table's measures equal the ledger's.
func TestRebuildEmptiesAMonthTheLedgerLacksOnChdb(t *testing.T) {
	python := testenv.Chdb(t)
	const db = "emptymonth"
	d := derivedTable(t, TableEventsByCustomer)
	staging := stagingTable(d.Name, newRunID("verify", time.Now()))
	stmts := append(migrationStatements(t), emptyMonthInserts(db)...)
	stmts = append(stmts, "CREATE TABLE "+db+"."+staging+" AS "+db+"."+d.Name)
	for _, view := range d.Views {
		stmts = append(stmts, view.fillSQL(db, staging, d.PartitionColumn, emptyMonths))
	}
	var counts []string
	for _, m := range emptyMonths {
		counts = append(counts, stagedSQL(db, staging, d.PartitionColumn, m))
	}
	ctx := ctxT(t, 5*time.Minute)
	resp, err := runChdb(ctx, python, chdbRequest{Path: t.TempDir(), Database: db, Statements: stmts, Queries: counts})
	if err != nil {
		t.Fatal(err)
	}
	for i, m := range emptyMonths {
		stmts = append(stmts, swapSQL(db, d.Name, staging, m, strings.TrimSpace(resp.Results[i]) != "0"))
	}
	stmts = append(stmts, "DROP TABLE "+db+"."+staging)
	resp, err = runChdb(ctx, python, chdbRequest{Path: t.TempDir(), Database: db, Statements: stmts,
		Queries: []string{fmt.Sprintf(d.Ledger, db), fmt.Sprintf(d.Derived, db)}})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Results[0] != resp.Results[1] || !strings.HasPrefix(resp.Results[0], "202401\t1\t3\t") {
		t.Errorf("on chdb %s after the rebuild: ledger\n%s derived\n%s", resp.Version, resp.Results[0], resp.Results[1])
	}
}
