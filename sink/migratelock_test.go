package sink

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/ClickHouse/clickhouse-go/v2/lib/proto"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/meterline/meterline/internal/testenv"
	chschema "github.com/meterline/meterline/schemas/clickhouse"
)

// migrateAtOnce runs migrators MigrateWith at once on db, each on its own
// connection, and returns their results and errors.
func migrateAtOnce(ctx context.Context, t *testing.T, addr, db string, migrators int, o MigrateOptions) ([][]MigrationResult, []error) {
	t.Helper()
	res := make([][]MigrationResult, migrators)
	errs := make([]error, migrators)
	start := make(chan struct{})
	var wg sync.WaitGroup
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
			<-start
			res[k], errs[k] = MigrateWith(ctx, c, o)
		}()
	}
	close(start)
	wg.Wait()
	return res, errs
}

// checkAppliedOnce checks that every migration run succeeded, that each
// migration was applied by exactly one of them and recorded once, and
// that the database has the schema of one run alone (want), the lock
// table gone.
func checkAppliedOnce(ctx context.Context, t *testing.T, conn driver.Conn, round int, res [][]MigrationResult, errs []error, want string) {
	t.Helper()
	ms, err := chschema.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	for k, err := range errs {
		if err != nil {
			t.Errorf("round %d: migrator %d: %v", round, k, err)
		}
	}
	appliedBy := map[string][]int{}
	for k, rs := range res {
		for _, r := range rs {
			if r.Applied {
				appliedBy[r.Migration.Name] = append(appliedBy[r.Migration.Name], k)
			}
		}
	}
	for _, m := range ms {
		if n := len(appliedBy[m.Name]); n != 1 {
			t.Errorf("round %d: %s applied by %d runs %v, want one", round, m.Name, n, appliedBy[m.Name])
		}
	}
	if got, err := tsv(ctx, conn, "SELECT version, count() FROM "+MigrationsTable+" GROUP BY version HAVING count() > 1 ORDER BY version"); err != nil || got != "" {
		t.Errorf("round %d: versions recorded more than once (version, rows): %q %v", round, got, err)
	}
	if err := CheckMigrations(ctx, conn); err != nil {
		t.Errorf("round %d: %v", round, err)
	}
	if got := describeDatabase(ctx, t, conn); got != want {
		t.Errorf("round %d, migrators at once:\n%s\nwant (one migrator):\n%s", round, got, want)
	}
}

func oneRunSchema(t *testing.T) string {
	t.Helper()
	conn, _ := testenv.ClickHouseDB(t)
	ctx := ctxT(t, 2*time.Minute)
	if _, err := Migrate(ctx, conn); err != nil {
		t.Fatal(err)
	}
	return describeDatabase(ctx, t, conn)
}

// TestMigrateNewDatabaseConcurrently starts several `meterline migrate`
// at once on a new database, each on its own connection (two deploys
// starting together), round after round: every one succeeds, each
// migration is applied by one of them and recorded once, and the database
// ends with the schema of one run alone. Without the lock every run
// applied every migration, the view-replacing ones included, each after
// another run had finished and its sink could write (docs/operations.md,
// Running the stages).
func TestMigrateNewDatabaseConcurrently(t *testing.T) {
	addr := testenv.RealClickHouse(t)
	want := oneRunSchema(t)
	const migrators, rounds = 3, 5
	for r := range rounds {
		conn, db := testenv.ClickHouseDB(t)
		ctx := ctxT(t, 3*time.Minute)
		res, errs := migrateAtOnce(ctx, t, addr, db, migrators, MigrateOptions{})
		checkAppliedOnce(ctx, t, conn, r, res, errs, want)
	}
}

// TestMigrateTakesOverExpiredLock: a lock left by a run killed while it
// held it, its lease run out, is taken over by one of several runs
// started at once (one logs it); each migration is applied once.
func TestMigrateTakesOverExpiredLock(t *testing.T) {
	addr := testenv.RealClickHouse(t)
	want := oneRunSchema(t)
	conn, db := testenv.ClickHouseDB(t)
	ctx := ctxT(t, 3*time.Minute)
	for _, s := range []string{lockCreateSQL(MigrateLockTable),
		"INSERT INTO " + MigrateLockTable + " SELECT 'killed_run', now() - 5"} {
		if err := conn.Exec(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	core, logs := observer.New(zapcore.InfoLevel)
	res, errs := migrateAtOnce(ctx, t, addr, db, 3, MigrateOptions{Database: db, Log: zap.New(core)})
	checkAppliedOnce(ctx, t, conn, 0, res, errs, want)
	took := logs.FilterMessageSnippet("taken over").All()
	if len(took) != 1 || took[0].ContextMap()["holder"] != "killed_run" {
		t.Errorf("take-over log lines: %v, want one naming killed_run", took)
	}
}

// TestMigrateWaitsForLock: while another run holds the lock, a run waits
// (one log line naming the holder) up to its bound and then fails with
// ErrMigrateLocked, having issued no migration; a run that waits longer
// applies the migrations once the holder releases the lock.
func TestMigrateWaitsForLock(t *testing.T) {
	conn, db := testenv.ClickHouseDB(t)
	ctx := ctxT(t, 2*time.Minute)
	other, err := newMigrateLock(conn, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := other.acquire(ctx, db, time.Second); err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zapcore.InfoLevel)
	o := MigrateOptions{Database: db, Log: zap.New(core), LockWait: 3 * time.Second}
	began := time.Now()
	_, err = MigrateWith(ctx, conn, o)
	if !errors.Is(err, ErrMigrateLocked) || !strings.Contains(err.Error(), other.owner) {
		t.Fatalf("err = %v, want ErrMigrateLocked naming %s", err, other.owner)
	}
	if d := time.Since(began); d < 3*time.Second || d > 10*time.Second {
		t.Errorf("gave up after %s, want about 3s", d)
	}
	if w := logs.FilterMessageSnippet("waiting for the migrate lock").All(); len(w) != 1 || w[0].ContextMap()["holder"] != other.owner {
		t.Errorf("wait log lines: %v, want one naming %s", w, other.owner)
	}
	var n uint8
	if err := conn.QueryRow(ctx, "EXISTS TABLE "+MigrationsTable).Scan(&n); err != nil || n != 0 {
		t.Fatalf("migrations table exists: %d %v; want none while the other run holds the lock", n, err)
	}
	time.AfterFunc(2*time.Second, func() { other.release(context.Background()) })
	o.LockWait = time.Minute
	res, err := MigrateWith(ctx, conn, o)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res {
		if !r.Applied {
			t.Errorf("%s not applied", r.Migration.Name)
		}
	}
	if err := CheckMigrations(ctx, conn); err != nil {
		t.Fatal(err)
	}
	if err := conn.QueryRow(ctx, "EXISTS TABLE "+MigrateLockTable).Scan(&n); err != nil || n != 0 {
		t.Errorf("lock table left: %d %v", n, err)
	}
}

// TestMigrateLockChdb runs the lock's statements on a current release
// (chdb): a lock taken by renaming a run's filled table, its lease read,
// and a second run's rename refused while the lock exists.
func TestMigrateLockChdb(t *testing.T) {
	python := testenv.Chdb(t)
	ctx := ctxT(t, 5*time.Minute)
	a, b := MigrateLockTable+"_a", MigrateLockTable+"_b"
	stmts := []string{lockCreateSQL(a), lockExtendSQL(a, "a"), lockRenameSQL(a, MigrateLockTable),
		lockExtendSQL(MigrateLockTable, "a"), lockCreateSQL(b), lockExtendSQL(b, "b")}
	resp, err := runChdb(ctx, python, chdbRequest{Path: t.TempDir(), Database: "lock", Statements: stmts,
		Queries: []string{lockReadSQL(MigrateLockTable), lockReadSQL(b)}})
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []string{"a", "b"} {
		f := strings.Split(strings.TrimSpace(resp.Results[i]), "\t")
		if len(f) != 4 || f[0] != want || f[3] != "1" {
			t.Fatalf("chdb %s: lease %q, want owner %s, one owner", resp.Version, resp.Results[i], want)
		}
		var left int
		if _, err := fmt.Sscan(f[2], &left); err != nil || left < 170 || left > 180 {
			t.Errorf("chdb %s: %q: %d s left, want about %s", resp.Version, resp.Results[i], left, migrateLease)
		}
	}
	_, err = runChdb(ctx, python, chdbRequest{Path: t.TempDir(), Database: "lock",
		Statements: append(stmts, lockRenameSQL(b, MigrateLockTable))})
	if err == nil || !strings.Contains(err.Error(), "already exists") {
		t.Fatalf("chdb: a second lock renamed onto the first: %v, want refused (already exists)", err)
	}
}

// TestMigrateLockReadWhileDropped: a lock read while its holder drops it
// (a release, or a lease taken over) is a lock gone (lockGone), which a
// waiting run tries to take again. 18.16 answers such a read
// UNKNOWN_TABLE (60) or, in the middle of the drop, TABLE_IS_DROPPED
// (218), which failed TestMigrateConcurrently's upgrade ("read lock:
// code: 218, message: Table is dropped").
func TestMigrateLockReadWhileDropped(t *testing.T) {
	conn, _ := testenv.ClickHouseDB(t)
	ctx := ctxT(t, 3*time.Minute)
	lock, err := newMigrateLock(conn, nil)
	if err != nil {
		t.Fatal(err)
	}
	const drops = 300
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range drops {
			if err := lock.exec(ctx, lockCreateSQL(MigrateLockTable)); err != nil {
				t.Error(err)
				return
			}
			if err := lock.exec(ctx, lockExtendSQL(MigrateLockTable, lock.owner)); err != nil {
				t.Error(err)
				return
			}
			if err := lock.exec(ctx, "DROP TABLE "+MigrateLockTable); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	codes := map[int32]int{}
	for reads := 0; ; reads++ {
		select {
		case <-done:
			t.Logf("%d reads; codes of failed ones: %v", reads, codes)
			return
		default:
		}
		_, err := lock.read(ctx, MigrateLockTable)
		if ex := (*proto.Exception)(nil); errors.As(err, &ex) {
			codes[ex.Code]++
		}
		if err != nil && !lockGone(err) {
			t.Errorf("a read of the lock as it is dropped: %v, not a lock gone", err)
			<-done
			return
		}
	}
}
