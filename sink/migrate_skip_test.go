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

// readThenOther is a migration run's connection during which, right after
// the run first reads what is applied, another run applies every
// migration and finishes (as a second sink started with --migrate a
// moment earlier may, then starting its sink); it keeps the statements
// the run issues after that.
type readThenOther struct {
	driver.Conn
	other func() error
	done  bool
	ddl   []string
}

func (c *readThenOther) Query(ctx context.Context, q string, args ...any) (driver.Rows, error) {
	rows, err := c.Conn.Query(ctx, q, args...)
	if err == nil && !c.done && strings.Contains(q, MigrationsTable) {
		c.done = true
		if oerr := c.other(); oerr != nil {
			rows.Close()
			return nil, oerr
		}
	}
	return rows, err
}

func (c *readThenOther) Exec(ctx context.Context, q string, args ...any) error {
	if !strings.Contains(q, MigrationsTable) {
		c.ddl = append(c.ddl, q)
	}
	return c.Conn.Exec(ctx, q, args...)
}

// TestMigrateSkipsWhatAnotherRunApplied: a migration run that has issued
// no DDL yet skips the migrations another run applied and recorded since
// it read what was applied. That run may have started its sink, and those
// that replace an analyst view drop it (or its table) and create it again:
// a row the sink writes in between reaches no analyst table.
func TestMigrateSkipsWhatAnotherRunApplied(t *testing.T) {
	conn, _ := testenv.ClickHouseDB(t)
	ctx := ctxT(t, 2*time.Minute)
	ms, err := chschema.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	first := len(ms) - 3 // the last three: one adds a table, two replace a view
	if _, err := migrate(ctx, conn, ms[:first]); err != nil {
		t.Fatal(err)
	}
	c := &readThenOther{Conn: conn, other: func() error {
		_, err := migrate(ctx, conn, ms)
		return err
	}}
	res, err := migrate(ctx, c, ms)
	if err != nil {
		t.Fatal(err)
	}
	if !c.done {
		t.Fatal("the other run never ran")
	}
	if len(res) != len(ms) {
		t.Fatalf("%d results, want %d", len(res), len(ms))
	}
	for _, r := range res {
		if r.Applied {
			t.Errorf("%s applied again after another run applied it", r.Migration.Name)
		}
	}
	for _, q := range c.ddl {
		t.Errorf("after another run applied every migration, this one ran %.80q", q)
	}
	applied, err := appliedMigrations(ctx, conn, MigrationsTable)
	if err != nil {
		t.Fatal(err)
	}
	if len(applied) != len(ms) {
		t.Errorf("%d migrations recorded, want %d", len(applied), len(ms))
	}
}
