package sink

import (
	"strings"
	"testing"
	"time"

	"github.com/meterline/meterline/internal/testenv"
	chschema "github.com/meterline/meterline/schemas/clickhouse"
)

// fromCommittedCase is sink_progress written before and after the
// migration that adds from_committed: rows written before it read 1, the
// row of the highest next_offset decides, and 1 wins a tie.
var fromCommittedCase = struct {
	before, after []string
	want          string
}{
	before: []string{"INSERT INTO " + ProgressTable + " (consumer_group, kafka_topic, kafka_partition, next_offset, written_at) SELECT 'g', 't', 1, 7, now()"},
	after: []string{
		progressInsert("'g', 't', 1, 5, now(), 0", "'g', 't', 2, 10, now(), 1", "'g', 't', 2, 20, now(), 0", "'g', 't', 3, 9, now(), 0"),
		progressInsert("'g', 't', 3, 9, now(), 1"),
	},
	want: "g\tt\t1\t7\t1\ng\tt\t2\t20\t0\ng\tt\t3\t9\t1\n",
}

// progressInsert inserts rows into the progress table in one INSERT. The
// tie of partition 3 is two INSERTs, in the order the sink writes them (a
// window's row, then recordFirstCommits' row): within one INSERT, current
// ClickHouse applies ReplacingMergeTree to the block (optimize_on_insert)
// and keeps whichever tied row the SELECT happened to yield last.
func progressInsert(rows ...string) string {
	return "INSERT INTO " + ProgressTable + " (consumer_group, kafka_topic, kafka_partition, next_offset, written_at, from_committed) " + progressRows(rows...)
}

// progressRows is a SELECT of rows (INSERT ... VALUES does not run
// through the native protocol on 18.16).
func progressRows(rows ...string) string {
	return "SELECT " + strings.Join(rows, " UNION ALL SELECT ")
}

// fromCommittedMigration returns the migrations before the one that adds
// from_committed, and that one.
func fromCommittedMigration(t *testing.T) ([]chschema.Migration, chschema.Migration) {
	t.Helper()
	ms, err := chschema.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	for i, m := range ms {
		if strings.Contains(m.Name, "from_committed") {
			return ms[:i], m
		}
	}
	t.Fatal("no migration adds from_committed")
	return nil, chschema.Migration{}
}

// TestProgressFromCommitted runs the migration that adds from_committed
// on ClickHouse 18.16 over progress written before it, and reads the
// progress with the sink's query and readProgress.
func TestProgressFromCommitted(t *testing.T) {
	conn, db := testenv.ClickHouseDB(t)
	ctx := ctxT(t, 2*time.Minute)
	before, _ := fromCommittedMigration(t)
	if _, err := migrate(ctx, conn, before); err != nil {
		t.Fatal(err)
	}
	for _, s := range fromCommittedCase.before {
		if err := conn.Exec(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := Migrate(ctx, conn); err != nil {
		t.Fatal(err)
	}
	for _, s := range fromCommittedCase.after {
		if err := conn.Exec(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	rec, err := readProgress(ctx, conn, db, "g", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	want := map[tp]bool{{"t", 1}: true, {"t", 2}: false, {"t", 3}: true}
	for k, fc := range want {
		if got, ok := rec.fromCommitted[k]; !ok || got != fc {
			t.Errorf("partition %d: from_committed %v (recorded %v), want %v", k.p, got, ok, fc)
		}
	}
	if rec.progress[tp{"t", 2}] != 20 {
		t.Errorf("partition 2: progress %d, want 20", rec.progress[tp{"t", 2}])
	}
}

// TestProgressFromCommittedOnChdb: the same on current ClickHouse (chdb,
// 26.x).
func TestProgressFromCommittedOnChdb(t *testing.T) {
	python := testenv.Chdb(t)
	before, m := fromCommittedMigration(t)
	var stmts []string
	for _, b := range before {
		stmts = append(stmts, b.Statements...)
	}
	stmts = append(stmts, fromCommittedCase.before...)
	stmts = append(stmts, m.Statements...)
	stmts = append(stmts, fromCommittedCase.after...)
	const db = "from_committed"
	resp, err := runChdb(ctxT(t, 5*time.Minute), python, chdbRequest{Path: t.TempDir(), Database: db, Statements: stmts,
		Queries: []string{progressQuery(db)}})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Results) != 1 || resp.Results[0] != fromCommittedCase.want {
		t.Fatalf("on chdb %s: %q, want %q", resp.Version, resp.Results, fromCommittedCase.want)
	}
	t.Logf("chdb %s: %q", resp.Version, resp.Results)
}
