package sink

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"

	"github.com/meterline/meterline/internal/testenv"
	chschema "github.com/meterline/meterline/schemas/clickhouse"
)

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
			var wg sync.WaitGroup
			errs := make([]error, migrators)
			for k := range migrators {
				c, err := clickhouse.Open(&clickhouse.Options{Addr: []string{addr}, Auth: clickhouse.Auth{Database: db, Username: "default"},
					DialTimeout: 5 * time.Second, ReadTimeout: 60 * time.Second})
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				wg.Add(1)
				go func() {
					defer wg.Done()
					_, errs[k] = Migrate(ctx, c)
				}()
			}
			wg.Wait()
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
