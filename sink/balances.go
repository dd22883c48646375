package sink

import (
	"strings"

	"github.com/meterline/meterline/internal/topics"
	"github.com/meterline/meterline/schemas"
)

// TableBalances is the ledger table of usage.balances
// (docs/entitlements.md, Balances in ClickHouse); the view balances_current
// keeps the latest balance of each customer
// (schemas/clickhouse/005_balances.sql).
const TableBalances = "usage_balances"

// balancesTable maps usage.balances to usage_balances: a customer's caps
// and grants as parallel arrays, and caps_until (0 in a balance written
// before the field, and in both columns when no change is known).
func balancesTable(n topics.Names, cols func(...column) []column) *table {
	type ba = schemas.Balance
	return &table{
		name: TableBalances, topic: n.BalancesTopic(),
		columns: cols(
			mcol("customer_id", func(b *ba) string { return b.CustomerID }),
			mcol("plan", func(b *ba) string { return b.Plan }),
			mcol("unmetered", func(b *ba) uint8 { return boolU8(b.Unmetered) }),
			mcol("revision", func(b *ba) int64 { return b.Revision }),
			mcol("updated_at", func(b *ba) int64 { return secs(b.UpdatedAt) }),
			mcol("updated_at_ms", func(b *ba) int64 { return b.UpdatedAt }),
			mcol("period_start", func(b *ba) int64 { return secs(b.PeriodStart) }),
			mcol("period_end", func(b *ba) int64 { return secs(b.PeriodEnd) }),
			mcol("meter_names", func(b *ba) []string { return each(b.Meters, func(m schemas.MeterBalance) string { return m.Meter }) }),
			mcol("meter_usage", func(b *ba) []int64 { return each(b.Meters, func(m schemas.MeterBalance) int64 { return m.Usage }) }),
			mcol("meter_limits", func(b *ba) []int64 { return each(b.Meters, func(m schemas.MeterBalance) int64 { return m.Limit }) }),
			mcol("meter_on_limit", func(b *ba) []string {
				return each(b.Meters, func(m schemas.MeterBalance) string { return strings.ToLower(string(m.OnLimit)) })
			}),
			mcol("grant_ids", func(b *ba) []string { return each(b.Grants, func(g schemas.GrantBalance) string { return g.ID }) }),
			mcol("grant_priorities", func(b *ba) []int32 { return each(b.Grants, func(g schemas.GrantBalance) int32 { return g.Priority }) }),
			mcol("grant_effective_from_ms", func(b *ba) []int64 {
				return each(b.Grants, func(g schemas.GrantBalance) int64 { return g.EffectiveFrom })
			}),
			mcol("grant_expires_at", func(b *ba) []int64 {
				return each(b.Grants, func(g schemas.GrantBalance) int64 { return secs(g.ExpiresAt) })
			}),
			mcol("grant_expires_at_ms", func(b *ba) []int64 { return each(b.Grants, func(g schemas.GrantBalance) int64 { return g.ExpiresAt }) }),
			mcol("grant_amounts", func(b *ba) []int64 { return each(b.Grants, func(g schemas.GrantBalance) int64 { return g.Amount }) }),
			mcol("grant_consumed", func(b *ba) []int64 { return each(b.Grants, func(g schemas.GrantBalance) int64 { return g.Consumed }) }),
			mcol("grant_remaining", func(b *ba) []int64 { return each(b.Grants, func(g schemas.GrantBalance) int64 { return g.Remaining }) }),
			mcol("overdraft_policy", func(b *ba) string { return strings.ToLower(string(b.OverdraftPolicy)) }),
			mcol("overdraft_limit", func(b *ba) int64 { return b.OverdraftLimit }),
			mcol("overdrawn", func(b *ba) int64 { return b.Overdrawn }),
			mcol("caps_until", func(b *ba) int64 { return secs(b.CapsUntil) }),
			mcol("caps_until_ms", func(b *ba) int64 { return b.CapsUntil }),
		),
		decode: decoder[ba](func(b *ba) identity { return identity{customer: b.CustomerID} }),
	}
}

func each[E, T any](es []E, f func(E) T) []T {
	out := make([]T, len(es))
	for i, e := range es {
		out[i] = f(e)
	}
	return out
}

// BalanceQueries are the analyst queries of docs/entitlements.md, in its
// order, over balances_current. TestBalanceQueries runs each one on real
// data and checks its numbers. The credit queries read a customer's latest
// balance as the row of balances_current FINAL in its latest period,
// picked by (customer_id, period_start) IN (… max(period_start) … GROUP BY
// customer_id): memory per customer, not per row of every period as a
// sort with LIMIT 1 BY takes, and the row FINAL keeps among equal
// revisions, which argMax does not promise (TestCreditQueriesSameRows,
// TestCreditQueriesMemory).
var BalanceQueries = []AnalystQuery{
	{Name: "customers_near_cap", Title: "Customers at or above 80% of a cap in the current period", SQL: `
SELECT customer_id, plan, meter, usage, cap, round(100 * toFloat64(usage) / cap, 1) AS percent
FROM balances_current FINAL
ARRAY JOIN meter_names AS meter, meter_usage AS usage, meter_limits AS cap
WHERE period_end > now() AND unmetered = 0 AND toDecimal128(usage, 0) * 5 >= toDecimal128(cap, 0) * 4
  AND (caps_until_ms = 0 OR caps_until_ms > toUnixTimestamp(now()) * 1000)
ORDER BY percent DESC, customer_id, meter`},

	{Name: "credits_expiring_this_month", Title: "Credits that expire this month", SQL: `
SELECT customer_id, grant_id, remaining, expires_at
FROM (SELECT * FROM balances_current FINAL)
ARRAY JOIN grant_ids AS grant_id, grant_remaining AS remaining, grant_expires_at_ms AS expires_at_ms, grant_expires_at AS expires_at
WHERE (customer_id, period_start) IN (SELECT customer_id, max(period_start) FROM balances_current GROUP BY customer_id)
  AND expires_at_ms != 0 AND remaining > 0
  AND expires_at_ms > toUnixTimestamp(now()) * 1000
  AND expires_at_ms <= toUnixTimestamp(toDateTime(addMonths(toStartOfMonth(now()), 1))) * 1000
ORDER BY expires_at, customer_id, grant_id`},

	{Name: "credits_left", Title: "Credits left and overdraft per customer", SQL: `
SELECT customer_id, plan,
       arrayReduce('sum', arrayMap(r -> toDecimal128(r, 0),
           arrayFilter((r, e) -> e = 0 OR e > toUnixTimestamp(now()) * 1000, grant_remaining, grant_expires_at_ms))) AS credits_left,
       overdrawn, overdraft_policy, updated_at
FROM (SELECT * FROM balances_current FINAL)
WHERE (customer_id, period_start) IN (SELECT customer_id, max(period_start) FROM balances_current GROUP BY customer_id)
ORDER BY length(toString(credits_left)), toString(credits_left), customer_id`},
}
