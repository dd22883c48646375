package sink

import (
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/meterline/meterline/internal/testenv"
)

var (
	// retentionLoop and retentionQuery are the lines of the retention
	// step of docs/operations.md (Retention): a shell loop over tables,
	// and a clickhouse-client command, in it or alone.
	retentionLoop  = regexp.MustCompile(`^for t in ([a-z_ ]+); do$`)
	retentionQuery = regexp.MustCompile(`^clickhouse-client --database meterline --query "(ALTER TABLE (?:\$t|[a-z_]+) DROP PARTITION [0-9]{6})"$`)
)

// operationsSection returns the section of docs/operations.md under
// heading (its line, "## Retention"), up to the next section of level 2.
func operationsSection(t *testing.T, heading string) string {
	t.Helper()
	b, err := os.ReadFile("../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "\n"+heading+"\n")
	if !ok {
		t.Fatalf("docs/operations.md has no section %q", heading)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	return section
}

// documentedRetention returns the statements of the retention step of
// docs/operations.md (the first sh block of its section Retention), its
// loops unrolled, in their order; they name the tables unqualified, to be
// run with the sink's database as the session's.
func documentedRetention(t *testing.T) []string {
	t.Helper()
	_, block, ok := strings.Cut(operationsSection(t, "## Retention"), "```sh\n")
	if !ok {
		t.Fatal("docs/operations.md, Retention: no sh block")
	}
	block, _, _ = strings.Cut(block, "```")
	var out []string
	var loop []string
	inLoop := false
	for _, l := range strings.Split(strings.TrimSpace(block), "\n") {
		l = strings.TrimSpace(l)
		if m := retentionLoop.FindStringSubmatch(l); m != nil && !inLoop {
			loop, inLoop = strings.Fields(m[1]), true
			continue
		}
		if l == "done" && inLoop {
			inLoop = false
			continue
		}
		m := retentionQuery.FindStringSubmatch(l)
		switch {
		case m == nil:
			t.Fatalf("docs/operations.md, Retention: a line this test does not read: %q", l)
		case inLoop && strings.Contains(m[1], "$t"):
			for _, tbl := range loop {
				out = append(out, strings.Replace(m[1], "$t", tbl, 1))
			}
		case strings.Contains(m[1], "$t"):
			t.Fatalf("docs/operations.md, Retention: $t outside a loop: %q", l)
		default:
			out = append(out, m[1])
		}
	}
	if inLoop || len(out) == 0 {
		t.Fatalf("docs/operations.md, Retention: a loop without done, or no statement:\n%s", block)
	}
	return out
}

// edgeMonthInserts: acme's events of api_calls around the end of January
// 2024, each INSERT one row as the sink writes them: "jan" (2 units, on
// January 10) and "feb" (1, on February 3) billed; "edge" (5) happened at
// 00:30 on February 1 and arrived half an hour earlier, within the skew,
// and the aggregator rejected it (over_limit) at 23:55 on January 31. Its
// rows of events_by_customer and usage_daily are of February (the
// event's month), its row of unbilled_events of January (the
// rejection's).
func edgeMonthInserts(db string) []string {
	var out []string
	ev := func(off int, id, at, arrival string, q int) {
		out = append(out, fmt.Sprintf("INSERT INTO %s.usage_events (kafka_topic, kafka_partition, kafka_offset, kafka_timestamp, event_id, "+
			"customer_id, meter, quantity, event_time, ingest_time, record_offset) SELECT 'usage.deduped', toInt32(0), toInt64(%d), "+
			"toDateTime('%s') + 60, '%s', 'acme', 'api_calls', toInt64(%d), toDateTime('%s'), toDateTime('%s'), toInt64(%d)",
			db, off, arrival, id, q, at, arrival, off))
	}
	ev(0, "jan", "2024-01-10 10:00:00", "2024-01-10 10:01:00", 2)
	ev(1, "edge", "2024-02-01 00:30:00", "2024-01-31 23:50:00", 5)
	ev(2, "feb", "2024-02-03 10:00:00", "2024-02-03 10:01:00", 1)
	return append(out, fmt.Sprintf("INSERT INTO %s.usage_rejected (kafka_topic, kafka_partition, kafka_offset, kafka_timestamp, reason, stage, "+
		"source_topic, source_partition, source_offset, customer_id, meter, event_id, record_offset) SELECT 'usage.rejected', toInt32(0), "+
		"toInt64(0), toDateTime('2024-01-31 23:55:00'), 'over_limit', 'aggregator', 'usage.deduped', toInt32(0), toInt64(1), 'acme', "+
		"'api_calls', 'edge', toInt64(0)", db))
}

// The billable usage of January and of February 2024, before and after
// the retention step drops January: January's is gone, February's has
// not changed ("edge" is not billable).
const (
	edgeJanuaryWant  = "2024-01-10\tapi_calls\t1\t2\n"
	edgeFebruaryWant = "2024-02-03\tapi_calls\t1\t1\n"
)

// edgeMonthQueries: usage_by_day for January and for February, the
// documented retention step, and the two again.
func edgeMonthQueries(t *testing.T) (before, drops, after []string) {
	t.Helper()
	q := AnalystQuery{SQL: usageByDay(t)}
	for _, m := range []time.Month{time.January, time.February} {
		s, err := q.For(QueryParams{Customer: "acme", Meter: "api_calls", Month: time.Date(2024, m, 1, 0, 0, 0, 0, time.UTC)})
		if err != nil {
			t.Fatal(err)
		}
		before = append(before, s)
	}
	return before, documentedRetention(t), before
}

// checkEdgeMonth compares the answers of edgeMonthQueries but the drops
// (January and February before the retention step, then after it).
func checkEdgeMonth(t *testing.T, where string, got []string) {
	t.Helper()
	want := []string{edgeJanuaryWant, edgeFebruaryWant, "", edgeFebruaryWant}
	if len(got) != len(want) {
		t.Fatalf("on %s: %d answers, want %d", where, len(got), len(want))
	}
	for i := range want {
		stage := "before the retention step"
		if i >= 2 {
			stage = "after the retention step of docs/operations.md"
		}
		if got[i] != want[i] {
			t.Errorf("on %s, usage_by_day of %s %s:\n%q\nwant\n%q", where, []string{"January", "February"}[i%2], stage, got[i], want[i])
		}
	}
}

// TestRetentionKeepsUnbilledEdge follows the retention step of
// docs/operations.md literally on ClickHouse 18.16, dropping January 2024,
// and runs usage_by_day for February before and after: an event of
// February rejected in January within the skew stays unbilled.
func TestRetentionKeepsUnbilledEdge(t *testing.T) {
	conn, _, ctx := migratedDB(t, edgeMonthInserts)
	before, drops, after := edgeMonthQueries(t)
	var got []string
	for _, q := range before {
		s, err := tsv(ctx, conn, q)
		if err != nil {
			t.Fatalf("%v\n%s", err, q)
		}
		got = append(got, s)
	}
	for _, d := range drops {
		if err := conn.Exec(ctx, d); err != nil {
			t.Fatalf("%v\n%s", err, d)
		}
	}
	for _, q := range after {
		s, err := tsv(ctx, conn, q)
		if err != nil {
			t.Fatalf("%v\n%s", err, q)
		}
		got = append(got, s)
	}
	checkEdgeMonth(t, "18.16", got)
}

// TestRetentionKeepsUnbilledEdgeOnChdb is TestRetentionKeepsUnbilledEdge
// on current ClickHouse (chdb, 26.x).
func TestRetentionKeepsUnbilledEdgeOnChdb(t *testing.T) {
	python := testenv.Chdb(t)
	before, drops, after := edgeMonthQueries(t)
	resp, err := runChdb(ctxT(t, 5*time.Minute), python, chdbRequest{Path: t.TempDir(), Database: "retentionedge",
		Statements: append(migrationStatements(t), edgeMonthInserts("retentionedge")...),
		Queries:    append(append(append([]string(nil), before...), drops...), after...)})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Results) != len(before)+len(drops)+len(after) {
		t.Fatalf("chdb %s: %d results, want %d", resp.Version, len(resp.Results), len(before)+len(drops)+len(after))
	}
	got := append(append([]string(nil), resp.Results[:len(before)]...), resp.Results[len(before)+len(drops):]...)
	checkEdgeMonth(t, "chdb "+resp.Version, got)
}
