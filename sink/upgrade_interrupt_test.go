package sink

import (
	"context"
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
// usage_aggregates (and through their views to the derived tables).
func insertLedgerRows(ctx context.Context, t *testing.T, conn driver.Conn) {
	t.Helper()
	for _, s := range []string{
		"INSERT INTO usage_events (kafka_topic, kafka_offset, kafka_timestamp, event_id, customer_id, meter, quantity, event_time) SELECT 'e', 1, toDateTime('2026-11-02 00:00:00'), 'e1', 'c', 'm', 5, toDateTime('2026-11-01 00:00:00')",
		"INSERT INTO usage_aggregates (kafka_topic, kafka_offset, kafka_timestamp, customer_id, meter) SELECT 'a', 1, toDateTime('2026-11-02 00:00:00'), 'c', 'm'",
	} {
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
	} {
		got, err := tsv(ctx, conn, q)
		if err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		b.WriteString(got)
	}
	return b.String()
}
