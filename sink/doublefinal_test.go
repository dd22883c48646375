package sink

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/meterline/meterline/internal/testenv"
)

// Two FINAL revisions of one aggregate key: acme's line of January 2024
// has its FINAL of value 10 (offset 5) and, with double, a FINAL of value
// 0 of the same revision (offset 70000), as a line of adjustments only
// gets; the invoice query would read one of the two. globex's line has an
// OPEN and a FINAL revision, and a zombie sink's copy of its FINAL row
// (same record): one FINAL, not reported.
func doubleFinalInserts(db string, double bool) []string {
	agg := func(off int, cust string, rev int, status string, value int) string {
		return fmt.Sprintf("INSERT INTO %s.usage_aggregates (kafka_topic, kafka_partition, kafka_offset, kafka_timestamp, customer_id, meter, group_key, "+
			"aggregation, period_start, period_end, revision, status, value, event_count) SELECT '%s', toInt32(0), toInt64(%d), "+
			"toDateTime('2024-02-01 01:00:00'), '%s', 'api_calls', '{}', 'SUM', toDateTime('2024-01-01 00:00:00'), "+
			"toDateTime('2024-02-01 00:00:00'), toInt64(%d), '%s', toInt64(%d), toInt64(1)",
			db, TableAggregates, off, cust, rev, status, value)
	}
	out := []string{
		agg(5, "acme", 1, "FINAL", 10),
		agg(3, "globex", 1, "OPEN", 4),
		agg(6, "globex", 2, "FINAL", 7),
		agg(6, "globex", 2, "FINAL", 7), // a zombie sink's copy
	}
	if double {
		out = append(out, agg(70000, "acme", 1, "FINAL", 0))
	}
	return out
}

// doubleFinalWant is doubleFinalsSQL's answer with the double FINAL,
// TabSeparated (what TestVerifyDoubleFinals reads on 18.16 through
// Verify).
const doubleFinalWant = "202401\tacme\tapi_calls\t{}\t2024-01-01 00:00:00\t['revision 1 value 0 at 0/70000','revision 1 value 10 at 0/5']\n"

// TestVerifyDoubleFinals: on ClickHouse 18.16, verify reports an aggregate
// key with two FINAL revisions, naming it and both rows, and only it; a
// zombie sink's copy of a FINAL row is not a second FINAL. Without the
// second FINAL it reports none.
func TestVerifyDoubleFinals(t *testing.T) {
	for _, double := range []bool{true, false} {
		conn, db, ctx := migratedDB(t, func(db string) []string { return doubleFinalInserts(db, double) })
		rep, err := Verify(ctx, VerifyConfig{Conn: conn, Database: db, Since: 202312, Logger: zaptest.NewLogger(t)})
		if err != nil {
			t.Fatal(err)
		}
		var want []DoubleFinal
		if double {
			want = []DoubleFinal{{Month: 202401, CustomerID: "acme", Meter: "api_calls", Group: "{}", PeriodStart: "2024-01-01 00:00:00",
				Finals: []string{"revision 1 value 0 at 0/70000", "revision 1 value 10 at 0/5"}}}
		}
		if !reflect.DeepEqual(rep.DoubleFinals, want) {
			t.Errorf("double %v: DoubleFinals %+v, want %+v", double, rep.DoubleFinals, want)
		}
		// Only tables derived from usage_aggregates call for the check.
		rep, err = Verify(ctx, VerifyConfig{Conn: conn, Database: db, Since: 202312, Tables: []string{TableUsageDaily}, Logger: zaptest.NewLogger(t)})
		if err != nil {
			t.Fatal(err)
		}
		if len(rep.DoubleFinals) != 0 {
			t.Errorf("usage_daily alone: DoubleFinals %+v", rep.DoubleFinals)
		}
	}
}

// TestVerifyDoubleFinalsOnChdb runs verify's query of double FINAL
// revisions on current ClickHouse (chdb, 26.x): the same answer.
func TestVerifyDoubleFinalsOnChdb(t *testing.T) {
	python := testenv.Chdb(t)
	const db = "doublefinal"
	for _, double := range []bool{true, false} {
		resp, err := runChdb(ctxT(t, 5*time.Minute), python, chdbRequest{Path: t.TempDir(), Database: db,
			Statements: append(migrationStatements(t), doubleFinalInserts(db, double)...),
			Queries:    []string{fmt.Sprintf(doubleFinalsSQL, db)}})
		if err != nil {
			t.Fatal(err)
		}
		want := ""
		if double {
			want = doubleFinalWant
		}
		if len(resp.Results) != 1 || resp.Results[0] != want {
			t.Errorf("double %v on chdb %s: %q, want %q", double, resp.Version, strings.Join(resp.Results, "|"), want)
		}
	}
}
