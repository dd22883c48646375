package sink

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/ClickHouse/clickhouse-go/v2/lib/proto"
	"go.uber.org/zap"

	chschema "github.com/meterline/meterline/schemas/clickhouse"
)

// MigrationsTable records the applied migrations, one row per version.
const MigrationsTable = "meterline_migrations"

// ErrMigrationsPending is returned (wrapped) by CheckMigrations when the
// database lacks migrations this binary needs: run `meterline migrate`.
var ErrMigrationsPending = errors.New("migrations pending")

// ErrMigrationChanged is returned (wrapped) when an applied migration's
// recorded checksum differs from the embedded file: applied migrations
// must never be edited; add a new one instead.
var ErrMigrationChanged = errors.New("applied migration changed")

// MigrationResult is what Migrate did with one migration.
type MigrationResult struct {
	Migration chschema.Migration
	Applied   bool // false: it was applied before
}

const ddlTimeout = time.Minute

// Migrate applies the embedded migrations that the database (conn's
// default database) has not applied yet, in order, and records each one
// after all its statements succeeded. It is idempotent: a second run
// applies nothing. A migration interrupted half-way is re-run whole, which
// is why its statements must be re-runnable (package schemas/clickhouse):
// an ALTER TABLE ... ADD COLUMN (with at most a MODIFY ORDER BY) that
// fails because it is applied already (its columns there with its types,
// the sort key it sets) counts as applied (18.16 has no IF NOT
// EXISTS on ALTER columns; a run killed between that ALTER and its record,
// or two runs at once, would otherwise fail on it forever); the schema is
// read again for a few seconds while another run's DDL is under way
// (columnsAdded). It applies
// nothing on a server whose time zone is not UTC (ErrServerTimeZone).
func Migrate(ctx context.Context, conn driver.Conn) ([]MigrationResult, error) {
	return MigrateStopped(ctx, conn, nil)
}

// MigrateStopped is Migrate on a database whose sinks must be stopped:
// MigrateWith with sinkMembers.
func MigrateStopped(ctx context.Context, conn driver.Conn, sinkMembers func(context.Context) ([]string, error)) ([]MigrationResult, error) {
	return MigrateWith(ctx, conn, MigrateOptions{SinkMembers: sinkMembers})
}

// MigrateOptions are the options of MigrateWith.
type MigrateOptions struct {
	// SinkMembers returns the members of the sink's consumer group. When
	// a migration is pending on a database that has applied others (one
	// a sink may be writing), MigrateWith applies nothing while there are
	// any (ErrSinkRunning). A migration that replaces an analyst table's
	// view drops it and creates it again, and a row a running sink
	// inserts in between never reaches the table (docs/operations.md,
	// Running the stages). nil: no check.
	SinkMembers func(context.Context) ([]string, error)
	// LockWait bounds the wait for the migrate lock another run holds
	// (0: DefaultMigrateLockWait); past it, ErrMigrateLocked.
	LockWait time.Duration
	// Database names the database in log lines and errors.
	Database string
	Log      *zap.Logger // nil: none
}

// MigrateWith is Migrate with options. When nothing is pending it issues
// no DDL, so a user without DDL rights may run it. Otherwise it takes the
// migrate lock (MigrateLockTable) first, waiting while another run holds
// it, and reads again what is applied once it holds it: one run at a time
// issues DDL, and a run that waited applies only what the other left.
func MigrateWith(ctx context.Context, conn driver.Conn, o MigrateOptions) ([]MigrationResult, error) {
	ms, err := chschema.Migrations()
	if err != nil {
		return nil, err
	}
	if err := CheckTimeZone(ctx, conn); err != nil {
		return nil, err
	}
	_, pending, err := readApplied(ctx, conn, MigrationsTable, ms)
	if err != nil {
		return nil, err
	}
	if len(pending) == 0 {
		return noneApplied(ms), nil
	}
	res, err := migrateLocked(ctx, conn, ms, o)
	if ex := (*proto.Exception)(nil); errors.As(err, &ex) && (ex.Code == 392 || ex.Code == 164) {
		// DDL refused (allow_ddl = 0, readonly).
		err = fmt.Errorf("%w: %s pending; apply them as a ClickHouse user that may create and alter tables (`meterline migrate --clickhouse-user ...`)",
			err, strings.Join(pending, ", "))
	}
	return res, err
}

// readApplied reads the applied migrations from table, the migrations
// table (none when it does not exist: a new database), checks that none of
// ms changed, and returns the names of those of ms not applied.
func readApplied(ctx context.Context, conn driver.Conn, table string, ms []chschema.Migration) (map[int]appliedMigration, []string, error) {
	qctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	// EXISTS reads the one table: 18.16's system.tables fails when a table
	// of the database is dropped while it reads (a concurrent run's DROP
	// of a view).
	var n uint8
	err := conn.QueryRow(qctx, `EXISTS TABLE `+table).Scan(&n)
	cancel()
	if err != nil {
		return nil, nil, fmt.Errorf("sink: check migrations: %w", err)
	}
	applied := map[int]appliedMigration{}
	if n > 0 {
		if applied, err = appliedMigrations(ctx, conn, table); err != nil {
			return nil, nil, err
		}
	}
	if err := checkApplied(ms, applied); err != nil {
		return nil, nil, err
	}
	var pending []string
	for _, m := range ms {
		if _, ok := applied[m.Version]; !ok {
			pending = append(pending, m.Name)
		}
	}
	return applied, pending, nil
}

func noneApplied(ms []chschema.Migration) []MigrationResult {
	out := make([]MigrationResult, len(ms))
	for i, m := range ms {
		out[i] = MigrationResult{Migration: m}
	}
	return out
}

// migrateLocked takes the migrate lock, reads again what is applied (a
// run it waited for may have applied everything: then it issues no DDL
// and asks no sink group), checks that no sink runs, and migrates.
func migrateLocked(ctx context.Context, conn driver.Conn, ms []chschema.Migration, o MigrateOptions) ([]MigrationResult, error) {
	wait := o.LockWait
	if wait <= 0 {
		wait = DefaultMigrateLockWait
	}
	lock, err := newMigrateLock(conn, o.Log)
	if err != nil {
		return nil, err
	}
	if err := lock.acquire(ctx, o.Database, wait); err != nil {
		return nil, err
	}
	defer lock.release(context.WithoutCancel(ctx))
	applied, pending, err := readApplied(ctx, conn, MigrationsTable, ms)
	if err != nil {
		return nil, err
	}
	if len(pending) == 0 {
		return noneApplied(ms), nil
	}
	if len(applied) > 0 && o.SinkMembers != nil {
		members, err := o.SinkMembers(ctx)
		if err != nil {
			return nil, fmt.Errorf("sink: migrate: check that no sink runs: %w", err)
		}
		if len(members) > 0 {
			return nil, fmt.Errorf("sink: migrate: %s pending, and the sink's consumer group has members (%s): stop every sink, migrate, then start the sinks of this build: %w",
				strings.Join(pending, ", "), strings.Join(members, ", "), ErrSinkRunning)
		}
	}
	return migrateHeld(ctx, conn, ms, lock.renew)
}

// migrate applies ms without the migrate lock.
func migrate(ctx context.Context, conn driver.Conn, ms []chschema.Migration) ([]MigrationResult, error) {
	return migrateHeld(ctx, conn, ms, nil)
}

// migrateHeld applies the migrations of ms not applied yet; renew (nil:
// none) extends the migrate lock's lease before each statement, and
// stops the run when it no longer holds the lock.
func migrateHeld(ctx context.Context, conn driver.Conn, ms []chschema.Migration, renew func(context.Context) error) ([]MigrationResult, error) {
	cctx, cancel := context.WithTimeout(ctx, ddlTimeout)
	err := conn.Exec(cctx, `CREATE TABLE IF NOT EXISTS `+MigrationsTable+` (
		version UInt32, name String, checksum String, applied_at DateTime
	) ENGINE = ReplacingMergeTree ORDER BY version`)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("sink: migrate: create %s: %w", MigrationsTable, err)
	}
	applied, _, err := readApplied(ctx, conn, MigrationsTable, ms)
	if err != nil {
		return nil, err
	}
	var out []MigrationResult
	ran := false // this run has issued a migration's statements
	for _, m := range ms {
		if _, ok := applied[m.Version]; !ok && !ran {
			// Until it issues DDL, a run reads again what is applied before
			// each migration: another run (a sink started with --migrate
			// beside this one) may have applied and recorded it since, and
			// started its sink, under which running it again would drop and
			// create views and tables. Once it has issued DDL, a run runs
			// every later migration, recorded or not: its statements may
			// have undone what another run applied after them.
			if applied, _, err = readApplied(ctx, conn, MigrationsTable, ms); err != nil {
				return out, err
			}
		}
		if _, ok := applied[m.Version]; ok {
			out = append(out, MigrationResult{Migration: m})
			continue
		}
		ran = true
		if err := runStatements(ctx, conn, m, renew); err != nil {
			return out, err
		}
		if err := recordMigration(ctx, conn, m); err != nil {
			return out, err
		}
		out = append(out, MigrationResult{Migration: m, Applied: true})
	}
	return out, nil
}

// runStatements runs the statements of m, in order, each after renew
// (nil: none); it does not record m.
func runStatements(ctx context.Context, conn driver.Conn, m chschema.Migration, renew func(context.Context) error) error {
	for i, stmt := range m.Statements {
		if renew != nil {
			if err := renew(ctx); err != nil {
				return err
			}
		}
		sctx, cancel := context.WithTimeout(ctx, ddlTimeout)
		err := conn.Exec(sctx, stmt)
		cancel()
		if err != nil {
			if done, cerr := columnsAdded(ctx, conn, stmt); cerr != nil || !done {
				return fmt.Errorf("sink: migrate: %s statement %d: %w", m.Name, i+1, err)
			}
			// An ALTER ... ADD COLUMN that an earlier run (killed
			// before it recorded the migration) or a concurrent one
			// already applied: 18.16 has no IF NOT EXISTS there.
		}
	}
	return nil
}

var (
	alterTable = regexp.MustCompile(`(?s)^ALTER TABLE ([A-Za-z0-9_]+)\s+(.*)$`)
	addColumn  = regexp.MustCompile(`(?s)^ADD COLUMN\s+([A-Za-z0-9_]+)\s+([A-Za-z0-9_]+(?:\([^)]*\))?)(?:\s.*)?$`)
	orderBy    = regexp.MustCompile(`(?s)^MODIFY ORDER BY\s+(.*)$`)
)

// addColumns is an ALTER TABLE made of ADD COLUMN clauses and at most a
// MODIFY ORDER BY.
type addColumns struct {
	table   string
	cols    map[string]string // name: type
	sortKey string            // "": none set
}

// parseAddColumns returns stmt as an addColumns, or nil when it is
// another statement.
func parseAddColumns(stmt string) *addColumns {
	t := alterTable.FindStringSubmatch(stmt)
	if t == nil {
		return nil
	}
	a := &addColumns{table: t[1], cols: map[string]string{}}
	for _, c := range splitTopLevel(t[2]) {
		if m := addColumn.FindStringSubmatch(c); m != nil {
			a.cols[m[1]] = m[2]
		} else if m := orderBy.FindStringSubmatch(c); m != nil && a.sortKey == "" {
			a.sortKey = m[1]
		} else {
			return nil
		}
	}
	if len(a.cols) == 0 {
		return nil
	}
	return a
}

// Re-checking a failed ALTER: the attempts, and the wait after each that
// did not find it applied.
const (
	alterChecks    = 10
	alterCheckWait = 500 * time.Millisecond
)

// columnsAdded reports whether stmt is an ALTER TABLE made of ADD COLUMN
// clauses (and at most a MODIFY ORDER BY) that is applied already: its
// columns all exist with the types it names, and the table's sort key is
// the one it sets. One ALTER applies all its clauses or none. A check
// that fails, or finds the ALTER not applied, is made again after a short
// wait, up to alterChecks times: another run's DDL may be under way (18.16
// fails a read of system.tables while a table of the database is being
// dropped, and an ALTER is not transactional). The last error, if any, is
// returned.
func columnsAdded(ctx context.Context, conn driver.Conn, stmt string) (bool, error) {
	a := parseAddColumns(stmt)
	if a == nil {
		return false, nil
	}
	var err error
	for i := range alterChecks {
		if i > 0 {
			select {
			case <-ctx.Done():
				return false, errors.Join(err, ctx.Err())
			case <-time.After(alterCheckWait):
			}
		}
		var done bool
		if done, err = a.applied(ctx, conn); done && err == nil {
			return true, nil
		}
	}
	return false, err
}

// applied reports whether the table has a's columns with their types and
// the sort key a sets.
func (a *addColumns) applied(ctx context.Context, conn driver.Conn) (bool, error) {
	qctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	// DESCRIBE reads the one table: 18.16's system.columns fails when a
	// table of the database is dropped while it reads (another run's DROP
	// of a view).
	rows, err := conn.Query(qctx, "DESCRIBE TABLE "+a.table)
	if err != nil {
		return false, err
	}
	defer rows.Close()
	have := map[string]string{}
	// name, type, then columns that differ between releases: all String.
	row := make([]any, len(rows.Columns()))
	for i := range row {
		row[i] = new(string)
	}
	for rows.Next() {
		if len(row) < 2 {
			return false, fmt.Errorf("DESCRIBE TABLE %s: %d columns", a.table, len(row))
		}
		if err := rows.Scan(row...); err != nil {
			return false, err
		}
		have[*row[0].(*string)] = *row[1].(*string)
	}
	if err := rows.Err(); err != nil {
		return false, err
	}
	for name, typ := range a.cols {
		if got, ok := have[name]; !ok || compact(got) != compact(typ) {
			return false, nil
		}
	}
	if a.sortKey == "" {
		return true, nil
	}
	// SHOW CREATE TABLE reads the one table too. A read of system.tables
	// that meets a table being dropped fails on 18.16, and the server may
	// then abort ("pure virtual method called").
	var create string
	if err := conn.QueryRow(qctx, "SHOW CREATE TABLE "+a.table).Scan(&create); err != nil {
		return false, err
	}
	got, ok := sortingKey(create)
	if !ok {
		return false, fmt.Errorf("SHOW CREATE TABLE %s: no ORDER BY in %.200q", a.table, create)
	}
	return bareKey(got) == bareKey(a.sortKey), nil
}

// sortingKey returns the ORDER BY expression of a MergeTree table's
// CREATE statement (SHOW CREATE TABLE), and whether it has one.
func sortingKey(create string) (string, bool) {
	engine := strings.Index(create, "ENGINE = ")
	if engine < 0 {
		return "", false
	}
	rest := create[engine:]
	at := strings.Index(rest, " ORDER BY ")
	if nl := strings.Index(rest, "\nORDER BY "); nl >= 0 && (at < 0 || nl < at) {
		at = nl
	}
	if at < 0 {
		return "", false
	}
	rest = strings.TrimSpace(rest[at+len(" ORDER BY "):])
	depth := 0
	for i, c := range rest {
		switch {
		case c == '(':
			depth++
		case c == ')':
			depth--
			if depth == 0 && strings.HasPrefix(rest, "(") {
				return rest[:i+1], true
			}
		case depth == 0 && (c == ' ' || c == '\n'):
			return rest[:i], true
		}
	}
	return rest, rest != ""
}

// bareKey is a sort key without white space and without the parentheses
// around the whole of it: system.tables' sorting_key and the ORDER BY of a
// statement name one key alike.
func bareKey(key string) string {
	k := compact(key)
	if !strings.HasPrefix(k, "(") {
		return k
	}
	depth := 0
	for i, c := range k {
		switch c {
		case '(':
			depth++
		case ')':
			depth--
			if depth == 0 && i < len(k)-1 {
				return k // "(a)+(b)": the parentheses are not the whole key's
			}
		}
	}
	return k[1 : len(k)-1]
}

// splitTopLevel cuts s at the commas outside parentheses, trimmed.
func splitTopLevel(s string) []string {
	var out []string
	depth, from := 0, 0
	for i, c := range s {
		switch c {
		case '(':
			depth++
		case ')':
			depth--
		case ',':
			if depth == 0 {
				out = append(out, strings.TrimSpace(s[from:i]))
				from = i + 1
			}
		}
	}
	return append(out, strings.TrimSpace(s[from:]))
}

// compact drops the white space of a type or an expression.
func compact(s string) string { return strings.Join(strings.Fields(s), "") }

type appliedMigration struct{ name, checksum string }

func appliedMigrations(ctx context.Context, conn driver.Conn, table string) (map[int]appliedMigration, error) {
	qctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	rows, err := conn.Query(qctx, `SELECT version, any(name), any(checksum) FROM `+table+` GROUP BY version`)
	if err != nil {
		return nil, fmt.Errorf("sink: read %s: %w", MigrationsTable, err)
	}
	defer rows.Close()
	out := map[int]appliedMigration{}
	for rows.Next() {
		var v uint32
		var a appliedMigration
		if err := rows.Scan(&v, &a.name, &a.checksum); err != nil {
			return nil, fmt.Errorf("sink: read %s: %w", MigrationsTable, err)
		}
		out[int(v)] = a
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("sink: read %s: %w", MigrationsTable, err)
	}
	return out, nil
}

func checkApplied(ms []chschema.Migration, applied map[int]appliedMigration) error {
	var errs []error
	for _, m := range ms {
		a, ok := applied[m.Version]
		if ok && a.checksum != m.Checksum {
			errs = append(errs, fmt.Errorf("sink: migration %s was applied with checksum %.12s…, the embedded file has %.12s…: %w",
				m.Name, a.checksum, m.Checksum, ErrMigrationChanged))
		}
	}
	return errors.Join(errs...)
}

func recordMigration(ctx context.Context, conn driver.Conn, m chschema.Migration) error {
	ictx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	b, err := conn.PrepareBatch(ictx, `INSERT INTO `+MigrationsTable+` (version, name, checksum, applied_at)`)
	if err != nil {
		return fmt.Errorf("sink: migrate: record %s: %w", m.Name, err)
	}
	if err := b.Append(uint32(m.Version), m.Name, m.Checksum, time.Now().UTC()); err != nil {
		_ = b.Abort()
		return fmt.Errorf("sink: migrate: record %s: %w", m.Name, err)
	}
	if err := b.Send(); err != nil {
		return fmt.Errorf("sink: migrate: record %s: %w", m.Name, err)
	}
	return nil
}

// CheckMigrations returns nil when every embedded migration is applied,
// unchanged, in conn's default database; otherwise an error naming the
// pending (ErrMigrationsPending) or changed (ErrMigrationChanged) ones.
// The sink checks it before it starts, and so do verify and
// AcceptOffsets (checkMigrationsIn) before they read a table: each reads
// and writes the columns of every migration.
func CheckMigrations(ctx context.Context, conn driver.Conn) error {
	return checkMigrationsIn(ctx, conn, MigrationsTable)
}

// checkMigrationsIn is CheckMigrations with the migrations table named by
// the caller: db.meterline_migrations for the commands that name their
// database in every query.
func checkMigrationsIn(ctx context.Context, conn driver.Conn, table string) error {
	ms, err := chschema.Migrations()
	if err != nil {
		return err
	}
	_, pending, err := readApplied(ctx, conn, table, ms)
	if err != nil {
		return err
	}
	if len(pending) > 0 {
		return fmt.Errorf("sink: %s not applied (run `meterline migrate`): %w", strings.Join(pending, ", "), ErrMigrationsPending)
	}
	return nil
}
