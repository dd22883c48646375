package sink

import (
	"fmt"
	"regexp"
	"testing"
	"time"

	"github.com/meterline/meterline/internal/testenv"
)

// mergedKeys is the sentence of docs/operations.md (One database per
// pipeline) that names the analyst tables whose keys hold neither the
// topic nor the period's end.
var mergedKeys = regexp.MustCompile("The keys of ((?:`[a-z_]+`(?:,\\s+|\\s+and\\s+)?)+)\\s+hold neither the topic nor the\\s+period's end")

// mergedKeyQueries: the query of docs/analysts.md that reads each table
// the sentence may name, with what it answers for twoPipelinesInserts.
var mergedKeyQueries = map[string]struct{ query, want string }{
	// One aggregate: the day's, of the highest revision.
	TableAggregatesCurrent: {"current_values", "api_calls\t{}\t2024-01-01 00:00:00\t2024-01-02 00:00:00\tFINAL\t3\t7\n"},
	// One invoice line of January, billed at the day's value.
	TableInvoiceLines: {"invoice_lines", "acme\tapi_calls\t{}\t7\t0\t7\tfinal\n"},
}

// documentedMergedTables returns the tables that docs/operations.md says
// merge two pipelines' aggregates.
func documentedMergedTables(t *testing.T) []string {
	t.Helper()
	m := mergedKeys.FindStringSubmatch(operationsSection(t, "### One database per pipeline"))
	if m == nil {
		t.Fatalf("docs/operations.md, One database per pipeline, no longer names the tables whose keys merge two pipelines (%s)", mergedKeys)
	}
	var tables []string
	for _, c := range regexp.MustCompile("`([a-z_]+)`").FindAllStringSubmatch(m[1], -1) {
		if _, ok := mergedKeyQueries[c[1]]; !ok {
			t.Fatalf("docs/operations.md, One database per pipeline, names %s, which this test does not check", c[1])
		}
		tables = append(tables, c[1])
	}
	return tables
}

// twoPipelinesInserts: two pipelines' aggregates of acme's api_calls in
// one database, each INSERT one revision as the sinks write them: the
// monthly pipeline's January (usage.aggregates: 40 OPEN, then 100 FINAL
// at revision 2), and a daily pipeline's January 1 (day.usage.aggregates:
// 3, 5, then 7 FINAL at revision 3), on partitions of their own.
func twoPipelinesInserts(db string) []string {
	var out []string
	agg := func(topic string, p, rev int, end, status string, v int, at string) {
		out = append(out, fmt.Sprintf("INSERT INTO %s.usage_aggregates (kafka_topic, kafka_partition, kafka_offset, kafka_timestamp, customer_id, "+
			"meter, group_key, aggregation, period_start, period_end, revision, status, value) SELECT '%s', toInt32(%d), toInt64(%d), "+
			"toDateTime('%s'), 'acme', 'api_calls', '{}', 'SUM', toDateTime('2024-01-01 00:00:00'), toDateTime('%s'), toInt64(%d), '%s', toInt64(%d)",
			db, topic, p, rev-1, at, end, rev, status, v))
	}
	const month, day = "2024-02-01 00:00:00", "2024-01-02 00:00:00"
	agg("usage.aggregates", 0, 1, month, "OPEN", 40, "2024-01-01 12:00:00")
	agg("day.usage.aggregates", 1, 1, day, "OPEN", 3, "2024-01-01 06:00:00")
	agg("day.usage.aggregates", 1, 2, day, "OPEN", 5, "2024-01-01 12:00:00")
	agg("day.usage.aggregates", 1, 3, day, "FINAL", 7, "2024-01-03 00:00:00")
	agg("usage.aggregates", 0, 2, month, "FINAL", 100, "2024-02-03 00:00:00")
	return out
}

// TestTwoPipelinesOneDatabase checks what docs/operations.md (One
// database per pipeline) says of the tables it names, on ClickHouse 18.16:
// a daily and a monthly pipeline written into one database have one row
// there for January 1 and January, the one of the highest revision, and
// the documented queries bill the day's 7 for the month's 100.
func TestTwoPipelinesOneDatabase(t *testing.T) {
	tables := documentedMergedTables(t)
	conn, _, ctx := migratedDB(t, twoPipelinesInserts)
	for _, tbl := range tables {
		q := mergedKeyQueries[tbl]
		got, err := tsv(ctx, conn, namedQuery(t, AnalystQueries, q.query))
		if err != nil {
			t.Fatal(err)
		}
		if got != q.want {
			t.Errorf("%s (%s) on 18.16:\n%q\nwant (docs/operations.md, One database per pipeline)\n%q", tbl, q.query, got, q.want)
		}
	}
}

// TestTwoPipelinesOneDatabaseOnChdb is TestTwoPipelinesOneDatabase on
// current ClickHouse (chdb, 26.x).
func TestTwoPipelinesOneDatabaseOnChdb(t *testing.T) {
	tables := documentedMergedTables(t)
	python := testenv.Chdb(t)
	var queries []string
	for _, tbl := range tables {
		queries = append(queries, namedQuery(t, AnalystQueries, mergedKeyQueries[tbl].query))
	}
	resp, err := runChdb(ctxT(t, 5*time.Minute), python, chdbRequest{Path: t.TempDir(), Database: "twopipelines",
		Statements: append(migrationStatements(t), twoPipelinesInserts("twopipelines")...), Queries: queries})
	if err != nil {
		t.Fatal(err)
	}
	for i, tbl := range tables {
		if want := mergedKeyQueries[tbl].want; resp.Results[i] != want {
			t.Errorf("%s on chdb %s:\n%q\nwant (docs/operations.md, One database per pipeline)\n%q", tbl, resp.Version, resp.Results[i], want)
		}
	}
}
