package cli

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/meterline/meterline/internal/testenv"
	chschema "github.com/meterline/meterline/schemas/clickhouse"
	"github.com/meterline/meterline/sink"
)

// TestMigrateCommand runs `meterline migrate` twice on a database that does
// not exist yet: the first run creates it and applies every migration, the
// second applies nothing; the sink then finds its migrations applied.
func TestMigrateCommand(t *testing.T) {
	addr := testenv.RealClickHouse(t)
	db := fmt.Sprintf("cli_migrate_%d_%d", os.Getpid(), time.Now().UnixNano()%1e9)
	ms, err := chschema.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	code, out, errOut := run(t, "", "migrate", "--clickhouse", addr, "--database", db)
	if code != 0 || !strings.Contains(out, fmt.Sprintf("%d applied now, %d in total", len(ms), len(ms))) ||
		strings.Contains(out, "backfill") {
		t.Fatalf("first migrate: exit %d\n%s\n%s", code, out, errOut)
	}
	for _, m := range ms {
		if !strings.Contains(out, m.Name+": applied") {
			t.Errorf("first migrate does not report %s applied:\n%s", m.Name, out)
		}
	}
	code, out, errOut = run(t, "", "migrate", "--clickhouse", addr, "--database", db)
	if code != 0 || !strings.Contains(out, "001_tables.sql: already applied") || !strings.Contains(out, " 0 applied now") {
		t.Fatalf("second migrate: exit %d\n%s\n%s", code, out, errOut)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := sink.Dial(ctx, addr, db, false)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := sink.CheckMigrations(ctx, conn); err != nil {
		t.Fatal(err)
	}
	if err := conn.Exec(ctx, "DROP DATABASE "+db); err != nil {
		t.Fatal(err)
	}
}

// TestSinkValidate checks flags without connecting anywhere, and names the
// bad field.
func TestSinkValidate(t *testing.T) {
	code, out, errOut := run(t, "", "sink", "--validate", "--instance-id", "a")
	if code != 0 || !strings.Contains(out, "configuration ok") {
		t.Fatalf("exit %d\n%s\n%s", code, out, errOut)
	}
	code, _, errOut = run(t, "", "sink", "--validate", "--instance-id", "a", "--insert-timeout", "2m", "--database", "bad-name")
	if code != 2 || !strings.Contains(errOut, "sink: insert-timeout: 2m0s") || !strings.Contains(errOut, "sink: database: \"bad-name\"") {
		t.Fatalf("exit %d, want 2 naming insert-timeout and database:\n%s", code, errOut)
	}
}
