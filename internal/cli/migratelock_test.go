package cli

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meterline/meterline/internal/testenv"
	chschema "github.com/meterline/meterline/schemas/clickhouse"
	"github.com/meterline/meterline/sink"
)

// TestMigrateCommandsAtOnce: two `meterline migrate` started at once on a
// new database both succeed, and between them apply each migration once.
// One that finds the migrate lock held by another run waits; when that run
// finishes its work it applies nothing and succeeds, without asking Kafka
// about the sink (unreachable here); and while the other holds the lock
// longer than --lock-wait, it says that it waits and exits 1 naming the
// holder.
func TestMigrateCommandsAtOnce(t *testing.T) {
	addr := testenv.RealClickHouse(t)
	const noKafka = "127.0.0.1:1"
	db := fmt.Sprintf("cli_migratelock_%d_%d", os.Getpid(), time.Now().UnixNano()%1e9)
	ms, err := chschema.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	outs := make([]string, 2)
	codes := make([]int, 2)
	var wg sync.WaitGroup
	for k := range outs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var errOut string
			codes[k], outs[k], errOut = run(t, "", "migrate", "--clickhouse", addr, "--database", db, "--brokers", noKafka)
			outs[k] += errOut
		}()
	}
	wg.Wait()
	for _, m := range ms {
		n := strings.Count(outs[0]+outs[1], m.Name+": applied\n")
		if n != 1 {
			t.Errorf("%s applied by %d runs, want 1", m.Name, n)
		}
	}
	if codes[0] != 0 || codes[1] != 0 {
		t.Fatalf("exit %v:\n%s\n%s", codes, outs[0], outs[1])
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := sink.Dial(ctx, addr, db, false)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	t.Cleanup(func() { _ = conn.Exec(context.Background(), "DROP DATABASE IF EXISTS "+db) })
	last := ms[len(ms)-1]
	held := func(lease int) {
		t.Helper()
		for _, s := range []string{"CREATE TABLE " + sink.MigrateLockTable + " (owner String, expires DateTime) ENGINE = Log",
			fmt.Sprintf("INSERT INTO %s SELECT 'other_run', now() + %d", sink.MigrateLockTable, lease)} {
			if err := conn.Exec(ctx, s); err != nil {
				t.Fatal(err)
			}
		}
	}
	// The other run holds the lock with the last migration not recorded
	// yet, then records it and releases the lock.
	for _, s := range []string{"CREATE TABLE kept AS " + sink.MigrationsTable,
		fmt.Sprintf("INSERT INTO kept SELECT * FROM %s WHERE version < %d", sink.MigrationsTable, last.Version),
		"DROP TABLE " + sink.MigrationsTable, "RENAME TABLE kept TO " + sink.MigrationsTable} {
		if err := conn.Exec(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	held(120)
	time.AfterFunc(2*time.Second, func() {
		_ = conn.Exec(ctx, fmt.Sprintf("INSERT INTO %s SELECT %d, '%s', '%s', now()", sink.MigrationsTable, last.Version, last.Name, last.Checksum))
		_ = conn.Exec(ctx, "DROP TABLE "+sink.MigrateLockTable)
	})
	code, out, errOut := run(t, "", "migrate", "--clickhouse", addr, "--database", db, "--brokers", noKafka, "--lock-wait", "1m")
	if code != 0 || !strings.Contains(out, " 0 applied now") || !strings.Contains(errOut, "waiting for the migrate lock") {
		t.Fatalf("migrate while another run holds the lock and finishes: exit %d, want 0, nothing applied\n%s\n%s", code, out, errOut)
	}
	if err := conn.Exec(ctx, "DROP TABLE "+sink.MigrationsTable); err != nil {
		t.Fatal(err)
	}
	held(120)
	began := time.Now()
	code, out, errOut = run(t, "", "migrate", "--clickhouse", addr, "--database", db, "--brokers", noKafka, "--lock-wait", "2s")
	if code != 1 || !strings.Contains(errOut, "waiting for the migrate lock") ||
		!strings.Contains(errOut, "another migration run (other_run) holds the migrate lock") || time.Since(began) > 20*time.Second {
		t.Fatalf("migrate while another run holds the lock: exit %d after %s, want 1 after 2s naming other_run\n%s\n%s", code, time.Since(began), out, errOut)
	}
}
