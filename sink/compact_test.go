package sink

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"go.uber.org/zap/zaptest"

	"github.com/meterline/meterline/internal/testenv"
	chschema "github.com/meterline/meterline/schemas/clickhouse"
)

// TestViewsWriteOneRowPerKey inserts, in one INSERT each, 240 revisions of
// 3 aggregates (in no particular order) and 600 events of 2 customers on 3
// days: the views of the tables that keep one row per key write one row
// per key of the block (the latest revision; the day's count and sum), so
// the tables hold 3, 3 and 6 rows before any merge, not 240 and 600, and
// read the same answers as before (the latest revision's value, the
// day's totals).
func TestViewsWriteOneRowPerKey(t *testing.T) {
	conn, db := testenv.ClickHouseDB(t)
	ctx := ctxT(t, 2*time.Minute)
	if _, err := Migrate(ctx, conn); err != nil {
		t.Fatal(err)
	}
	// Revision r of aggregate k = r % 3 has value 1000 * k + r; revisions
	// run 1..240 in a shuffled order (i * 7 mod 240).
	aggs := `INSERT INTO ` + db + `.usage_aggregates (kafka_topic, kafka_partition, kafka_offset, kafka_timestamp, kafka_timestamp_ms,
    customer_id, meter, group_key, group_names, group_values, aggregation, period_start, period_end,
    revision, status, value, event_count, first_event_time_ms, last_event_time_ms, updated_at_ms)
SELECT 'usage.aggregates', 0, toInt64(number), toDateTime('2024-01-05 00:00:00'), 1704412800000,
       concat('c', toString(r % 3)), 'api_calls', '{}', [], [], 'SUM',
       toDateTime('2024-01-01 00:00:00'), toDateTime('2024-02-01 00:00:00'),
       toInt64(r), if(r > 237, 'FINAL', 'OPEN'), toInt64(1000 * (r % 3) + r), toInt64(1), 0, 0, 0
FROM (SELECT number, (number * 7) % 240 + 1 AS r FROM numbers(240))`
	events := `INSERT INTO ` + db + `.usage_events (kafka_topic, kafka_partition, kafka_offset, kafka_timestamp, kafka_timestamp_ms,
    event_id, customer_id, meter, quantity, event_time, event_time_ms, source, property_names, property_values,
    ingest_time, ingest_time_ms, source_partition, source_offset)
SELECT 'usage.deduped.v2', 0, toInt64(number), toDateTime('2024-01-05 00:00:00'), 1704412800000,
       concat('e', toString(number)), concat('c', toString(number % 2)), 'api_calls', toInt64(number + 1),
       toDateTime('2024-01-01 00:00:00') + 86400 * (intDiv(number, 2) % 3), 0, 'web', [], [],
       toDateTime('2024-01-05 00:00:00'), 0, 0, toInt64(number)
FROM numbers(600)`
	for _, s := range []string{aggs, events} {
		if err := conn.Exec(ctx, s); err != nil {
			t.Fatalf("%v\n%s", err, s)
		}
	}
	for _, c := range []struct {
		q    string
		want string
	}{
		// Rows as written, before any merge or FINAL.
		{"SELECT count() FROM " + db + ".aggregates_current", "3"},
		{"SELECT count() FROM " + db + ".invoice_lines", "3"},
		{"SELECT count() FROM " + db + ".usage_daily", "6"},
		// The answers: the latest revision of each aggregate (240, 238,
		// 239 for aggregates 0, 1, 2), the day's totals.
		{"SELECT customer_id, revision, status, value FROM " + db + ".aggregates_current FINAL ORDER BY customer_id",
			"c0\t240\tFINAL\t240\nc1\t238\tFINAL\t1238\nc2\t239\tFINAL\t2239"},
		{"SELECT customer_id, revision, status, value FROM " + db + ".invoice_lines FINAL ORDER BY customer_id",
			"c0\t240\tFINAL\t240\nc1\t238\tFINAL\t1238\nc2\t239\tFINAL\t2239"},
		{"SELECT customer_id, day, sum(events), sum(quantity) FROM " + db + ".usage_daily GROUP BY customer_id, day ORDER BY customer_id, day",
			dailyWant()},
	} {
		got, err := tsv(ctx, conn, c.q)
		if err != nil {
			t.Fatalf("%s: %v", c.q, err)
		}
		if got != c.want+"\n" {
			t.Errorf("%s:\n got %s want %s", c.q, got, c.want)
		}
	}
}

func dailyWant() string {
	var lines []string
	for c := 0; c < 2; c++ {
		for d := 0; d < 3; d++ {
			lines = append(lines, fmt.Sprintf("c%d\t2024-01-0%d\t100\t%d", c, d+1, dailySum(c, d)))
		}
	}
	return strings.Join(lines, "\n")
}

// dailySum is the quantity of customer c's events on day d of
// TestViewsWriteOneRowPerKey: events n < 600 with n % 2 = c and
// (n / 2) % 3 = d have quantity n + 1.
func dailySum(c, d int) int {
	s := 0
	for n := 0; n < 600; n++ {
		if n%2 == c && (n/2)%3 == d {
			s += n + 1
		}
	}
	return s
}

// TestCompactViewsMigrationBackfill migrates a database that holds data
// written through the views of 004_analyst_tables.sql (one row per
// revision and per event in the tables that keep one per key) to the
// compact views of 006_compact_views.sql: the migration records a
// backfill, so the sink refuses to start until `verify --backfill` ran;
// the backfill leaves one row per key in the derived tables, every month
// equal to the ledger, and every documented query answers as before.
func TestCompactViewsMigrationBackfill(t *testing.T) {
	conn, db := testenv.ClickHouseDB(t)
	ctx := ctxT(t, 5*time.Minute)
	before := migrateUpTo(ctx, t, conn, "006_compact_views.sql")
	data := SyntheticData{Events: 40_000, Revisions: 30_000, Customers: 60, Months: 3, Partitions: 4}
	for _, s := range data.Statements(db) {
		if err := conn.Exec(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	// The 004 views wrote a row per revision: more rows than aggregates.
	rows := func() (aggs, current, lines, events, daily uint64) {
		return e2count(t, conn, "SELECT uniqExact(customer_id, meter, group_key, period_start) FROM "+db+".usage_aggregates"),
			e2count(t, conn, "SELECT count() FROM "+db+".aggregates_current"),
			e2count(t, conn, "SELECT count() FROM "+db+".invoice_lines WHERE line_kind = 'usage'"),
			e2count(t, conn, "SELECT uniqExact(customer_id, meter, toDate(event_time)) FROM "+db+".usage_events"),
			e2count(t, conn, "SELECT count() FROM "+db+".usage_daily")
	}
	aggs, current, lines, events, daily := rows()
	if current <= aggs || lines <= aggs || daily <= events {
		t.Fatalf("before the migration: %d aggregates in %d rows of aggregates_current and %d usage lines; %d customer days in %d rows of usage_daily: want more rows than keys",
			aggs, current, lines, events, daily)
	}
	answers := func() []string {
		var out []string
		for _, p := range []QueryParams{{Customer: "cust-0", Meter: "api_calls", Month: SyntheticStart}, {Customer: "cust-7", Meter: "tokens", Month: SyntheticStart.AddDate(0, 1, 0)}} {
			for _, q := range AnalystQueries {
				if strings.Contains(q.SQL, "FROM sink_progress") {
					continue // a table of 008_sink_progress.sql, after the migrations the data went in with
				}
				sql, err := q.For(p)
				if err != nil {
					t.Fatal(err)
				}
				r, err := tsv(ctx, conn, sql)
				if err != nil {
					t.Fatalf("%s: %v", q.Name, err)
				}
				out = append(out, r)
			}
		}
		return out
	}
	want := answers()

	migrateAndBackfill(ctx, t, conn, db, before, "006_compact_views.sql")
	aggs, current, lines, events, daily = rows()
	if current != aggs || lines != aggs || daily != events {
		t.Errorf("after the backfill: %d aggregates in %d rows of aggregates_current and %d usage lines; %d customer days in %d rows of usage_daily: want one row per key",
			aggs, current, lines, events, daily)
	}
	got := answers()
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("query %d answers differently after the migration:\nbefore:\n%s\nafter:\n%s", i, head(want[i], 5), head(got[i], 5))
		}
	}
	verifyEqual(ctx, t, conn, db, 202401)
}

// verifyEqual runs verify from month since: every month of every derived
// table must equal the ledger.
func verifyEqual(ctx context.Context, t *testing.T, conn driver.Conn, db string, since uint32) {
	t.Helper()
	rep, err := Verify(ctx, VerifyConfig{Conn: conn, Database: db, Since: since, Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range rep.Months {
		if m.Status != MonthEqual {
			t.Errorf("verify: %s %d %s", m.Table, m.Month, m.Status)
		}
	}
}

// migrateAndBackfill applies the migrations from ms[before], which must be
// name, on a database that holds data: the sink then refuses to start
// until `verify --backfill` ran, which rebuilds months and leaves them
// equal to the ledger.
func migrateAndBackfill(ctx context.Context, t *testing.T, conn driver.Conn, db string, before int, name string) {
	t.Helper()
	res, err := Migrate(ctx, conn)
	if err != nil {
		t.Fatal(err)
	}
	if m := res[before]; m.Migration.Name != name || !m.Applied {
		t.Fatalf("migration %s applied %v, want %s applied", m.Migration.Name, m.Applied, name)
	}
	if err := CheckRebuilds(ctx, conn); !errors.Is(err, ErrRebuildUnfinished) {
		t.Fatalf("after migrating a database with data: %v, want ErrRebuildUnfinished", err)
	}
	noSink := func(context.Context) ([]string, error) { return nil, nil }
	rep, err := Verify(ctx, VerifyConfig{Conn: conn, Database: db, Backfill: true, SinkMembers: noSink, Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Rebuilt == 0 || rep.Differs != 0 {
		t.Fatalf("backfill: %d months rebuilt, %d differ: %+v", rep.Rebuilt, rep.Differs, rep.Months)
	}
	if err := CheckRebuilds(ctx, conn); err != nil {
		t.Fatalf("after the backfill: %v", err)
	}
}

// migrateUpTo applies the migrations before the one called name, and
// returns its index.
func migrateUpTo(ctx context.Context, t *testing.T, conn driver.Conn, name string) int {
	t.Helper()
	ms, err := chschema.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	for i, m := range ms {
		if m.Name == name {
			if _, err := migrate(ctx, conn, ms[:i]); err != nil {
				t.Fatal(err)
			}
			return i
		}
	}
	t.Fatalf("no migration %s", name)
	return -1
}
