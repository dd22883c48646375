package sink

import (
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap/zaptest"

	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/schemas"
	chschema "github.com/meterline/meterline/schemas/clickhouse"
)

const capsUntilMigration = "016_balances_caps_until.sql"

// capsUntilRecords are balances of now's billing period (a month), as the
// sink reads them from usage.balances' partition 0: raised's cap of 1000
// was raised a minute ago (its caps_until is past, and no balance has
// come since), scheduled's changes in an hour, steady's has no change
// known; and a balance written with the schema before caps_until
// (schemas/testdata/balance.v0.hex: acme, November 2026), which reads 0.
func capsUntilRecords(t *testing.T, now time.Time) []*kgo.Record {
	t.Helper()
	cur := time.Date(now.Year(), now.Month(), 1, 0, 0, 0, 0, time.UTC)
	next := cur.AddDate(0, 1, 0)
	old, err := os.ReadFile(filepath.Join("..", "schemas", "testdata", "balance.v0.hex"))
	if err != nil {
		t.Fatal(err)
	}
	oldValue, err := hex.DecodeString(strings.TrimSpace(string(old)))
	if err != nil {
		t.Fatal(err)
	}
	values := [][]byte{oldValue}
	for _, c := range []struct {
		cust  string
		usage int64
		until int64
	}{
		{"raised", 950, capsRaisedAt(now)},
		{"scheduled", 900, capsScheduledAt(now)},
		{"steady", 800, 0},
	} {
		values = append(values, schemas.MustEncode(&schemas.Balance{CustomerID: c.cust, Plan: "free", Revision: 1,
			UpdatedAt: now.Add(-2 * time.Minute).UnixMilli(), PeriodStart: cur.UnixMilli(), PeriodEnd: next.UnixMilli(),
			Meters:          []schemas.MeterBalance{{Meter: "api_calls", Usage: c.usage, Limit: 1000, OnLimit: schemas.OnLimitReject}},
			OverdraftPolicy: schemas.OverdraftDeny, CapsUntil: c.until}))
	}
	var recs []*kgo.Record
	for i, v := range values {
		recs = append(recs, &kgo.Record{Topic: testTopics().BalancesTopic(), Partition: 0, Offset: int64(i), Value: v,
			Timestamp: now.Add(-2 * time.Minute).Truncate(time.Millisecond)})
	}
	return recs
}

// capsRaisedAt is a minute before now, capsScheduledAt an hour after it,
// each with a millisecond part that the _ms column keeps.
func capsRaisedAt(now time.Time) int64 {
	return now.Add(-time.Minute).Truncate(time.Second).UnixMilli() + 250
}
func capsScheduledAt(now time.Time) int64 {
	return now.Add(time.Hour).Truncate(time.Second).UnixMilli() + 250
}

// capsUntilQueries: caps_until in usage_balances and balances_current,
// and the documented customers_near_cap.
func capsUntilQueries(t *testing.T, db string) []string {
	return []string{
		"SELECT customer_id, toUInt32(caps_until), caps_until_ms FROM " + db + ".usage_balances ORDER BY customer_id",
		"SELECT customer_id, toUInt32(caps_until), caps_until_ms FROM " + db + ".balances_current FINAL ORDER BY customer_id",
		balanceQuery(t, "customers_near_cap"),
	}
}

// capsUntilWant: each balance's caps_until in both tables (the old one's
// 0), and near its cap only scheduled (90 %) and steady (80 %): raised's
// cap of 1000 is no longer in effect.
func capsUntilWant(now time.Time) []string {
	r, s := capsRaisedAt(now), capsScheduledAt(now)
	cols := fmt.Sprintf("acme\t0\t0\nraised\t%d\t%d\nscheduled\t%d\t%d\nsteady\t0\t0\n", r/1000, r, s/1000, s)
	return []string{cols, cols, "scheduled\tfree\tapi_calls\t900\t1000\t90\nsteady\tfree\tapi_calls\t800\t1000\t80\n"}
}

// TestBalanceCapsUntil: on ClickHouse 18.16, the sink writes a balance's
// caps_until to usage_balances, and its view to balances_current (0 for a
// balance written before the field); customers_near_cap leaves out a
// customer whose caps have changed since its latest balance; verify finds
// the tables equal, and a balances_current row whose caps_until differs
// from the ledger's makes its month differ.
func TestBalanceCapsUntil(t *testing.T) {
	now := testenv.InOneMonth(t, 2*time.Minute, 2*time.Minute) // the query reads now()'s month
	conn, db, ctx := migratedDB(t, func(string) []string { return nil })
	writeThroughSink(ctx, t, conn, db, [][]*kgo.Record{capsUntilRecords(t, now)})
	want := capsUntilWant(now)
	for i, q := range capsUntilQueries(t, db) {
		got, err := tsv(ctx, conn, q)
		if err != nil {
			t.Fatalf("%v\n%s", err, q)
		}
		if got != want[i] {
			t.Errorf("%s on 18.16:\n%q\nwant\n%q", q, got, want[i])
		}
	}
	month := uint32(now.Year()*100 + int(now.Month()))
	verifyEqual(ctx, t, conn, db, 202611)
	// scheduled's row again, the same but its caps_until (0): the later
	// insert wins under FINAL.
	cols, err := tsv(ctx, conn, "SELECT name FROM system.columns WHERE database = '"+db+"' AND table = 'balances_current' AND name NOT LIKE 'caps_until%'")
	if err != nil {
		t.Fatal(err)
	}
	list := strings.Join(strings.Fields(cols), ", ")
	if err := conn.Exec(ctx, "INSERT INTO "+db+".balances_current ("+list+") SELECT "+list+" FROM "+db+
		".balances_current FINAL WHERE customer_id = 'scheduled'"); err != nil {
		t.Fatal(err)
	}
	rep, err := Verify(ctx, VerifyConfig{Conn: conn, Database: db, Since: month, Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	differs := false
	for _, m := range rep.Months {
		if m.Table == TableBalancesCurrent && m.Month == month {
			differs = m.Status != MonthEqual
		}
	}
	if !differs {
		t.Errorf("verify: balances_current %d equal to the ledger with scheduled's caps_until lost, want it to differ", month)
	}
}

// capsUpgradeQueries: the balances written before the migration, as
// TestBalancesCurrentKeepsEachMonth reads them, then caps_until of every
// balance in both tables, and the documented customers_near_cap.
func capsUpgradeQueries(t *testing.T, db string) []string {
	return []string{strings.Replace(balanceMonthsQuery, "\nORDER BY", "\nWHERE period_start < toDateTime('2025-01-01 00:00:00')\nORDER BY", 1),
		"SELECT customer_id, period_start, caps_until_ms FROM " + db + ".usage_balances ORDER BY customer_id, period_start",
		"SELECT customer_id, period_start, caps_until_ms FROM " + db + ".balances_current FINAL ORDER BY customer_id, period_start",
		balanceQuery(t, "customers_near_cap"),
	}
}

// capsUpgradeWant: the old balances kept, with 0 in caps_until_ms, and
// the sink's new ones (now's month) with theirs; near its cap only
// scheduled and steady, as in capsUntilWant.
func capsUpgradeWant(now time.Time) []string {
	cur := time.Date(now.Year(), now.Month(), 1, 0, 0, 0, 0, time.UTC).Format(time.DateTime)
	old := "acme\t2023-12-01 00:00:00\t0\nacme\t2024-01-01 00:00:00\t0\nglobex\t2023-12-01 00:00:00\t0\n" +
		"initech\t2024-01-01 00:00:00\t0\ninitech\t2024-01-02 00:00:00\t0\n"
	withNew := strings.Replace(old, "acme\t2024-01-01 00:00:00\t0\n", "acme\t2024-01-01 00:00:00\t0\nacme\t2026-11-01 00:00:00\t0\n", 1) +
		fmt.Sprintf("raised\t%s\t%d\nscheduled\t%s\t%d\nsteady\t%s\t0\n", cur, capsRaisedAt(now), cur, capsScheduledAt(now), cur)
	return []string{balanceMonthsWant, withNew, withNew, capsUntilWant(now)[2]}
}

// TestBalancesCapsUntilMigration: a database migrated to 015 that holds
// balances is migrated to 016 by a run killed after it dropped the view
// (before its ALTER of balances_current) and a second run: it keeps
// every balance, which reads 0 in caps_until, records no rebuild, and
// the view writes the sink's later balances with their caps_until.
func TestBalancesCapsUntilMigration(t *testing.T) {
	now := testenv.InOneMonth(t, 2*time.Minute, 2*time.Minute)
	conn, db := testenv.ClickHouseDB(t)
	ctx := ctxT(t, 5*time.Minute)
	ms, err := chschema.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	i := migrationIndex(t, ms, capsUntilMigration)
	if _, err := migrate(ctx, conn, ms[:i]); err != nil {
		t.Fatal(err)
	}
	for _, s := range append(balanceMonthsInserts(db), ms[i].Statements[:2]...) {
		if err := conn.Exec(ctx, s); err != nil {
			t.Fatalf("%v\n%s", err, s)
		}
	}
	res, err := Migrate(ctx, conn)
	if err != nil {
		t.Fatal(err)
	}
	if !res[i].Applied || res[i].Migration.Name != capsUntilMigration {
		t.Fatalf("migration %d: %+v, want %s applied", i, res[i], capsUntilMigration)
	}
	if err := CheckRebuilds(ctx, conn); err != nil {
		t.Errorf("after the migration: %v, want no rebuild", err)
	}
	writeThroughSink(ctx, t, conn, db, [][]*kgo.Record{capsUntilRecords(t, now)})
	want := capsUpgradeWant(now)
	for k, q := range capsUpgradeQueries(t, db) {
		got, err := tsv(ctx, conn, q)
		if err != nil {
			t.Fatalf("%v\n%s", err, q)
		}
		if got != want[k] {
			t.Errorf("%s on 18.16:\n%q\nwant\n%q", q, got, want[k])
		}
	}
	verifyEqual(ctx, t, conn, db, 202312)
}

// TestBalancesCapsUntilMigrationOnChdb is TestBalancesCapsUntilMigration
// on current ClickHouse (chdb, 26.x), the migration run once, with the
// sink's INSERT: the caps_until columns and customers_near_cap of
// TestBalanceCapsUntil there too, and verify's measures equal.
func TestBalancesCapsUntilMigrationOnChdb(t *testing.T) {
	python := testenv.Chdb(t)
	now := testenv.InOneMonth(t, 5*time.Minute, 2*time.Minute)
	const db = "capsupgrade"
	ms, err := chschema.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	i := migrationIndex(t, ms, capsUntilMigration)
	var stmts []string
	for _, m := range ms[:i] {
		stmts = append(stmts, m.Statements...)
	}
	stmts = append(append(stmts, balanceMonthsInserts(db)...), ms[i].Statements...)
	stmts = append(stmts, sinkValues(t, db, [][]*kgo.Record{capsUntilRecords(t, now)})...)
	resp, ds := chdbMeasures(t, python, db, stmts, append(capsUpgradeQueries(t, db), "SELECT count() FROM meterline_rebuilds"))
	want := append(capsUpgradeWant(now), "0\n")
	for k, w := range want {
		if resp.Results[k] != w {
			t.Errorf("chdb %s, query %d:\n%q\nwant\n%q", resp.Version, k, resp.Results[k], w)
		}
	}
	for k, d := range ds {
		if led, der := resp.Results[len(want)+2*k], resp.Results[len(want)+1+2*k]; led != der {
			t.Errorf("%s on chdb %s: ledger\n%s derived\n%s", d.Name, resp.Version, led, der)
		}
	}
}
