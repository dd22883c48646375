package sink

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/meterline/meterline/internal/testenv"
	chschema "github.com/meterline/meterline/schemas/clickhouse"
)

// TestBalancesMigrationRerunAfterBackfill: migration 015 re-creates
// balances_current, and is re-run whole when a run was stopped before it
// recorded it (Migrate). A run stopped there on a database that holds
// balances, a `verify --backfill` that finished its rebuild, then the
// migration run again: the run again drops the rebuilt table, and must
// leave a rebuild unfinished (the sink refuses to start until it is
// done), not an empty balances_current with every rebuild finished. The
// backfill after it gives back every customer's months.
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
	for _, s := range ms[i].Statements {
		if err := conn.Exec(ctx, s); err != nil {
			t.Fatalf("%v\n%s", err, s)
		}
	}
	backfill := func(when string) {
		t.Helper()
		if err := CheckRebuilds(ctx, conn); !errors.Is(err, ErrRebuildUnfinished) {
			t.Fatalf("%s: %v, want ErrRebuildUnfinished", when, err)
		}
		noSink := func(context.Context) ([]string, error) { return nil, nil }
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
	backfill("after the stopped run")
	if _, err := Migrate(ctx, conn); err != nil {
		t.Fatal(err)
	}
	got, err := tsv(ctx, conn, balanceMonthsQuery)
	if err != nil {
		t.Fatal(err)
	}
	if got != balanceMonthsWant {
		backfill("after the migration ran again")
	}
}
