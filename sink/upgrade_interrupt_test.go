package sink

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/meterline/meterline/internal/testenv"
	chschema "github.com/meterline/meterline/schemas/clickhouse"
)

// TestMigrateKilledAtEveryStatement upgrades a database that holds data,
// created by every older migration set in turn, and kills the upgrade
// after each statement of the next migration (the statements before the
// kill ran, the migration is not recorded). `meterline migrate` run again
// then finishes it: the database ends with the schema and the recorded
// rebuilds of the same upgrade run uninterrupted.
func TestMigrateKilledAtEveryStatement(t *testing.T) {
	if testing.Short() {
		t.Skip("about a minute on ClickHouse 18.16")
	}
	ms, err := chschema.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i < len(ms); i++ {
		m := ms[i]
		want := upgradedSchema(t, ms, i, 0)
		for k := 1; k <= len(m.Statements); k++ {
			if got := upgradedSchema(t, ms, i, k); got != want {
				t.Errorf("%s killed after statement %d of %d, then migrated again:\n%s\nwant (not killed):\n%s",
					m.Name, k, len(m.Statements), got, want)
			}
		}
	}
}

// upgradedSchema migrates a new database with ms[:i], writes a row to the
// ledger tables, runs the first kill statements of ms[i] (none: no kill),
// then Migrate, and describes the database.
func upgradedSchema(t *testing.T, ms []chschema.Migration, i, kill int) string {
	t.Helper()
	conn, _ := testenv.ClickHouseDB(t)
	ctx := ctxT(t, 2*time.Minute)
	if _, err := migrate(ctx, conn, ms[:i]); err != nil {
		t.Fatal(err)
	}
	insertLedgerRows(ctx, t, conn)
	for _, s := range ms[i].Statements[:kill] {
		if err := conn.Exec(ctx, s); err != nil {
			t.Fatalf("%s: %v\n%s", ms[i].Name, err, s)
		}
	}
	if _, err := Migrate(ctx, conn); err != nil {
		t.Fatalf("%s killed after statement %d: migrate again: %v", ms[i].Name, kill, err)
	}
	if err := CheckMigrations(ctx, conn); err != nil {
		t.Fatal(err)
	}
	return describeDatabase(ctx, t, conn)
}

// insertLedgerRows writes a row to the ledger tables usage_events and
// usage_aggregates, and usage_balances once it exists (and through their
// views to the derived tables).
func insertLedgerRows(ctx context.Context, t *testing.T, conn driver.Conn) {
	t.Helper()
	stmts := []string{
		"INSERT INTO usage_events (kafka_topic, kafka_offset, kafka_timestamp, event_id, customer_id, meter, quantity, event_time) SELECT 'e', 1, toDateTime('2026-11-02 00:00:00'), 'e1', 'c', 'm', 5, toDateTime('2026-11-01 00:00:00')",
		"INSERT INTO usage_aggregates (kafka_topic, kafka_offset, kafka_timestamp, customer_id, meter) SELECT 'a', 1, toDateTime('2026-11-02 00:00:00'), 'c', 'm'",
	}
	var balances uint8
	if err := conn.QueryRow(ctx, "EXISTS TABLE usage_balances").Scan(&balances); err != nil {
		t.Fatal(err)
	}
	if balances > 0 {
		stmts = append(stmts, "INSERT INTO usage_balances (kafka_topic, kafka_offset, kafka_timestamp, customer_id, revision, period_start, period_end) "+
			"SELECT 'b', 1, toDateTime('2026-11-02 00:00:00'), 'c', toInt64(1), toDateTime('2026-11-01 00:00:00'), toDateTime('2026-12-01 00:00:00')")
	}
	for _, s := range stmts {
		if err := conn.Exec(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
}

func describeDatabase(ctx context.Context, t *testing.T, conn driver.Conn) string {
	t.Helper()
	var b strings.Builder
	for _, q := range []string{
		"SELECT name, engine, sorting_key, replaceAll(create_table_query, currentDatabase(), 'DB') FROM system.tables WHERE database = currentDatabase() ORDER BY name",
		"SELECT table, name, type, default_expression FROM system.columns WHERE database = currentDatabase() ORDER BY table, name",
		"SELECT run_id, argMax(finished, version) FROM meterline_rebuilds GROUP BY run_id ORDER BY run_id",
		"SELECT count() > 0 FROM sink_progress WHERE kafka_topic = ''",
		"SELECT count(), sum(quantity) FROM usage_daily",
		"SELECT sum(rows) > 0 FROM system.parts WHERE database = currentDatabase() AND table = 'balances_current' AND active",
	} {
		got, err := tsv(ctx, conn, q)
		if err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		b.WriteString(got)
	}
	return b.String()
}

// TestMigrateConcurrently upgrades a database that holds data, created by
// an older migration set, with several `meterline migrate` at once, each
// on its own connection, as sinks started together with --migrate do
// (docs/operations.md, Running the stages): every one succeeds, and the
// database ends with the schema of one upgrade run alone. ClickHouse
// 18.16's ALTERs are not transactional, so one run's ALTER ... ADD COLUMN
// fails with "already exists" while another's is still under way; the
// rounds make that interleaving likely.
func TestMigrateConcurrently(t *testing.T) {
	if testing.Short() {
		t.Skip("about a minute on ClickHouse 18.16")
	}
	addr := testenv.RealClickHouse(t)
	ms, err := chschema.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	const migrators, rounds = 4, 8
	for _, from := range olderSetsWithAlter(ms) {
		want := upgradedSchema(t, ms, from, 0)
		for r := range rounds {
			conn, db := testenv.ClickHouseDB(t)
			ctx := ctxT(t, 2*time.Minute)
			if _, err := migrate(ctx, conn, ms[:from]); err != nil {
				t.Fatal(err)
			}
			insertLedgerRows(ctx, t, conn)
			_, errs := migrateAtOnce(ctx, t, addr, db, migrators, MigrateOptions{})
			var failed []string
			for k, err := range errs {
				if err != nil {
					failed = append(failed, fmt.Sprintf("migrator %d: %v", k, err))
				}
			}
			if len(failed) > 0 {
				t.Fatalf("upgrade from %s, round %d: %d of %d concurrent migrators failed:\n%s",
					ms[from-1].Name, r, len(failed), migrators, strings.Join(failed, "\n"))
			}
			if err := CheckMigrations(ctx, conn); err != nil {
				t.Fatal(err)
			}
			if got := describeDatabase(ctx, t, conn); got != want {
				t.Fatalf("upgrade from %s, round %d, %d migrators at once:\n%s\nwant (one migrator):\n%s", ms[from-1].Name, r, migrators, got, want)
			}
		}
	}
}

// olderSetsWithAlter are the i for which ms[:i] is an older migration set
// whose next migrations hold an ALTER TABLE: the upgrades whose runs
// can meet each other's ALTERs half-way.
func olderSetsWithAlter(ms []chschema.Migration) []int {
	var out []int
	for i := 1; i < len(ms); i++ {
		for _, s := range ms[i].Statements {
			if strings.HasPrefix(s, "ALTER TABLE") {
				out = append(out, i)
				break
			}
		}
	}
	return out
}
