package sink

import (
	"fmt"
	"testing"
	"time"

	"github.com/meterline/meterline/internal/testenv"
)

// sortCostCustomers is the number of customers of TestDecimalOrderScales:
// enough for a sort whose cost grows with its rows squared to take minutes
// on ClickHouse 18.16, few enough to generate in seconds.
const sortCostCustomers = 100_000

// sortCostInserts: sortCostCustomers customers, each with a SUM aggregate
// of api_calls in January 2024 and a balance of this month with one grant
// that never expires; values repeat every 1,000 customers (ties, as a month
// of real usage has).
func sortCostInserts(db string, now time.Time) []string {
	cur := time.Date(now.Year(), now.Month(), 1, 0, 0, 0, 0, time.UTC)
	return []string{
		fmt.Sprintf("INSERT INTO %s.aggregates_current (customer_id, meter, period_start, group_key, period_end, aggregation, revision, status, value) "+
			"SELECT concat('c', toString(number)), 'api_calls', toDateTime('2024-01-01 00:00:00'), '', toDateTime('2024-02-01 00:00:00'), "+
			"'SUM', toUInt64(1), 'FINAL', toInt64(number %% 1000 + 1) FROM system.numbers LIMIT %d", db, sortCostCustomers),
		fmt.Sprintf("INSERT INTO %s.balances_current (customer_id, revision, plan, period_start, period_end, grant_ids, grant_priorities, "+
			"grant_effective_from_ms, grant_expires_at, grant_expires_at_ms, grant_amounts, grant_consumed, grant_remaining) "+
			"SELECT concat('c', toString(number)), toUInt64(1), 'prepaid', toDateTime(%d), toDateTime(%d), ['g'], [toInt32(1)], [toInt64(0)], "+
			"[toDateTime(0)], [toInt64(0)], [toInt64(1000)], [toInt64(number %% 1000)], [toInt64(1000 - number %% 1000)] "+
			"FROM system.numbers LIMIT %d", db, cur.Unix(), cur.AddDate(0, 1, 0).Unix(), sortCostCustomers),
	}
}

// TestDecimalOrderScales: the documented queries that list customers by
// an exact sum (top_customers, credits_left) answer in seconds at 100,000
// customers on ClickHouse 18.16, whose sort by a Decimal column followed
// by another key costs time in proportion to the rows squared.
func TestDecimalOrderScales(t *testing.T) {
	now := testenv.InOneMonth(t, 5*time.Minute, 2*time.Minute) // credits_left reads now()
	conn, _, _ := migratedDB(t, func(db string) []string { return sortCostInserts(db, now) })
	for _, q := range []struct {
		name, sql, first string
	}{
		{"top_customers", namedQuery(t, AnalystQueries, "top_customers"), "c10999\t1000\n"},
		{"credits_left", balanceQuery(t, "credits_left"), "c10999\tprepaid\t1\t"},
	} {
		start := time.Now()
		got, err := tsv(ctxT(t, 2*time.Minute), conn, q.sql)
		took := time.Since(start)
		if err != nil {
			t.Fatalf("%s: %v (after %v)", q.name, err, took)
		}
		if len(got) < len(q.first) || got[:len(q.first)] != q.first {
			t.Errorf("%s starts with %.60q, want %q", q.name, got, q.first)
		}
		if took > 10*time.Second {
			t.Errorf("%s took %v at %d customers on 18.16, want well under 10s", q.name, took.Round(time.Millisecond), sortCostCustomers)
		}
		t.Logf("%s: %v", q.name, took.Round(time.Millisecond))
	}
}
