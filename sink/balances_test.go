package sink

import (
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/schemas"
)

// TestBalanceQueries writes balances through Kafka and the sink: every one
// lands in usage_balances, balances_current keeps the latest of each
// customer, and the queries of docs/entitlements.md give the numbers
// worked out by hand.
func TestBalanceQueries(t *testing.T) {
	e := newEnv(t, 2)
	// The queries compare with ClickHouse's now(): the data, of the month
	// of now, and the queries run in one month.
	now := testenv.InOneMonth(t, 2*time.Minute, 2*time.Minute)
	cur := time.Date(now.Year(), now.Month(), 1, 0, 0, 0, 0, time.UTC)
	next, prev := cur.AddDate(0, 1, 0), cur.AddDate(0, -1, 0)
	ms := func(t time.Time) int64 { return t.UnixMilli() }
	// A grant that expires later this month (InOneMonth: the month does
	// not end within two minutes).
	soon := now.Add(2 * time.Minute).Truncate(time.Second)
	expired := now.Add(-time.Minute).Truncate(time.Second)

	var recs []*kgo.Record
	add := func(b *schemas.Balance) {
		key := schemas.CustomerKey(b.CustomerID)
		recs = append(recs, &kgo.Record{Topic: e.names.BalancesTopic(), Partition: schemas.Partition(key, e.parts), Key: key,
			Value: schemas.MustEncode(b), Timestamp: base.Add(time.Duration(len(recs)) * time.Second)})
	}
	// Each balance says a change of its caps is scheduled (caps_until) at
	// its period's end: its caps are those in effect now.
	capped := func(cust string, rev int64, start, end time.Time, meters []schemas.MeterBalance, grants []schemas.GrantBalance, overdrawn int64) {
		add(&schemas.Balance{CustomerID: cust, Plan: "free", Revision: rev, UpdatedAt: ms(start) + rev, PeriodStart: ms(start), PeriodEnd: ms(end),
			Meters: meters, Grants: grants, OverdraftPolicy: schemas.OverdraftDeny, Overdrawn: overdrawn, CapsUntil: ms(end) + rev})
	}
	mb := func(m string, usage, limit int64) schemas.MeterBalance {
		return schemas.MeterBalance{Meter: m, Usage: usage, Limit: limit, OnLimit: schemas.OnLimitReject}
	}
	gb := func(id string, amount, consumed int64, exp time.Time) schemas.GrantBalance {
		g := schemas.GrantBalance{ID: id, Amount: amount, Consumed: consumed, Remaining: max(0, amount-consumed)}
		if !exp.IsZero() {
			g.ExpiresAt = ms(exp)
		}
		return g
	}
	capped("acme", 1, cur, next, []schemas.MeterBalance{mb("api_calls", 500, 1000), mb("tokens", 10, 5000)},
		[]schemas.GrantBalance{gb("annual", 10_000, 0, time.Time{}), gb("promo", 1000, 0, soon)}, 0)
	capped("acme", 2, cur, next, []schemas.MeterBalance{mb("api_calls", 850, 1000), mb("tokens", 4000, 5000)},
		[]schemas.GrantBalance{gb("annual", 10_000, 2500, time.Time{}), gb("promo", 1000, 700, soon)}, 0)
	capped("globex", 1, cur, next, []schemas.MeterBalance{mb("api_calls", 100, 1000)},
		[]schemas.GrantBalance{gb("trial", 500, 500, soon), gb("next", 800, 0, next.Add(24*time.Hour))}, 1200)
	capped("initech", 7, prev, cur, []schemas.MeterBalance{mb("api_calls", 990, 1000)}, nil, 0) // last period
	// hooli's monthly grant ends with the month (expires_at the first
	// instant of the next): it expires this month. soylent's grant expired
	// a minute ago, after its last balance: it has no credits left.
	capped("hooli", 1, cur, next, nil, []schemas.GrantBalance{gb("monthly", 1000, 600, next)}, 0)
	capped("soylent", 1, cur, next, nil, []schemas.GrantBalance{gb("spent", 900, 300, expired)}, 0)
	// wonka's grant pays for the first millisecond of next month too: it
	// expires next month, not this one (grant_expires_at has whole
	// seconds, grant_expires_at_ms the millisecond).
	capped("wonka", 1, cur, next, nil, []schemas.GrantBalance{gb("overlap", 500, 0, next.Add(time.Millisecond))}, 0)
	// umbrella is unmetered: its plan's cap is counted against, never
	// applied (docs/entitlements.md, Plans and caps), so it is near no cap.
	add(&schemas.Balance{CustomerID: "umbrella", Plan: "staff", Unmetered: true, Revision: 3, UpdatedAt: ms(cur), PeriodStart: ms(cur),
		PeriodEnd: ms(next), Meters: []schemas.MeterBalance{mb("api_calls", 1500, 1000)}, OverdraftPolicy: schemas.OverdraftAllow})
	// tyrell's grant expires in this month's middle plus 2³² seconds
	// (in 2163): a time past DateTime's range. Its grant_expires_at_ms is
	// exact, and converted to a DateTime on 18.16 it would wrap to this
	// month: it expires in a century, not this month.
	wrapped := now.Add(next.Sub(now) / 2).Truncate(time.Second)
	capped("tyrell", 1, cur, next, nil, []schemas.GrantBalance{gb("centennial", 700, 0, wrapped.Add(1<<32*time.Second))}, 0)
	e.produce(recs...)
	r := e.start(nil)
	e.waitCaughtUp(time.Minute)
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	e.exact(TableBalances, 9)
	if n := render(queryStrings(t, e.conn, "SELECT count() FROM "+e.db+".balances_current FINAL")); n != "8\n" {
		t.Errorf("balances_current has %s rows, want one per customer (8)", n)
	}
	row := queryStrings(t, e.conn, "SELECT revision, meter_names, meter_usage, meter_on_limit, grant_ids, grant_remaining, grant_expires_at_ms, "+
		"caps_until_ms FROM "+e.db+".balances_current FINAL WHERE customer_id = 'acme'")
	if got, want := render(row), "2 | [api_calls tokens] | [850 4000] | [reject reject] | [annual promo] | [7500 300] | [0 "+
		strconv.FormatInt(ms(soon), 10)+"] | "+strconv.FormatInt(ms(next)+2, 10)+"\n"; got != want {
		t.Errorf("acme's current balance:\n got %s want %s", got, want)
	}

	d := func(t time.Time) string { return t.Format("2006-01-02 15:04:05") }
	expiring := [][]string{{"acme", "promo", "300", d(soon)}, {"hooli", "monthly", "400", d(next)}}
	want := map[string][][]string{
		"customers_near_cap": {
			{"acme", "free", "api_calls", "850", "1000", "85.0000"},
			{"acme", "free", "tokens", "4000", "5000", "80.0000"},
		},
		"credits_expiring_this_month": expiring,
		"credits_left": {
			{"initech", "free", "0", "0", "deny", d(prev)},
			{"soylent", "free", "0", "0", "deny", d(cur)},
			{"umbrella", "staff", "0", "0", "allow", d(cur)},
			{"hooli", "free", "400", "0", "deny", d(cur)},
			{"wonka", "free", "500", "0", "deny", d(cur)},
			{"tyrell", "free", "700", "0", "deny", d(cur)},
			{"globex", "free", "800", "1200", "deny", d(cur)},
			{"acme", "free", "7800", "0", "deny", d(cur)},
		},
	}
	checkQueries(t, e.conn, BalanceQueries, want)
}
