package sink

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/meterline/meterline/internal/testenv"
	chschema "github.com/meterline/meterline/schemas/clickhouse"
)

// balanceMonthsInserts: acme's balances of two billing periods, as the
// aggregator writes them across a month end: December 2023's last one
// (revision 1, 70 micro-credits overdrawn in December) and January 2024's
// first (revision 2, nothing overdrawn yet), then globex's of December,
// then initech's of two daily billing periods in January (`--period day`:
// a row each).
func balanceMonthsInserts(db string) []string {
	bal := func(off int, cust string, rev int, start, end string, overdrawn int) string {
		return fmt.Sprintf("SELECT 'usage.balances' AS t, toInt32(0) AS p, toInt64(%d) AS o, toDateTime('2024-01-02 00:00:00') AS ts, "+
			"'%s' AS c, 'free' AS pl, toInt64(%d) AS r, toDateTime('%s') AS ps, toDateTime('%s') AS pe, toInt64(%d) AS od",
			off, cust, rev, start, end, overdrawn)
	}
	const dec, jan, feb = "2023-12-01 00:00:00", "2024-01-01 00:00:00", "2024-02-01 00:00:00"
	const jan2, jan3 = "2024-01-02 00:00:00", "2024-01-03 00:00:00"
	return []string{
		"INSERT INTO " + db + ".usage_balances (kafka_topic, kafka_partition, kafka_offset, kafka_timestamp, customer_id, plan, revision, " +
			"period_start, period_end, overdrawn) SELECT * FROM (" +
			bal(1, "acme", 1, dec, jan, 70) + " UNION ALL " + bal(2, "acme", 2, jan, feb, 0) + " UNION ALL " + bal(3, "globex", 1, dec, jan, 5) +
			" UNION ALL " + bal(4, "initech", 1, jan, jan2, 3) + " UNION ALL " + bal(5, "initech", 2, jan2, jan3, 4) + ")",
	}
}

// balanceMonthsQuery reads balances_current as docs/entitlements.md
// (Balances in ClickHouse) describes it: with FINAL, the latest balance
// of each customer in each of its billing periods.
const balanceMonthsQuery = `SELECT customer_id, revision, period_start, overdrawn FROM balances_current FINAL
ORDER BY customer_id, period_start`

const balanceMonthsWant = "acme\t1\t2023-12-01 00:00:00\t70\nacme\t2\t2024-01-01 00:00:00\t0\nglobex\t1\t2023-12-01 00:00:00\t5\n" +
	"initech\t1\t2024-01-01 00:00:00\t3\ninitech\t2\t2024-01-02 00:00:00\t4\n"

// TestBalancesCurrentKeepsEachMonth: on ClickHouse 18.16, balances_current
// read with FINAL keeps a customer's balance of every month, not only its
// latest (December's overdraft is what its invoice bills), and verify
// finds both months of it equal to the ledger.
func TestBalancesCurrentKeepsEachMonth(t *testing.T) {
	conn, db, ctx := migratedDB(t, balanceMonthsInserts)
	got, err := tsv(ctx, conn, balanceMonthsQuery)
	if err != nil {
		t.Fatal(err)
	}
	if got != balanceMonthsWant {
		t.Errorf("balances_current FINAL on 18.16:\n%q\nwant\n%q", got, balanceMonthsWant)
	}
	rep, err := Verify(ctx, VerifyConfig{Conn: conn, Database: db, Since: 202312, Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	months := map[uint32]bool{}
	for _, m := range rep.Months {
		if m.Table != TableBalancesCurrent {
			continue
		}
		months[m.Month] = true
		if m.Status != MonthEqual {
			t.Errorf("balances_current %d: %s, want %s (ledger %v, derived %v)", m.Month, m.Status, MonthEqual, m.Ledger, m.Derived)
		}
	}
	if !months[202312] || !months[202401] {
		t.Errorf("verify compared balances_current in months %v, want 202312 and 202401", months)
	}
}

// TestBalancesCurrentKeepsEachMonthOnChdb is
// TestBalancesCurrentKeepsEachMonth on current ClickHouse (chdb, 26.x).
func TestBalancesCurrentKeepsEachMonthOnChdb(t *testing.T) {
	python := testenv.Chdb(t)
	const db = "balancemonths"
	stmts := append(migrationStatements(t), balanceMonthsInserts(db)...)
	resp, ds := chdbMeasures(t, python, db, stmts, []string{balanceMonthsQuery})
	if got := resp.Results[0]; got != balanceMonthsWant {
		t.Errorf("balances_current FINAL on chdb %s:\n%q\nwant\n%q", resp.Version, got, balanceMonthsWant)
	}
	for i, d := range ds {
		if led, der := resp.Results[1+2*i], resp.Results[2+2*i]; led != der {
			t.Errorf("%s on chdb %s: ledger\n%s derived\n%s", d.Name, resp.Version, led, der)
		}
	}
}

// TestBalancesMigrationRerunAfterBackfill: migration 015 re-creates
// balances_current, and is re-run whole when a run was stopped before it
// recorded it (Migrate). A run stopped there on a database that holds
// balances: `verify --backfill` refuses (015 is pending, and 016, which
// adds columns this build's verify reads) and rebuilds nothing, and the
// migration run again leaves the rebuild unfinished; the backfill after
// it gives back every customer's months. A second migrate started with
// the first (it read the migrations table before the first recorded 015)
// may run 015 again after that backfill finished: it drops the rebuilt
// table, and must leave a rebuild unfinished (the sink refuses to start
// until it is done), not an empty balances_current with every rebuild
// finished.
func TestBalancesMigrationRerunAfterBackfill(t *testing.T) {
	conn, db := testenv.ClickHouseDB(t)
	ctx := ctxT(t, 5*time.Minute)
	const name = "015_balances_current_by_month.sql"
	i := migrateUpTo(ctx, t, conn, name)
	for _, s := range balanceMonthsInserts(db) {
		if err := conn.Exec(ctx, s); err != nil {
			t.Fatalf("%v\n%s", err, s)
		}
	}
	ms, err := chschema.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	// A run of 015 stopped after its last statement, before its record.
	if err := runStatements(ctx, conn, ms[i], nil); err != nil {
		t.Fatal(err)
	}
	noSink := func(context.Context) ([]string, error) { return nil, nil }
	_, err = Verify(ctx, VerifyConfig{Conn: conn, Database: db, Backfill: true, SinkMembers: noSink, Logger: zaptest.NewLogger(t)})
	if !errors.Is(err, ErrMigrationsPending) || !strings.Contains(err.Error(), name+", "+capsUntilMigration+" not applied") {
		t.Fatalf("backfill after the stopped run: %v, want ErrMigrationsPending naming %s and %s", err, name, capsUntilMigration)
	}
	backfill := func(when string) {
		t.Helper()
		if err := CheckRebuilds(ctx, conn); !errors.Is(err, ErrRebuildUnfinished) {
			t.Fatalf("%s: %v, want ErrRebuildUnfinished", when, err)
		}
		if _, err := Verify(ctx, VerifyConfig{Conn: conn, Database: db, Backfill: true, SinkMembers: noSink, Logger: zaptest.NewLogger(t)}); err != nil {
			t.Fatal(err)
		}
		if err := CheckRebuilds(ctx, conn); err != nil {
			t.Fatalf("%s, backfilled: %v", when, err)
		}
		got, err := tsv(ctx, conn, balanceMonthsQuery)
		if err != nil {
			t.Fatal(err)
		}
		if got != balanceMonthsWant {
			t.Fatalf("%s, backfilled: balances_current FINAL\n%q\nwant\n%q", when, got, balanceMonthsWant)
		}
	}
	if _, err := Migrate(ctx, conn); err != nil {
		t.Fatal(err)
	}
	backfill("after the migration ran again")
	// The second run's statements of 015 and later, after the backfill.
	for _, m := range ms[i:] {
		if err := runStatements(ctx, conn, m, nil); err != nil {
			t.Fatal(err)
		}
	}
	got, err := tsv(ctx, conn, balanceMonthsQuery)
	if err != nil {
		t.Fatal(err)
	}
	if got != balanceMonthsWant {
		backfill("after a concurrent run ran it again")
	}
}
