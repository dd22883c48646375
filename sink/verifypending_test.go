package sink

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/meterline/meterline/internal/testenv"
)

// TestVerifyRefusesPendingMigrations: on a database mid-upgrade (015
// applied, 016 not: usage_balances and balances_current without
// caps_until, which this build's verify reads), Verify refuses before it
// compares or rebuilds anything, with the sink's own refusal (naming the
// pending migration and `meterline migrate`), in each of its modes,
// without asking whether a sink runs; once migrated it finds every month
// equal.
func TestVerifyRefusesPendingMigrations(t *testing.T) {
	conn, db := testenv.ClickHouseDB(t)
	ctx := ctxT(t, 5*time.Minute)
	migrateUpTo(ctx, t, conn, capsUntilMigration)
	for _, s := range balanceMonthsInserts(db) {
		if err := conn.Exec(ctx, s); err != nil {
			t.Fatalf("%v\n%s", err, s)
		}
	}
	asked := 0
	members := func(context.Context) ([]string, error) { asked++; return nil, nil }
	for _, mode := range []struct {
		name string
		cfg  VerifyConfig
	}{
		{"compare only", VerifyConfig{}},
		{"compare and rebuild", VerifyConfig{Repair: true, SinkMembers: members}},
		{"backfill", VerifyConfig{Backfill: true, SinkMembers: members}},
	} {
		cfg := mode.cfg
		cfg.Conn, cfg.Database, cfg.Since, cfg.Logger = conn, db, 202312, zaptest.NewLogger(t)
		rep, err := Verify(ctx, cfg)
		if !errors.Is(err, ErrMigrationsPending) || !strings.Contains(err.Error(), capsUntilMigration+" not applied (run `meterline migrate`)") {
			t.Errorf("%s at 015: %v, want ErrMigrationsPending naming %s and `meterline migrate`", mode.name, err, capsUntilMigration)
		}
		if rep != nil {
			t.Errorf("%s at 015: a report of %d months, want none", mode.name, len(rep.Months))
		}
	}
	if asked > 0 {
		t.Errorf("verify at 015 asked %d times whether a sink runs, want a refusal first", asked)
	}
	var runs uint64
	if err := conn.QueryRow(ctx, "SELECT count() FROM meterline_rebuilds").Scan(&runs); err != nil {
		t.Fatal(err)
	}
	if runs != 0 {
		t.Errorf("verify at 015 recorded %d rebuild rows, want none", runs)
	}
	if _, err := Migrate(ctx, conn); err != nil {
		t.Fatal(err)
	}
	verifyEqual(ctx, t, conn, db, 202312)
}
