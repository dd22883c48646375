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
const doubleFinalWant = "202401\tacme\tapi_calls\t{}\t2024-01-01 00:00:00\t['revision 1 value 0 at 0/70000','revision 1 value 10 at 0/5']\t2\n"

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
				Finals: []string{"revision 1 value 0 at 0/70000", "revision 1 value 10 at 0/5"}, Count: 2}}
		}
		if !reflect.DeepEqual(rep.DoubleFinals, want) || rep.DoubleFinalKeys != len(want) {
			t.Errorf("double %v: DoubleFinals %+v (%d keys), want %+v", double, rep.DoubleFinals, rep.DoubleFinalKeys, want)
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
			Queries:    []string{fmt.Sprintf(doubleFinalsSQL, db, maxDoubleFinals, maxFinalsListed)}})
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

// manyDoubleFinals inserts maxDoubleFinals+20 keys of two FINAL rows each
// (customers c1000.. of January 2024), and one key, customer "zz", of
// maxFinalsListed+2 FINAL rows, each row of a record 65,536 offsets past
// the one before (rows of one key and one block of offsets are one row to
// usage_aggregates' ReplacingMergeTree).
func manyDoubleFinals(db string) []string {
	keys := maxDoubleFinals + 20
	ins := func(cust string, n int, base int) string {
		return fmt.Sprintf("INSERT INTO %s.usage_aggregates (kafka_topic, kafka_partition, kafka_offset, kafka_timestamp, customer_id, meter, group_key, "+
			"aggregation, period_start, period_end, revision, status, value, event_count) SELECT '%s', toInt32(0), toInt64(%d + number * 65536), "+
			"toDateTime('2024-02-01 01:00:00'), %s, 'api_calls', '{}', 'SUM', toDateTime('2024-01-01 00:00:00'), "+
			"toDateTime('2024-02-01 00:00:00'), toInt64(1), 'FINAL', toInt64(number), toInt64(1) FROM system.numbers LIMIT %d",
			db, TableAggregates, base, cust, n)
	}
	return []string{
		ins(fmt.Sprintf("concat('c', toString(1000 + number %% %d))", keys), 2*keys, 0),
		ins("'zz'", maxFinalsListed+2, 100000),
	}
}

// TestVerifyDoubleFinalsBounded: with more keys of double FINALs than a
// report lists, verify lists the first maxDoubleFinals (in order) and
// counts them all; a key's FINAL rows are listed up to maxFinalsListed and
// counted.
func TestVerifyDoubleFinalsBounded(t *testing.T) {
	conn, db, ctx := migratedDB(t, manyDoubleFinals)
	rep, err := Verify(ctx, VerifyConfig{Conn: conn, Database: db, Since: 202312, Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if rep.DoubleFinalKeys != maxDoubleFinals+21 || len(rep.DoubleFinals) != maxDoubleFinals {
		t.Fatalf("%d keys counted, %d listed; want %d and %d", rep.DoubleFinalKeys, len(rep.DoubleFinals), maxDoubleFinals+21, maxDoubleFinals)
	}
	if d := rep.DoubleFinals[0]; d.CustomerID != "c1000" || d.Count != 2 || len(d.Finals) != 2 {
		t.Errorf("first key %+v, want c1000 with its 2 FINALs", d)
	}
	// zz sorts last: not listed; its own rows bounded, on chdb below.
	rows, err := conn.Query(ctx, fmt.Sprintf(doubleFinalsSQL, db, 1000, maxFinalsListed))
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	found := false
	for rows.Next() {
		var d DoubleFinal
		var start time.Time
		if err := rows.Scan(&d.Month, &d.CustomerID, &d.Meter, &d.Group, &start, &d.Finals, &d.Count); err != nil {
			t.Fatal(err)
		}
		if d.CustomerID == "zz" {
			found = true
			if d.Count != maxFinalsListed+2 || len(d.Finals) != maxFinalsListed {
				t.Errorf("zz: %d FINALs counted, %d listed; want %d and %d", d.Count, len(d.Finals), maxFinalsListed+2, maxFinalsListed)
			}
		}
	}
	if !found {
		t.Error("zz not reported")
	}
}

// TestVerifyDoubleFinalsCountOnChdb runs verify's count of double FINAL
// keys on current ClickHouse (chdb, 26.x).
func TestVerifyDoubleFinalsCountOnChdb(t *testing.T) {
	python := testenv.Chdb(t)
	const db = "doublefinalcount"
	resp, err := runChdb(ctxT(t, 5*time.Minute), python, chdbRequest{Path: t.TempDir(), Database: db,
		Statements: append(migrationStatements(t), manyDoubleFinals(db)...),
		Queries:    []string{fmt.Sprintf(doubleFinalsCountSQL, db), fmt.Sprintf("SELECT count() FROM (%s)", fmt.Sprintf(doubleFinalsSQL, db, maxDoubleFinals, maxFinalsListed))}})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{fmt.Sprintf("%d\n", maxDoubleFinals+21), fmt.Sprintf("%d\n", maxDoubleFinals)}
	if !reflect.DeepEqual(resp.Results, want) {
		t.Errorf("on chdb %s: %q, want %q", resp.Version, resp.Results, want)
	}
}
