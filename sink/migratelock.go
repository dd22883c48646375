package sink

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"regexp"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/ClickHouse/clickhouse-go/v2/lib/proto"
	"go.uber.org/zap"
)

// MigrateLockTable is the table a migration run holds while it applies
// migrations: one run at a time issues DDL on a database. Its rows are the
// holder's lease, (owner, expires) in the server's clock; the holder
// extends it before each statement, and drops the table when it is done.
const MigrateLockTable = "meterline_migrate_lock"

// DefaultMigrateLockWait is how long a migration run waits for the lock
// another run holds before it gives up (ErrMigrateLocked).
const DefaultMigrateLockWait = 10 * time.Minute

// The lease: how long a holder's lock stays valid after it last extended
// it (a run killed while holding it blocks others this long at most), and
// how much of it must be left when the holder checks it. A waiting run
// tries again after migrateLockFirstPoll, then twice as long each time up
// to migrateLockPoll: a run that waits for one that had little left to
// apply is not held a second longer.
const (
	migrateLease         = 3 * time.Minute
	migrateLeaseLeft     = time.Minute
	migrateLockPoll      = time.Second
	migrateLockFirstPoll = 50 * time.Millisecond
)

// ErrMigrateLocked is returned (wrapped) when another migration run held
// the migrate lock for as long as a run would wait for it.
var ErrMigrateLocked = errors.New("migrate lock held by another run")

// ErrMigrateLockLost is returned (wrapped) when a migration run finds
// that it no longer holds the migrate lock it took: its lease ran out
// (the run stalled for longer than the lease) and another run took it.
var ErrMigrateLockLost = errors.New("migrate lock lost")

// Tables that ClickHouse refuses to create or rename to, and to read.
const (
	codeTableExists  = 57
	codeUnknownTable = 60
	codeTableDropped = 218 // TABLE_IS_DROPPED: read or renamed as another run drops it
)

// lockGone reports whether err says that a lock table does not exist, or
// is being dropped (a run releasing the lock, or dropping a lease it took
// over, as this one reads or renames it).
func lockGone(err error) bool {
	return isCode(err, codeUnknownTable) || isCode(err, codeTableDropped)
}

func isCode(err error, code int32) bool {
	ex := (*proto.Exception)(nil)
	return errors.As(err, &ex) && ex.Code == code
}

// migrateLock is one migration run's claim on MigrateLockTable.
type migrateLock struct {
	conn  driver.Conn
	owner string // host, process and a random part: [A-Za-z0-9_]
	log   *zap.Logger
}

var notIdent = regexp.MustCompile(`[^A-Za-z0-9_]+`)

func newMigrateLock(conn driver.Conn, log *zap.Logger) (*migrateLock, error) {
	host, _ := os.Hostname()
	if len(host) > 40 {
		host = host[:40] // the owner is part of table names, themselves file names
	}
	var r [6]byte
	if _, err := rand.Read(r[:]); err != nil {
		return nil, err
	}
	if log == nil {
		log = zap.NewNop()
	}
	owner := notIdent.ReplaceAllString(fmt.Sprintf("%s_%d_%s", host, os.Getpid(), hex.EncodeToString(r[:])), "_")
	return &migrateLock{conn: conn, owner: owner, log: log}, nil
}

// lease is what a lock table holds: its owner, and when its lease ends
// (the latest extension).
type lease struct {
	owner   string
	expires time.Time
	expired bool  // by the server's clock
	left    int64 // seconds of the lease left, by the server's clock
	owners  uint64
}

// The lock's SQL, run unchanged on 18.16 and current releases.
func lockCreateSQL(table string) string {
	return "CREATE TABLE IF NOT EXISTS " + table + " (owner String, expires DateTime) ENGINE = Log"
}

// lockExtendSQL writes a lease of owner to table, ending migrateLease
// from now by the server's clock.
func lockExtendSQL(table, owner string) string {
	return fmt.Sprintf("INSERT INTO %s SELECT '%s', now() + %d", table, owner, int(migrateLease.Seconds()))
}

func lockRenameSQL(from, to string) string { return "RENAME TABLE " + from + " TO " + to }

// lockReadSQL reads a lock table's lease: owner, expires, the seconds
// left, and the number of owners (1, but for a lock lost in a takeover).
func lockReadSQL(table string) string {
	return "SELECT any(owner), max(expires), toInt64(max(expires)) - toInt64(now()), uniqExact(owner) FROM " + table
}

func (l *migrateLock) exec(ctx context.Context, q string) error {
	qctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return l.conn.Exec(qctx, q)
}

func (l *migrateLock) read(ctx context.Context, table string) (lease, error) {
	qctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var s lease
	err := l.conn.QueryRow(qctx, lockReadSQL(table)).
		Scan(&s.owner, &s.expires, &s.left, &s.owners)
	s.expired = s.left <= 0
	return s, err
}

// acquire takes the lock, waiting up to wait while another run holds it
// (logging once that it waits, and whom for), and takes over a lease that
// ran out. The lock appears whole: the run fills a table of its own and
// renames it to MigrateLockTable, which fails while that exists.
func (l *migrateLock) acquire(ctx context.Context, db string, wait time.Duration) error {
	own := MigrateLockTable + "_" + l.owner
	defer func() { _ = l.exec(context.WithoutCancel(ctx), "DROP TABLE IF EXISTS "+own) }()
	if err := l.exec(ctx, lockCreateSQL(own)); err != nil {
		return fmt.Errorf("sink: migrate: lock: %w", err)
	}
	deadline := time.Now().Add(wait)
	waiting := false
	poll := migrateLockFirstPoll
	for {
		err := l.exec(ctx, lockExtendSQL(own, l.owner))
		if err == nil {
			err = l.exec(ctx, lockRenameSQL(own, MigrateLockTable))
		}
		if err == nil {
			if waiting {
				l.log.Warn("migrate lock taken after waiting", zap.String("database", db), zap.String("owner", l.owner))
			}
			return nil
		}
		if !isCode(err, codeTableExists) {
			return fmt.Errorf("sink: migrate: lock: %w", err)
		}
		held, err := l.read(ctx, MigrateLockTable)
		switch {
		case lockGone(err):
			continue // released, or being taken over, since
		case err != nil:
			return fmt.Errorf("sink: migrate: read lock: %w", err)
		case held.expired:
			if err := l.takeOver(ctx, db, held); err != nil {
				return err
			}
			continue
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("sink: migrate: database %s: another migration run (%s) holds the migrate lock (table %s) until %s UTC; waited %s: %w",
				db, held.owner, MigrateLockTable, held.expires.UTC().Format(time.DateTime), wait, ErrMigrateLocked)
		}
		if !waiting {
			waiting = true
			l.log.Warn("waiting for the migrate lock: another migration run applies migrations",
				zap.String("database", db), zap.String("holder", held.owner), zap.Time("lease_until", held.expires),
				zap.Duration("wait", wait))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(poll):
		}
		poll = min(2*poll, migrateLockPoll)
	}
}

// takeOver moves aside a lock whose lease ran out (its holder was killed,
// or stalled). Of the runs that try, one renames it; it checks that what
// it renamed is the lease it found run out (not one taken since), drops
// it, and competes for the lock again like any run.
func (l *migrateLock) takeOver(ctx context.Context, db string, stale lease) error {
	aside := MigrateLockTable + "_expired_" + l.owner
	if err := l.exec(ctx, "DROP TABLE IF EXISTS "+aside); err != nil {
		return fmt.Errorf("sink: migrate: take over lock: %w", err)
	}
	if err := l.exec(ctx, lockRenameSQL(MigrateLockTable, aside)); lockGone(err) {
		return nil // another run took it over first
	} else if err != nil {
		return fmt.Errorf("sink: migrate: take over lock: %w", err)
	}
	got, err := l.read(ctx, aside)
	if err != nil {
		return fmt.Errorf("sink: migrate: take over lock: %w", err)
	}
	if got.owner == stale.owner && got.expired {
		l.log.Warn("migrate lock taken over: its holder's lease ran out",
			zap.String("database", db), zap.String("holder", stale.owner), zap.Time("lease_until", stale.expires))
		return l.exec(ctx, "DROP TABLE "+aside)
	}
	// Another run's live lock, taken in between: give it back.
	if err := l.exec(ctx, lockRenameSQL(aside, MigrateLockTable)); err != nil {
		l.log.Warn("migrate lock: could not give back a live lock renamed while taking over an expired one; its holder stops",
			zap.String("database", db), zap.String("holder", got.owner), zap.Error(err))
		return l.exec(ctx, "DROP TABLE IF EXISTS "+aside)
	}
	return nil
}

// renew checks that the run holds the lock with migrateLeaseLeft of its
// lease to spare (a run taking over waits for the lease to run out), then
// extends the lease.
func (l *migrateLock) renew(ctx context.Context) error {
	if err := l.check(ctx); err != nil {
		return err
	}
	if err := l.exec(ctx, lockExtendSQL(MigrateLockTable, l.owner)); err != nil {
		return fmt.Errorf("sink: migrate: extend lock: %w", err)
	}
	return nil
}

// check returns nil while the run holds the lock with at least
// migrateLeaseLeft of its lease left.
func (l *migrateLock) check(ctx context.Context) error {
	held, err := l.read(ctx, MigrateLockTable)
	if lockGone(err) {
		return fmt.Errorf("sink: migrate: %s is gone: %w", MigrateLockTable, ErrMigrateLockLost)
	} else if err != nil {
		return fmt.Errorf("sink: migrate: read lock: %w", err)
	}
	if held.owners != 1 || held.owner != l.owner {
		return fmt.Errorf("sink: migrate: %s is held by %s, not this run (%s): %w", MigrateLockTable, held.owner, l.owner, ErrMigrateLockLost)
	}
	if held.left < int64(migrateLeaseLeft.Seconds()) {
		return fmt.Errorf("sink: migrate: this run's lease on %s ends at %s UTC: %w", MigrateLockTable, held.expires.UTC().Format(time.DateTime), ErrMigrateLockLost)
	}
	return nil
}

// release drops the lock while the run holds it with time to spare; a
// lease that ran out is left to expire (another run may be taking it over).
func (l *migrateLock) release(ctx context.Context) {
	if err := l.check(ctx); err != nil {
		l.log.Warn("migrate lock not released", zap.Error(err))
		return
	}
	if err := l.exec(ctx, "DROP TABLE "+MigrateLockTable); err != nil {
		l.log.Warn("migrate lock not released: it expires on its own", zap.Error(err))
	}
}
