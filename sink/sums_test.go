package sink

import (
	"context"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/meterline/meterline/internal/testenv"
)

// Sums of untrusted quantities in the analyst queries (docs/analysts.md,
// Reading them exactly: sums never wrap). The aggregator bounds one
// aggregate's value, and one adjustment's delta, to 64 bits; nothing bounds
// a sum across groups, periods, adjustments or events. The data below is
// what the aggregator may write: acme's api_calls in two groups, each of
// MaxInt64 in January 2024, an adjustment of MaxInt64 - 7 booked into
// January from December for one of them (its invoice line is then past 64
// bits), and in two groups an adjustment of MaxInt64 - 7 booked into
// February from January; usage_events holds two accepted events of MaxInt64
// on one day (two groups of one meter, or hour periods, take both).

const maxInt64 = "9223372036854775807"

func hostileSumsInserts(db string) []string {
	agg := func(off int, group string) string {
		return fmt.Sprintf("SELECT '%s' AS t, toInt32(0) AS p, toInt64(%d) AS o, toDateTime('2024-01-20 00:00:00') AS ts, "+
			"'acme' AS c, 'api_calls' AS m, '%s' AS g, 'SUM' AS a, toDateTime('2024-01-01 00:00:00') AS ps, "+
			"toDateTime('2024-02-01 00:00:00') AS pe, toInt64(1) AS r, 'FINAL' AS s, toInt64(%s) AS v, toInt64(1) AS n",
			TableAggregates, off, group, maxInt64)
	}
	adjInto := func(off int, id, group, orig, origEnd, booked, bookedEnd string) string {
		return fmt.Sprintf("SELECT '%s' AS t, toInt32(0) AS p, toInt64(%d) AS o, toDateTime('%s') + 864000 AS ts, "+
			"'%s' AS e, 'acme' AS c, 'api_calls' AS m, '%s' AS g, 'SUM' AS a, toDateTime('%s') AS ops, "+
			"toDateTime('%s') AS ope, toDateTime('%s') AS bps, toDateTime('%s') AS bpe, "+
			"toInt64(%s - 7) AS d, toInt64(%s - 7) AS q",
			TableAdjustments, off, booked, id, group, orig, origEnd, booked, bookedEnd, maxInt64, maxInt64)
	}
	adj := func(off int, id, group string) string {
		return adjInto(off, id, group, "2024-01-01 00:00:00", "2024-02-01 00:00:00", "2024-02-01 00:00:00", "2024-03-01 00:00:00")
	}
	ev := func(off int, id string) string {
		return fmt.Sprintf("SELECT '%s' AS t, toInt32(0) AS p, toInt64(%d) AS o, toDateTime('2024-01-05 10:00:00') AS ts, "+
			"'%s' AS e, 'acme' AS c, 'api_calls' AS m, toInt64(%s) AS q, toDateTime('2024-01-05 09:00:00') AS et, toDateTime('2024-01-05 10:00:00') AS it",
			TableEvents, off, id, maxInt64)
	}
	return []string{
		"INSERT INTO " + db + ".usage_aggregates (kafka_topic, kafka_partition, kafka_offset, kafka_timestamp, customer_id, meter, group_key, " +
			"aggregation, period_start, period_end, revision, status, value, event_count) SELECT * FROM (" +
			agg(1, `{"region":"eu"}`) + " UNION ALL " + agg(2, `{"region":"us"}`) + ")",
		"INSERT INTO " + db + ".usage_adjustments (kafka_topic, kafka_partition, kafka_offset, kafka_timestamp, event_id, customer_id, meter, " +
			"group_key, aggregation, original_period_start, original_period_end, booked_period_start, booked_period_end, delta, quantity) SELECT * FROM (" +
			adj(1, "late-eu", `{"region":"eu"}`) + " UNION ALL " + adj(2, "late-us", `{"region":"us"}`) + " UNION ALL " +
			adjInto(3, "december-eu", `{"region":"eu"}`, "2023-12-01 00:00:00", "2024-01-01 00:00:00", "2024-01-01 00:00:00", "2024-02-01 00:00:00") + ")",
		"INSERT INTO " + db + ".usage_events (kafka_topic, kafka_partition, kafka_offset, kafka_timestamp, event_id, customer_id, meter, quantity, event_time, ingest_time) " +
			"SELECT * FROM (" + ev(1, "big-1") + " UNION ALL " + ev(2, "big-2") + ")",
	}
}

// hostileSumsWant: each query's answer on the data above, TabSeparated.
// 18446744073709551614 is 2 × MaxInt64; 18446744073709551600 is
// 2 × (MaxInt64 - 7).
var hostileSumsWant = map[string]string{
	"top_customers": "acme\t18446744073709551614\n",
	"late_usage":    "2024-01-01 00:00:00\tacme\tapi_calls\t2\t18446744073709551600\n",
	"usage_by_day":  "2024-01-05\tapi_calls\t2\t18446744073709551614\n",
	"invoice_lines": "acme\tapi_calls\t{\"region\":\"eu\"}\t" + maxInt64 + "\t9223372036854775800\t18446744073709551607\tfinal\n" +
		"acme\tapi_calls\t{\"region\":\"us\"}\t" + maxInt64 + "\t0\t" + maxInt64 + "\tfinal\n",
}

func hostileSumsQueries(t *testing.T) []AnalystQuery {
	var qs []AnalystQuery
	for _, q := range AnalystQueries {
		if _, ok := hostileSumsWant[q.Name]; ok {
			qs = append(qs, q)
		}
	}
	if len(qs) != len(hostileSumsWant) {
		t.Fatalf("%d of the %d queries found", len(qs), len(hostileSumsWant))
	}
	return qs
}

// TestAnalystSumsDoNotWrap runs the analyst queries that add up untrusted
// quantities on data whose sums exceed 64 bits, on the test server
// (ClickHouse 18.16), and requires the exact sums.
func TestAnalystSumsDoNotWrap(t *testing.T) {
	checkAnswers1816(t, hostileSumsInserts, hostileSumsQueries(t), hostileSumsWant, 202401)
}

// TestAnalystSumsDoNotWrapOnChdb is TestAnalystSumsDoNotWrap on current
// ClickHouse (chdb, 26.x).
func TestAnalystSumsDoNotWrapOnChdb(t *testing.T) {
	checkAnswersChdb(t, "sums", hostileSumsInserts, hostileSumsQueries(t), hostileSumsWant)
}

// checkAnswers1816 runs qs on a new database of the test server holding
// the statements of inserts, and compares each answer, TabSeparated, with
// want's of its name; verify then finds every month from since equal.
func checkAnswers1816(t *testing.T, inserts func(db string) []string, qs []AnalystQuery, want map[string]string, since uint32) {
	t.Helper()
	conn, db, ctx := migratedDB(t, inserts)
	for _, q := range qs {
		got, err := tsv(ctx, conn, q.SQL)
		if err != nil {
			t.Fatalf("%s: %v", q.Name, err)
		}
		if got != want[q.Name] {
			t.Errorf("%s on 18.16:\n%q\nwant\n%q", q.Name, got, want[q.Name])
		}
	}
	verifyEqual(ctx, t, conn, db, since)
}

// checkAnswersChdb is checkAnswers1816 on chdb (ClickHouse 26.x), in
// database db, without verify.
func checkAnswersChdb(t *testing.T, db string, inserts func(db string) []string, qs []AnalystQuery, want map[string]string) {
	t.Helper()
	python := testenv.Chdb(t)
	req := chdbRequest{Path: t.TempDir(), Database: db, Statements: append(migrationStatements(t), inserts(db)...)}
	for _, q := range qs {
		req.Queries = append(req.Queries, q.SQL)
	}
	resp, err := runChdb(ctxT(t, 5*time.Minute), python, req)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Results) != len(qs) {
		t.Fatalf("chdb %s answered %d queries of %d", resp.Version, len(resp.Results), len(qs))
	}
	for i, q := range qs {
		if resp.Results[i] != want[q.Name] {
			t.Errorf("%s on chdb %s:\n%q\nwant\n%q", q.Name, resp.Version, resp.Results[i], want[q.Name])
		}
	}
}

// nearCapInserts: balances of this month (the query reads the current
// period) whose usage or cap times 5 exceeds 64 bits. big uses 2·10¹⁸ of
// a cap of 2.2·10¹⁸ (90.9 %); unlimited 10 of a cap of MaxInt64 (0 %);
// small 850 of 1000 (85 %).
func nearCapInserts(db string, now time.Time) []string {
	cur := time.Date(now.Year(), now.Month(), 1, 0, 0, 0, 0, time.UTC)
	next := cur.AddDate(0, 1, 0)
	row := func(off int, cust string, usage, limit string) string {
		return fmt.Sprintf("SELECT 'usage.balances' AS t, toInt32(0) AS p, toInt64(%d) AS o, toDateTime(%d) AS ts, '%s' AS c, 'free' AS pl, "+
			"toInt64(1) AS r, toDateTime(%d) AS ps, toDateTime(%d) AS pe, ['api_calls'] AS mn, [toInt64(%s)] AS mu, [toInt64(%s)] AS ml, ['reject'] AS mo",
			off, cur.Unix(), cust, cur.Unix(), next.Unix(), usage, limit)
	}
	return []string{"INSERT INTO " + db + ".usage_balances (kafka_topic, kafka_partition, kafka_offset, kafka_timestamp, customer_id, plan, " +
		"revision, period_start, period_end, meter_names, meter_usage, meter_limits, meter_on_limit) SELECT * FROM (" +
		row(1, "big", "2000000000000000000", "2200000000000000000") + " UNION ALL " + row(2, "unlimited", "10", maxInt64) +
		" UNION ALL " + row(3, "small", "850", "1000") + ")",
		// rich has two grants of MaxInt64 credits left, which never expire.
		fmt.Sprintf("INSERT INTO %s.usage_balances (kafka_topic, kafka_partition, kafka_offset, kafka_timestamp, customer_id, plan, revision, "+
			"period_start, period_end, grant_ids, grant_priorities, grant_effective_from_ms, grant_expires_at, grant_expires_at_ms, grant_amounts, "+
			"grant_consumed, grant_remaining) SELECT 'usage.balances', toInt32(0), toInt64(4), toDateTime(%[2]d), 'rich', 'prepaid', toInt64(1), "+
			"toDateTime(%[2]d), toDateTime(%[3]d), ['a', 'b'], [toInt32(1), toInt32(1)], [toInt64(0), toInt64(0)], [toDateTime(0), toDateTime(0)], "+
			"[toInt64(0), toInt64(0)], [toInt64(%[4]s), toInt64(%[4]s)], [toInt64(0), toInt64(0)], [toInt64(%[4]s), toInt64(%[4]s)]",
			db, cur.Unix(), next.Unix(), maxInt64),
	}
}

const creditsLeftWant = "big\tfree\t0\t0\t\t1970-01-01 00:00:00\n" +
	"small\tfree\t0\t0\t\t1970-01-01 00:00:00\n" +
	"unlimited\tfree\t0\t0\t\t1970-01-01 00:00:00\n" +
	"rich\tprepaid\t18446744073709551614\t0\t\t1970-01-01 00:00:00\n"

const nearCapWant = "big\tfree\tapi_calls\t2000000000000000000\t2200000000000000000\t90.9\n" +
	"small\tfree\tapi_calls\t850\t1000\t85\n"

func balanceQuery(t *testing.T, name string) string { return namedQuery(t, BalanceQueries, name) }

// namedQuery returns the SQL of the query of qs named name.
func namedQuery(t *testing.T, qs []AnalystQuery, name string) string {
	t.Helper()
	for _, q := range qs {
		if q.Name == name {
			return q.SQL
		}
	}
	t.Fatal("no query " + name)
	return ""
}

// migratedDB returns a new database of the test server with every
// migration applied and the statements of inserts(database) run.
func migratedDB(t *testing.T, inserts func(db string) []string) (driver.Conn, string, context.Context) {
	t.Helper()
	conn, db := testenv.ClickHouseDB(t)
	ctx := ctxT(t, 5*time.Minute)
	if _, err := Migrate(ctx, conn); err != nil {
		t.Fatal(err)
	}
	for _, s := range inserts(db) {
		if err := conn.Exec(ctx, s); err != nil {
			t.Fatalf("%v\n%s", err, s)
		}
	}
	return conn, db, ctx
}

// TestNearCapDoesNotWrap: customers_near_cap lists the customers at 80 %
// of a cap or more, and only those, whatever the size of the cap and the
// usage (a cap of MaxInt64 stands for no practical limit), and
// credits_left adds up a customer's grants exactly, on ClickHouse 18.16
// and on chdb.
func TestNearCapDoesNotWrap(t *testing.T) {
	conn, _, ctx := migratedDB(t, func(db string) []string {
		return nearCapInserts(db, testenv.InOneMonth(t, 2*time.Minute, 2*time.Minute)) // the query reads now()'s month
	})
	for name, want := range map[string]string{"customers_near_cap": nearCapWant, "credits_left": creditsLeftWant} {
		got, err := tsv(ctx, conn, balanceQuery(t, name))
		if err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Errorf("%s on 18.16:\n%q\nwant\n%q", name, got, want)
		}
	}
}

// TestNearCapDoesNotWrapOnChdb is TestNearCapDoesNotWrap on current
// ClickHouse (chdb, 26.x).
func TestNearCapDoesNotWrapOnChdb(t *testing.T) {
	python := testenv.Chdb(t)
	now := testenv.InOneMonth(t, 5*time.Minute, 2*time.Minute) // the query reads now()'s month
	stmts := migrationStatements(t)
	const db = "nearcap"
	stmts = append(stmts, nearCapInserts(db, now)...)
	resp, err := runChdb(ctxT(t, 5*time.Minute), python, chdbRequest{Path: t.TempDir(), Database: db, Statements: stmts, Queries: []string{
		balanceQuery(t, "customers_near_cap"), balanceQuery(t, "credits_left")}})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{nearCapWant, creditsLeftWant}; !reflect.DeepEqual(resp.Results, want) {
		t.Errorf("customers_near_cap and credits_left on chdb %s:\n%q\nwant\n%q", resp.Version, resp.Results, want)
	}
}
