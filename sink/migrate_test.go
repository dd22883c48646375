package sink

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"

	"github.com/meterline/meterline/internal/testenv"
	chschema "github.com/meterline/meterline/schemas/clickhouse"
)

func ctxT(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// TestMigrateIdempotent applies the migrations to an empty database twice:
// the first run creates the five tables and usage_quarantine with the Kafka
// coordinates and the resume-lookup sort key, the second applies nothing and records nothing.
func TestMigrateIdempotent(t *testing.T) {
	conn, db := testenv.ClickHouseDB(t)
	ctx := ctxT(t, 2*time.Minute)
	ms, err := chschema.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	if err := CheckMigrations(ctx, conn); !errors.Is(err, ErrMigrationsPending) {
		t.Fatalf("CheckMigrations on an empty database = %v, want ErrMigrationsPending", err)
	}
	res, err := Migrate(ctx, conn)
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != len(ms) {
		t.Fatalf("%d results, want %d", len(res), len(ms))
	}
	for _, r := range res {
		if !r.Applied {
			t.Errorf("first run: %s not applied", r.Migration.Name)
		}
	}
	res, err = Migrate(ctx, conn)
	if err != nil {
		t.Fatalf("second run: %v", err)
	}
	for _, r := range res {
		if r.Applied {
			t.Errorf("second run applied %s again", r.Migration.Name)
		}
	}
	if err := CheckMigrations(ctx, conn); err != nil {
		t.Fatalf("CheckMigrations after migrate: %v", err)
	}
	var recorded uint64
	if err := conn.QueryRow(ctx, "SELECT count() FROM "+MigrationsTable).Scan(&recorded); err != nil {
		t.Fatal(err)
	}
	if recorded != uint64(len(ms)) {
		t.Errorf("%s has %d rows, want one per migration (%d)", MigrationsTable, recorded, len(ms))
	}
	for _, name := range []string{TableEvents, TableAggregates, TableAdjustments, TableDuplicates, TableRejected, TableQuarantine, TableBalances} {
		var ddl string
		if err := conn.QueryRow(ctx, "SHOW CREATE TABLE "+db+"."+name).Scan(&ddl); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		for _, want := range []string{"kafka_topic String", "kafka_partition Int32", "kafka_offset Int64",
			"ReplacingMergeTree", "PARTITION BY toYYYYMM(kafka_timestamp)",
			fmt.Sprintf("ORDER BY (kafka_partition, intDiv(kafka_offset, %d)", resumeChunk)} {
			if !strings.Contains(ddl, want) {
				t.Errorf("%s: DDL lacks %q:\n%s", name, want, ddl)
			}
		}
	}
	// The Go column lists match the tables.
	for _, tb := range append(newTables(testTopics()), newQuarantine(testTopics())) {
		rows, err := conn.Query(ctx, "SELECT name FROM system.columns WHERE database = '"+db+"' AND table = '"+tb.name+"'")
		if err != nil {
			t.Fatal(err)
		}
		have := map[string]bool{}
		for rows.Next() {
			var n string
			if err := rows.Scan(&n); err != nil {
				t.Fatal(err)
			}
			have[n] = true
		}
		rows.Close()
		if len(have) != len(tb.columns) {
			t.Errorf("%s: table has %d columns, the sink writes %d", tb.name, len(have), len(tb.columns))
		}
		for _, c := range tb.columnNames() {
			if !have[c] {
				t.Errorf("%s: no column %s", tb.name, c)
			}
		}
	}
}

// TestMigrateEmptyServer creates the database itself, as `meterline
// migrate` does on a server that has never seen Meterline.
func TestMigrateEmptyServer(t *testing.T) {
	addr := testenv.RealClickHouse(t)
	ctx := ctxT(t, 2*time.Minute)
	db := fmt.Sprintf("mig_%d_%d", os.Getpid(), time.Now().UnixNano()%1e9)
	conn, err := Dial(ctx, addr, db, true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if !t.Failed() {
			dctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := conn.Exec(dctx, "DROP DATABASE "+db); err != nil {
				t.Errorf("drop database %s: %v", db, err)
			}
		}
		_ = conn.Close()
	})
	if _, err := Migrate(ctx, conn); err != nil {
		t.Fatal(err)
	}
	if _, err := Migrate(ctx, conn); err != nil {
		t.Fatal(err)
	}
	if err := CheckMigrations(ctx, conn); err != nil {
		t.Fatal(err)
	}
}

// TestMigrateInterrupted: a migration that stopped after some of its
// statements (here, one table already made) is re-run whole and succeeds.
func TestMigrateInterrupted(t *testing.T) {
	conn, _ := testenv.ClickHouseDB(t)
	ctx := ctxT(t, 2*time.Minute)
	ms, err := chschema.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	if err := conn.Exec(ctx, ms[0].Statements[0]); err != nil {
		t.Fatal(err)
	}
	if _, err := Migrate(ctx, conn); err != nil {
		t.Fatalf("re-running a half-applied migration: %v", err)
	}
}

// TestMigrateChanged: an applied migration whose file changed is an error,
// and nothing is applied.
func TestMigrateChanged(t *testing.T) {
	conn, _ := testenv.ClickHouseDB(t)
	ctx := ctxT(t, 2*time.Minute)
	v1, err := chschema.Parse(fstest.MapFS{"001_a.sql": {Data: []byte("CREATE TABLE IF NOT EXISTS a (x UInt8) ENGINE = TinyLog;\n")}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := migrate(ctx, conn, v1); err != nil {
		t.Fatal(err)
	}
	v2, err := chschema.Parse(fstest.MapFS{
		"001_a.sql": {Data: []byte("CREATE TABLE IF NOT EXISTS a (x UInt16) ENGINE = TinyLog;\n")},
		"002_b.sql": {Data: []byte("CREATE TABLE IF NOT EXISTS b (x UInt8) ENGINE = TinyLog;\n")},
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := migrate(ctx, conn, v2); !errors.Is(err, ErrMigrationChanged) {
		t.Fatalf("migrate with an edited applied migration = %v, want ErrMigrationChanged", err)
	}
	var n uint64
	if err := conn.QueryRow(ctx, "SELECT count() FROM system.tables WHERE database = currentDatabase() AND name = 'b'").Scan(&n); err != nil || n != 0 {
		t.Fatalf("table b exists (%d, %v): nothing may be applied after a changed migration", n, err)
	}
}

func TestSplitStatements(t *testing.T) {
	got := chschema.Split("-- c\nCREATE TABLE a (\n  x UInt8 -- not a comment line\n) ENGINE = TinyLog;\n\n-- two\nCREATE TABLE b (y String) ENGINE = TinyLog;\n")
	if len(got) != 2 || !strings.HasPrefix(got[0], "CREATE TABLE a (") || got[1] != "CREATE TABLE b (y String) ENGINE = TinyLog" {
		t.Fatalf("%q", got)
	}
	if _, err := chschema.Parse(fstest.MapFS{"002_x.sql": {Data: []byte("SELECT 1;\n")}}); err == nil {
		t.Fatal("a gap in the numbering must be an error")
	}
}

// TestMigrateAlterReRun: a migration whose ALTER TABLE ran but was not
// recorded (the process was killed between the two, or another `meterline
// migrate` applied it concurrently) runs again and succeeds, as every
// other statement of the migrations does.
func TestMigrateAlterReRun(t *testing.T) {
	conn, _ := testenv.ClickHouseDB(t)
	ctx := ctxT(t, 2*time.Minute)
	ms, err := chschema.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	alters := 0
	for i, m := range ms {
		if len(m.Statements) != 1 || !strings.HasPrefix(m.Statements[0], "ALTER TABLE") {
			continue
		}
		alters++
		if _, err := migrate(ctx, conn, ms[:i]); err != nil {
			t.Fatal(err)
		}
		// Killed after the ALTER, before its migration was recorded.
		if err := conn.Exec(ctx, m.Statements[0]); err != nil {
			t.Fatal(err)
		}
		if _, err := migrate(ctx, conn, ms[:i+1]); err != nil {
			t.Errorf("re-running %s after its ALTER succeeded: %v", m.Name, err)
		}
	}
	if alters < 2 {
		t.Fatalf("%d migrations are a single ALTER TABLE, want at least 2 (002, 007 and 010)", alters)
	}
	if _, err := Migrate(ctx, conn); err != nil {
		t.Fatal(err)
	}
	if err := CheckMigrations(ctx, conn); err != nil {
		t.Fatal(err)
	}
}

// TestMigrateRefusedWhileSinkRuns: an upgrade whose migrations replace
// analyst views is refused while the sink's group has members (the rows
// they insert between a view's drop and its creation would reach no
// analyst table), and applied once it has none. A new database is
// migrated whatever the group (no sink can have written it), and a
// database with nothing pending is left alone without asking.
func TestMigrateRefusedWhileSinkRuns(t *testing.T) {
	conn, _ := testenv.ClickHouseDB(t)
	ctx := ctxT(t, 2*time.Minute)
	ms, err := chschema.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	asked := 0
	running := func(context.Context) ([]string, error) { asked++; return []string{"sink-1 (/10.0.0.7)"}, nil }
	stopped := func(context.Context) ([]string, error) { asked++; return nil, nil }
	// Pending: 013_ledger_copy_keys.sql, which replaces
	// events_by_customer_mv, and every migration after it.
	first := -1
	for i, m := range ms {
		if m.Name == "013_ledger_copy_keys.sql" {
			first = i
		}
	}
	if first < 0 {
		t.Fatal("no migration 013_ledger_copy_keys.sql")
	}
	if _, err := migrate(ctx, conn, ms[:first]); err != nil {
		t.Fatal(err)
	}
	_, err = MigrateStopped(ctx, conn, running)
	if !errors.Is(err, ErrSinkRunning) || !strings.Contains(err.Error(), "sink-1 (/10.0.0.7)") ||
		!strings.Contains(err.Error(), ms[first].Name) {
		t.Fatalf("migrate while a sink runs: %v, want ErrSinkRunning naming the member and the pending migrations", err)
	}
	if err := CheckMigrations(ctx, conn); !errors.Is(err, ErrMigrationsPending) {
		t.Fatalf("after the refusal: %v, want the migrations still pending", err)
	}
	var views uint64
	if err := conn.QueryRow(ctx, "SELECT count() FROM system.tables WHERE database = currentDatabase() AND name = 'events_by_customer_mv' AND create_table_query LIKE '%record_offset%'").Scan(&views); err != nil || views != 0 {
		t.Fatalf("events_by_customer_mv replaced (%d, %v) although a sink runs", views, err)
	}
	if _, err := MigrateStopped(ctx, conn, stopped); err != nil {
		t.Fatal(err)
	}
	if err := CheckMigrations(ctx, conn); err != nil {
		t.Fatal(err)
	}
	asked = 0
	if _, err := MigrateStopped(ctx, conn, running); err != nil || asked != 0 {
		t.Fatalf("nothing pending: %v, group asked %d times, want nil and never", err, asked)
	}
	fresh, _ := testenv.ClickHouseDB(t)
	if _, err := MigrateStopped(ctx, fresh, running); err != nil || asked != 0 {
		t.Fatalf("a new database: %v, group asked %d times, want nil and never", err, asked)
	}
}

// TestMigrateWithoutDDLRights: a sink's user may be refused DDL
// (allow_ddl = 0). `meterline sink --migrate` with it, or `meterline
// migrate` run again, on a database whose migrations a DBA applied
// issues no DDL and succeeds; a pending migration is still refused by
// the server, naming the migration.
func TestMigrateWithoutDDLRights(t *testing.T) {
	addr := testenv.RealClickHouse(t)
	admin, db := testenv.ClickHouseDB(t)
	ctx := ctxT(t, 2*time.Minute)
	ms, err := chschema.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := migrate(ctx, admin, ms[:len(ms)-1]); err != nil {
		t.Fatal(err)
	}
	conn, err := clickhouse.Open(&clickhouse.Options{Addr: []string{addr}, Auth: clickhouse.Auth{Database: db, Username: "default"},
		Settings: clickhouse.Settings{"allow_ddl": 0}})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := Migrate(ctx, conn); err == nil || !strings.Contains(err.Error(), ms[len(ms)-1].Name+" pending") || !strings.Contains(err.Error(), "may create and alter tables") {
		t.Fatalf("a pending migration without DDL rights: %v, want the refusal naming %s and the fix", err, ms[len(ms)-1].Name)
	}
	if _, err := Migrate(ctx, admin); err != nil {
		t.Fatal(err)
	}
	res, err := Migrate(ctx, conn)
	if err != nil {
		t.Fatalf("nothing pending, without DDL rights: %v", err)
	}
	if len(res) != len(ms) {
		t.Fatalf("%d results, want %d", len(res), len(ms))
	}
}
