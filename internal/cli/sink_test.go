package cli

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/internal/topics"
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

// TestMigrateCommandRefusedWhileSinkRuns: `meterline migrate` on a
// database with a migration pending refuses while the sink's group has a
// member (a sink of the old build still inserting), naming it, and
// applies it once the member is gone.
func TestMigrateCommandRefusedWhileSinkRuns(t *testing.T) {
	brokers, addr, conn, db := migratedDatabase(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// The last migration pending, as after an upgrade of the binary.
	if err := conn.Exec(ctx, "DROP TABLE "+sink.MigrationsTable); err != nil {
		t.Fatal(err)
	}
	ms, err := chschema.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	recordMigrations(ctx, t, conn, ms[:len(ms)-1], false)
	topic := testenv.Name(t, "migrate-member")
	testenv.CreateTopic(t, brokers, topic, 1, nil)
	group := testenv.Name(t, "migrate-group")
	member, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumerGroup(group), kgo.ConsumeTopics(topic), kgo.ClientID("old-sink"))
	if err != nil {
		t.Fatal(err)
	}
	go member.PollFetches(ctx)
	defer member.Close()
	for members := sink.GroupMembers(testenv.Admin(t, brokers), "", group); ; time.Sleep(200 * time.Millisecond) {
		if m, err := members(ctx); err != nil {
			t.Fatal(err)
		} else if len(m) > 0 {
			break
		}
	}
	args := []string{"migrate", "--brokers", strings.Join(brokers, ","), "--clickhouse", addr, "--database", db, "--group", group}
	if code, out, errOut := run(t, "", args...); code != 1 || !strings.Contains(errOut, "old-sink") || !strings.Contains(errOut, ms[len(ms)-1].Name+" pending") {
		t.Fatalf("migrate while a member of the sink's group runs: exit %d, want 1 and a refusal naming it\n%s\n%s", code, out, errOut)
	}
	member.Close()
	if code, out, errOut := run(t, "", args...); code != 0 || !strings.Contains(out, "1 applied now") {
		t.Fatalf("migrate once the member left: exit %d\n%s\n%s", code, out, errOut)
	}
}

// recordMigrations creates the migrations table of conn's database and
// records ms in it as applied, running each one's statements first when
// run is set: the database as a migrate of the build whose newest
// migration is the last of ms left it.
func recordMigrations(ctx context.Context, t *testing.T, conn driver.Conn, ms []chschema.Migration, run bool) {
	t.Helper()
	if err := conn.Exec(ctx, "CREATE TABLE "+sink.MigrationsTable+" (version UInt32, name String, checksum String, applied_at DateTime) ENGINE = ReplacingMergeTree ORDER BY version"); err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		for i := 0; run && i < len(m.Statements); i++ {
			if err := conn.Exec(ctx, m.Statements[i]); err != nil {
				t.Fatalf("%s: %v\n%s", m.Name, err, m.Statements[i])
			}
		}
		if err := conn.Exec(ctx, fmt.Sprintf("INSERT INTO %s SELECT %d, '%s', '%s', now()", sink.MigrationsTable, m.Version, m.Name, m.Checksum)); err != nil {
			t.Fatal(err)
		}
	}
}

// migratedDatabase returns the test Kafka's and ClickHouse's addresses,
// and a new database of the latter with every migration applied.
func migratedDatabase(t *testing.T) ([]string, string, driver.Conn, string) {
	t.Helper()
	brokers := testenv.RealKafka(t)
	addr := testenv.RealClickHouse(t)
	conn, db := testenv.ClickHouseDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := sink.Migrate(ctx, conn); err != nil {
		t.Fatal(err)
	}
	return brokers, addr, conn, db
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

// TestSinkAcceptOffsetsCommand: `meterline sink accept-offsets` on a
// database with no progress, whose group's committed offset is three
// records past the partition's start, records that offset and prints the
// skipped records; run again, it accepts nothing. --partition without
// --topic is a usage error.
func TestSinkAcceptOffsetsCommand(t *testing.T) {
	brokers, addr, _, db := migratedDatabase(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	prefix := testenv.Name(t, "accept") + "."
	topic := prefix + topics.DefaultNames().DedupedTopic()
	testenv.CreateTopic(t, brokers, topic, 1, nil)
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(topic))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for i := 0; i < 3; i++ {
		if err := cl.ProduceSync(ctx, &kgo.Record{Value: []byte("x")}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	group := testenv.Name(t, "accept-group")
	var offs kadm.Offsets
	offs.Add(kadm.Offset{Topic: topic, Partition: 0, At: 3, LeaderEpoch: -1})
	if resp, err := testenv.Admin(t, brokers).CommitOffsets(ctx, group, offs); err != nil || resp.Error() != nil {
		t.Fatalf("commit offset: %v %v", err, resp.Error())
	}
	args := []string{"sink", "accept-offsets", "--brokers", strings.Join(brokers, ","), "--clickhouse", addr,
		"--topic-prefix", prefix, "--database", db, "--group", group, "--by", "cli-test"}
	code, out, errOut := run(t, "", args...)
	if want := topic + " partition 0: accepted committed offset 3; records 0..2 are in no table"; code != 0 || !strings.Contains(out, want) {
		t.Fatalf("accept-offsets: exit %d, want 0 and %q\n%s\n%s", code, want, out, errOut)
	}
	code, out, errOut = run(t, "", args...)
	if code != 0 || !strings.Contains(out, "nothing accepted") {
		t.Fatalf("accept-offsets again: exit %d, want 0 and nothing accepted\n%s\n%s", code, out, errOut)
	}
	if code, _, errOut := run(t, "", append(args, "--partition", "0")...); code != 2 || !strings.Contains(errOut, "--partition needs --topic") {
		t.Fatalf("--partition without --topic: exit %d, want 2\n%s", code, errOut)
	}
}
