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

// A backfill fills a derived table's staging table with every month the
// ledger holds. Current ClickHouse (26.x) refuses an INSERT block whose
// rows fall into more than max_partitions_per_insert_block (100)
// partitions, and the view's SELECT over the whole ledger yields blocks
// that mix its months (aggregates_current's sorts by revision): billing
// tables kept for more than 100 months could not be backfilled. 18.16
// has no such limit.

// manyMonths is 120 months, from January 2014.
func manyMonths() []uint32 {
	var out []uint32
	for i := 0; i < 120; i++ {
		t := time.Date(2014, time.Month(1+i), 1, 0, 0, 0, 0, time.UTC)
		out = append(out, uint32(t.Year()*100+int(t.Month())))
	}
	return out
}

// manyMonthsInserts: one aggregate of acme in each of manyMonths, its
// record written in the month after its period, in two INSERTs of 60
// months each (one INSERT of 120 months is refused as well).
func manyMonthsInserts(db string) []string {
	var out []string
	for _, from := range []int{0, 60} {
		out = append(out, fmt.Sprintf("INSERT INTO %[1]s.usage_aggregates (kafka_topic, kafka_partition, kafka_offset, kafka_timestamp, "+
			"customer_id, meter, group_key, aggregation, period_start, period_end, revision, status, value) "+
			"SELECT 'usage.aggregates', toInt32(0), toInt64(n), toDateTime(addMonths(toDate('2014-01-01'), n + 1)), 'acme', 'api_calls', '{}', 'SUM', "+
			"toDateTime(addMonths(toDate('2014-01-01'), n)), toDateTime(addMonths(toDate('2014-01-01'), n + 1)), toInt64(n + 1), 'FINAL', toInt64(n) "+
			"FROM (SELECT toUInt32(number + %[2]d) AS n FROM system.numbers LIMIT 60)", db, from))
	}
	return out
}

// TestFillManyMonthsOnChdb runs a backfill's fill of aggregates_current
// over 120 months on chdb (ClickHouse 26.x), then counts the months
// staged: every one.
func TestFillManyMonthsOnChdb(t *testing.T) {
	python := testenv.Chdb(t)
	const db = "fillmonths"
	d := derivedTable(t, TableAggregatesCurrent)
	staging := stagingTable(d.Name, newRunID("backfill", time.Now()))
	stmts := append(migrationStatements(t), manyMonthsInserts(db)...)
	stmts = append(stmts, "CREATE TABLE "+db+"."+staging+" AS "+db+"."+d.Name)
	for _, view := range d.Views {
		stmts = append(stmts, view.fillSQLs(db, staging, d.PartitionColumn, manyMonths())...)
	}
	resp, err := runChdb(ctxT(t, 5*time.Minute), python, chdbRequest{Path: t.TempDir(), Database: db, Statements: stmts,
		Queries: []string{"SELECT uniqExact(toYYYYMM(period_start)), count() FROM " + db + "." + staging}})
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(resp.Results[0]); got != "120\t120" {
		t.Errorf("on chdb %s: %q months and rows staged, want 120 of each", resp.Version, got)
	}
}

// TestBackfillManyMonths: on ClickHouse 18.16, a backfill of
// aggregates_current over 120 months (two fills) rebuilds every one of
// them equal to the ledger.
func TestBackfillManyMonths(t *testing.T) {
	conn, db, ctx := migratedDB(t, func(db string) []string {
		return append(manyMonthsInserts(db), "TRUNCATE TABLE "+db+"."+TableAggregatesCurrent)
	})
	rep, err := Verify(ctx, VerifyConfig{Conn: conn, Database: db, Backfill: true, Tables: []string{TableAggregatesCurrent},
		Logger: zaptest.NewLogger(t), SinkMembers: func(context.Context) ([]string, error) { return nil, nil }})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Months) != 120 || rep.Rebuilt != 120 || rep.Differs != 0 {
		t.Fatalf("%d months, %d rebuilt, %d differ; want 120 rebuilt", len(rep.Months), rep.Rebuilt, rep.Differs)
	}
}

// derivedTable is the derived table named name (DerivedTables).
func derivedTable(t *testing.T, name string) DerivedTable {
	t.Helper()
	ds, err := DerivedTables()
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range ds {
		if d.Name == name {
			return d
		}
	}
	t.Fatalf("no derived table %s", name)
	return DerivedTable{}
}
