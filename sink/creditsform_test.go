package sink

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"

	"github.com/meterline/meterline/internal/testenv"
)

// latestBalanceSorted is the form the credit queries of BalanceQueries had
// before they took each customer's latest billing period by
// `(customer_id, period_start) IN (SELECT customer_id, max(period_start) …)`:
// every row of balances_current after FINAL, sorted whole and cut to one
// per customer. TestCreditQueriesSameRows and TestCreditQueriesMemory
// run it beside the queries of BalanceQueries.
const latestBalanceSorted = "FROM (SELECT * FROM balances_current FINAL ORDER BY customer_id, period_start DESC LIMIT 1 BY customer_id)"

// creditQueriesSorted are credits_expiring_this_month and credits_left of
// BalanceQueries in the sorted form (latestBalanceSorted).
var creditQueriesSorted = map[string]string{
	"credits_expiring_this_month": `
SELECT customer_id, grant_id, remaining, expires_at
` + latestBalanceSorted + `
ARRAY JOIN grant_ids AS grant_id, grant_remaining AS remaining, grant_expires_at_ms AS expires_at_ms, grant_expires_at AS expires_at
WHERE expires_at_ms != 0 AND remaining > 0
  AND expires_at_ms > toUnixTimestamp(now()) * 1000
  AND expires_at_ms <= toUnixTimestamp(toDateTime(addMonths(toStartOfMonth(now()), 1))) * 1000
ORDER BY expires_at, customer_id, grant_id`,
	"credits_left": `
SELECT customer_id, plan,
       arrayReduce('sum', arrayMap(r -> toDecimal128(r, 0),
           arrayFilter((r, e) -> e = 0 OR e > toUnixTimestamp(now()) * 1000, grant_remaining, grant_expires_at_ms))) AS credits_left,
       overdrawn, overdraft_policy, updated_at
` + latestBalanceSorted + `
ORDER BY length(toString(credits_left)), toString(credits_left), customer_id`,
}

// creditGrant is a grant of a creditRow: expires 0 never expires.
type creditGrant struct {
	id        string
	remaining int64
	expires   time.Time
}

// creditRow is one row written to balances_current; latest marks the row
// that FINAL and the customer's latest period leave for it.
type creditRow struct {
	customer  string
	revision  uint64
	start     time.Time
	end       time.Time
	grants    []creditGrant
	overdrawn int64
	latest    bool
}

func (r creditRow) updatedAt() time.Time { return r.start.Add(time.Duration(r.revision) * time.Second) }

func (r creditRow) insert(db string) string {
	var ids, rem, exp, expMs []string
	for _, g := range r.grants {
		e := int64(0)
		if !g.expires.IsZero() {
			e = g.expires.Unix()
		}
		ids = append(ids, "'"+g.id+"'")
		rem = append(rem, strconv.FormatInt(g.remaining, 10))
		exp = append(exp, fmt.Sprintf("toDateTime(%d)", e))
		expMs = append(expMs, strconv.FormatInt(e*1000, 10))
	}
	arr := func(v []string, typ string) string {
		return "CAST([" + strings.Join(v, ",") + "] AS Array(" + typ + "))"
	}
	return fmt.Sprintf("INSERT INTO %s.balances_current (customer_id, revision, plan, updated_at, updated_at_ms, period_start, period_end, "+
		"grant_ids, grant_expires_at, grant_expires_at_ms, grant_remaining, overdraft_policy, overdrawn) "+
		"SELECT '%s', toUInt64(%d), 'prepaid', toDateTime(%d), toInt64(%d), toDateTime(%d), toDateTime(%d), %s, %s, %s, %s, 'deny', toInt64(%d)",
		db, r.customer, r.revision, r.updatedAt().Unix(), r.updatedAt().UnixMilli(), r.start.Unix(), r.end.Unix(),
		arr(ids, "String"), arr(exp, "DateTime"), arr(expMs, "Int64"), arr(rem, "Int64"), r.overdrawn)
}

// creditRows: balances of six customers, each INSERT a part of its own (no
// merge has collapsed them; FINAL does at read): several revisions of one
// period written out of order (multi), four rows of one period with the
// same revision and different credits (tie: the last written is the one
// FINAL keeps), a customer with one row whose latest period is last
// month (single), a period's row written twice and an earlier period's
// row with a higher revision (restated: the latest period wins, not the
// highest revision), daily billing periods written out of order (daily),
// and months later dropped (creditDropped: gone has no row left, dropped
// has its month before).
func creditRows(now time.Time) []creditRow {
	cur := time.Date(now.Year(), now.Month(), 1, 0, 0, 0, 0, time.UTC)
	next, prev := cur.AddDate(0, 1, 0), cur.AddDate(0, -1, 0)
	soon := now.Add(next.Sub(now) / 2).Truncate(time.Second)
	never, expired := time.Time{}, now.Add(-time.Minute).Truncate(time.Second)
	day := func(n int) time.Time { return cur.AddDate(0, 0, n) }
	g := func(id string, rem int64, exp time.Time) creditGrant { return creditGrant{id, rem, exp} }
	return []creditRow{
		{"multi", 2, prev, cur, []creditGrant{g("base", 100, never)}, 0, false},
		{"multi", 3, cur, next, []creditGrant{g("base", 90, never), g("promo", 50, soon)}, 0, false},
		{"multi", 5, cur, next, []creditGrant{g("base", 70, never), g("promo", 20, soon)}, 3, true},
		{"multi", 4, cur, next, []creditGrant{g("base", 80, never), g("promo", 40, soon)}, 0, false},
		{"tie", 6, prev, cur, []creditGrant{g("t", 1, never)}, 0, false},
		{"tie", 6, prev, cur, []creditGrant{g("t", 2, never)}, 0, false},
		{"tie", 7, cur, next, []creditGrant{g("t", 10, never), g("tp", 5, soon)}, 1, false},
		{"tie", 7, cur, next, []creditGrant{g("t", 12, never), g("tp", 7, soon)}, 3, false},
		{"tie", 7, cur, next, []creditGrant{g("t", 13, never), g("tp", 8, soon)}, 4, false},
		{"tie", 7, cur, next, []creditGrant{g("t", 11, never), g("tp", 6, soon)}, 2, true},
		{"single", 1, prev, cur, []creditGrant{g("s", 300, never), g("old", 200, expired), g("sx", 30, soon)}, 0, true},
		{"restated", 9, prev, cur, []creditGrant{g("r", 999, never), g("rx", 9, soon)}, 0, false},
		{"restated", 3, cur, next, []creditGrant{g("r", 5, never)}, 4, false},
		{"restated", 3, cur, next, []creditGrant{g("r", 5, never)}, 4, true},
		{"daily", 1, day(0), day(1), []creditGrant{g("d", 10, soon)}, 0, false},
		{"daily", 3, day(2), day(3), []creditGrant{g("d", 30, soon)}, 0, true},
		{"daily", 2, day(1), day(2), []creditGrant{g("d", 20, soon)}, 0, false},
		{"dropped", 1, cur.AddDate(0, -4, 0), cur.AddDate(0, -3, 0), []creditGrant{g("y", 4, never)}, 0, true},
		{"dropped", 2, cur.AddDate(0, -3, 0), cur.AddDate(0, -2, 0), []creditGrant{g("y", 3, never), g("yx", 7, soon)}, 0, false},
		{"gone", 1, cur.AddDate(0, -3, 0), cur.AddDate(0, -2, 0), []creditGrant{g("z", 8, soon)}, 0, false},
	}
}

// creditDropped is the month of creditRows dropped after the inserts (a
// month of balances_current removed, as retention does).
func creditDropped(now time.Time) string {
	return time.Date(now.Year(), now.Month(), 1, 0, 0, 0, 0, time.UTC).AddDate(0, -3, 0).Format("200601")
}

func creditStatements(db string, now time.Time) []string {
	var stmts []string
	for _, r := range creditRows(now) {
		stmts = append(stmts, r.insert(db))
	}
	return append(stmts, "ALTER TABLE "+db+".balances_current DROP PARTITION "+creditDropped(now))
}

// creditWant: credits_expiring_this_month and credits_left on creditRows,
// from the rows marked latest.
func creditWant(now time.Time) map[string]string {
	type left struct {
		sum  int64
		line string
	}
	var lefts []left
	var exp []string
	for _, r := range creditRows(now) {
		if !r.latest {
			continue
		}
		var sum int64
		for _, g := range r.grants {
			if g.expires.IsZero() || g.expires.After(now) {
				sum += g.remaining
			}
			if !g.expires.IsZero() && g.expires.After(now) && g.remaining > 0 {
				exp = append(exp, fmt.Sprintf("%s\t%s\t%d\t%s\n", r.customer, g.id, g.remaining, g.expires.UTC().Format(time.DateTime)))
			}
		}
		lefts = append(lefts, left{sum, fmt.Sprintf("%s\tprepaid\t%d\t%d\tdeny\t%s\n", r.customer, sum, r.overdrawn, r.updatedAt().UTC().Format(time.DateTime))})
	}
	// Every expiring grant expires at the same instant (soon): by customer, then grant.
	sortStrings(exp)
	for i := 1; i < len(lefts); i++ {
		for j := i; j > 0 && lefts[j].sum < lefts[j-1].sum; j-- {
			lefts[j], lefts[j-1] = lefts[j-1], lefts[j]
		}
	}
	var cl strings.Builder
	for _, l := range lefts {
		cl.WriteString(l.line)
	}
	return map[string]string{"credits_expiring_this_month": strings.Join(exp, ""), "credits_left": cl.String()}
}

func sortStrings(s []string) {
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && s[j] < s[j-1]; j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
}

// TestCreditQueriesSameRows: credits_expiring_this_month and credits_left
// of BalanceQueries give the rows of their sorted form
// (creditQueriesSorted), and the rows worked out from creditRows, on
// ClickHouse 18.16 and on chdb (26.x): several revisions of a balance,
// equal revisions, a customer with one row, rows written again, an
// earlier period with a higher revision, daily periods and a dropped month.
func TestCreditQueriesSameRows(t *testing.T) {
	python := testenv.Chdb(t)
	now := testenv.InOneMonth(t, 5*time.Minute, 2*time.Minute)
	want := creditWant(now)
	names := []string{"credits_expiring_this_month", "credits_left"}

	conn, _, ctx := migratedDB(t, func(db string) []string { return creditStatements(db, now) })
	var queries []string
	for _, n := range names {
		queries = append(queries, creditQueriesSorted[n], balanceQuery(t, n))
	}
	onServer := make([]string, len(queries))
	for i, q := range queries {
		got, err := tsv(ctx, conn, q)
		if err != nil {
			t.Fatalf("%v\n%s", err, q)
		}
		onServer[i] = got
	}
	const cdb = "creditsform"
	resp, err := runChdb(ctxT(t, 5*time.Minute), python, chdbRequest{
		Path: t.TempDir(), Database: cdb, Statements: append(migrationStatements(t), creditStatements(cdb, now)...), Queries: queries,
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range []struct {
		version string
		results []string
	}{{"18.16", onServer}, {"chdb " + resp.Version, resp.Results}} {
		for i, n := range names {
			sorted, got := v.results[2*i], v.results[2*i+1]
			if got != sorted {
				t.Errorf("%s on %s:\n%s\nsorted form (LIMIT 1 BY):\n%s", n, v.version, got, sorted)
			}
			if got != want[n] {
				t.Errorf("%s on %s:\n%s\nwant\n%s", n, v.version, got, want[n])
			}
		}
	}
}

// creditMemoryCustomers × creditMemoryMonths balances: enough for the
// sorted form's memory to stand well above the per-customer latest
// period's on ClickHouse 18.16, few enough to generate in seconds.
const (
	creditMemoryCustomers = 200_000
	creditMemoryMonths    = 6
)

// creditMemoryInserts: every customer has a balance in each of
// creditMemoryMonths months ending with this one (two caps, two grants,
// one expiring later this month), and a second revision in the latest
// month for one customer in four.
func creditMemoryInserts(db string, now time.Time) []string {
	cur := time.Date(now.Year(), now.Month(), 1, 0, 0, 0, 0, time.UTC)
	soon := now.Add(cur.AddDate(0, 1, 0).Sub(now) / 2).Unix() // this month, after now
	row := func(m int, rev int, where string) string {
		ps := cur.AddDate(0, m-creditMemoryMonths+1, 0).Unix()
		return fmt.Sprintf("INSERT INTO %s.balances_current (customer_id, revision, plan, updated_at, updated_at_ms, period_start, period_end, "+
			"meter_names, meter_usage, meter_limits, meter_on_limit, grant_ids, grant_priorities, grant_effective_from_ms, grant_expires_at, "+
			"grant_expires_at_ms, grant_amounts, grant_consumed, grant_remaining, overdraft_policy, overdrawn, kafka_offset) "+
			"SELECT concat('cust-', toString(number)), toUInt64(%[2]d), 'prepaid', toDateTime(%[3]d + 3600), toInt64(%[3]d + 3600) * 1000, "+
			"toDateTime(%[3]d), addMonths(toDateTime(%[3]d), 1), ['api_calls', 'tokens'], [toInt64(number %% 1000), toInt64(number %% 777)], "+
			"[toInt64(1000), toInt64(5000)], ['reject', 'overdraft'], ['grant-a', concat('grant-', toString(number %% 97))], [toInt32(1), toInt32(2)], "+
			"[toInt64(0), toInt64(0)], [toDateTime(0), toDateTime(%[6]d)], [toInt64(0), toInt64(%[6]d) * 1000], "+
			"[toInt64(100000), toInt64(5000)], [toInt64(number %% 5000), toInt64(number %% 300)], [toInt64(100000 - number %% 5000), toInt64(5000 - number %% 300 - %[2]d)], "+
			"'allow', toInt64(number %% 13), toInt64(number) FROM (SELECT number FROM system.numbers LIMIT %[5]d) WHERE %[4]s",
			db, 100*m+rev, ps, where, creditMemoryCustomers, soon)
	}
	var stmts []string
	for m := range creditMemoryMonths {
		stmts = append(stmts, row(m, 1, "1"))
	}
	return append(stmts, row(creditMemoryMonths-1, 2, "number % 4 = 0"))
}

// TestCreditQueriesMemory: on ClickHouse 18.16, at 200,000 customers
// with six months of balances, credits_left and
// credits_expiring_this_month take half or less of the memory of their
// sorted form (system.query_log memory_usage), with the same answer. The
// sorted form's memory grows with the rows of every period, theirs with
// the customers: at a million customers the ratio is 3 to 5.
func TestCreditQueriesMemory(t *testing.T) {
	now := testenv.InOneMonth(t, 5*time.Minute, 2*time.Minute)
	conn, db, ctx := migratedDB(t, func(db string) []string { return creditMemoryInserts(db, now) })
	run := fmt.Sprintf("%s-%d", db, time.Now().UnixNano())
	for _, n := range []string{"credits_expiring_this_month", "credits_left"} {
		var got [2]string
		var mem [2]uint64
		for i, q := range []string{creditQueriesSorted[n], balanceQuery(t, n)} {
			id := fmt.Sprintf("%s-%s-%d", run, n, i)
			qctx := clickhouse.Context(ctx, clickhouse.WithQueryID(id), clickhouse.WithSettings(clickhouse.Settings{"log_queries": 1}))
			var err error
			if got[i], err = tsv(qctx, conn, q); err != nil {
				t.Fatalf("%s: %v", n, err)
			}
			if err := conn.Exec(ctx, "SYSTEM FLUSH LOGS"); err != nil {
				t.Fatal(err)
			}
			if err := conn.QueryRow(ctx, "SELECT memory_usage FROM system.query_log WHERE type = 2 AND query_id = ?", id).Scan(&mem[i]); err != nil {
				t.Fatalf("%s: query_log: %v", n, err)
			}
		}
		if got[0] != got[1] {
			t.Errorf("%s: %d bytes of answer, sorted form %d bytes: different", n, len(got[1]), len(got[0]))
		}
		if lines := strings.Count(got[1], "\n"); n == "credits_left" && lines != creditMemoryCustomers {
			t.Errorf("%s: %d rows, want %d", n, lines, creditMemoryCustomers)
		}
		t.Logf("%s at %d customers × %d months: %d MiB, sorted form (LIMIT 1 BY) %d MiB", n, creditMemoryCustomers, creditMemoryMonths, mem[1]>>20, mem[0]>>20)
		if mem[1]*2 > mem[0] {
			t.Errorf("%s took %d MiB, sorted form %d MiB: want half or less", n, mem[1]>>20, mem[0]>>20)
		}
	}
}
