package testenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
)

// ClickHouseDB connects to the real test ClickHouse (or skips, see
// RealClickHouse), creates a throwaway database for the test and returns a
// connection whose default database it is. The database is dropped when the
// test passes and kept for inspection when it fails.
func ClickHouseDB(t testing.TB) (driver.Conn, string) {
	t.Helper()
	addr := RealClickHouse(t)
	db := fmt.Sprintf("t%d_%d_%d", os.Getpid(), seq.Add(1), time.Now().UnixNano()%1e6)
	admin := dial(t, addr, "default")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := admin.Exec(ctx, "CREATE DATABASE "+db); err != nil {
		t.Fatalf("clickhouse: create database %s: %v", db, err)
	}
	conn := dial(t, addr, db)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("clickhouse: kept database %s for inspection", db)
			return
		}
		// ClickHouse 18.16 drops table by table, each after its merges
		// stop: 1–2 s for a database of the whole pipeline on a quiet
		// machine, past 30 s once under load (the server finished the
		// drop after the client gave up). The connection's ReadTimeout
		// (60 s) still bounds the wait for the answer.
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if err := dropDatabase(ctx, func(ctx context.Context) error { return admin.Exec(ctx, "DROP DATABASE "+db) }); err != nil {
			t.Errorf("clickhouse: drop database %s: %v", db, err)
		}
	})
	return conn, db
}

// dropDatabase runs drop, again while the server answers that a table
// appeared in the database being dropped (code 219): a statement the test
// cancelled (a stage stopped during its migrations) can still be creating
// a table on the server, and the server asks to drop again.
func dropDatabase(ctx context.Context, drop func(context.Context) error) error {
	for {
		err := drop(ctx)
		var ex *clickhouse.Exception
		if err == nil || !errors.As(err, &ex) || ex.Code != 219 {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func dial(t testing.TB, addr, db string) driver.Conn {
	t.Helper()
	conn, err := clickhouse.Open(&clickhouse.Options{
		Addr:        []string{addr},
		Auth:        clickhouse.Auth{Database: db, Username: "default"},
		DialTimeout: 5 * time.Second,
		ReadTimeout: 60 * time.Second,
	})
	if err != nil {
		t.Fatalf("clickhouse: open %s: %v", addr, err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := conn.Ping(ctx); err != nil {
		t.Fatalf("clickhouse: ping %s: %v (is it running? deploy/local/clickhouse.sh start)", addr, err)
	}
	return conn
}

// ChurnViews creates and drops materialized views of source (into target,
// both tables of conn's database, target with a column a that source
// has) in a loop, as a migration run that replaces analyst views does,
// until the returned stop is called; stop returns how many DDL statements
// ran. A statement that fails is a test error.
func ChurnViews(t testing.TB, conn driver.Conn, source, target string) (stop func() int) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int)
	go func() {
		ddl := 0
		defer func() { done <- ddl }()
		for ctx.Err() == nil {
			for i := range 5 {
				v := fmt.Sprintf("churn_%d_mv", i)
				for _, q := range []string{
					"CREATE MATERIALIZED VIEW IF NOT EXISTS " + v + " TO " + target + " AS SELECT a FROM " + source,
					"DROP TABLE IF EXISTS " + v,
				} {
					if err := conn.Exec(ctx, q); err != nil {
						if ctx.Err() == nil {
							t.Errorf("churn: %s: %v", q, err)
						}
						return
					}
					ddl++
				}
			}
		}
	}()
	return func() int {
		cancel()
		return <-done
	}
}
