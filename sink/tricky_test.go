package sink

import (
	"fmt"
	"testing"
	"time"

	"github.com/meterline/meterline/internal/testenv"
)

// Hard cases for the queries of docs/analysts.md, each row its own INSERT
// (its own part: nothing merged before the queries run, no OPTIMIZE), in
// the database's default topics: times a millisecond either side of a
// month's end; acme's events in three months; revisions of an aggregate
// written out of order, one of them replayed after its FINAL (a zombie
// sink's row); a FINAL with adjustments booked into it, positive and
// negative (a LATEST meter), two late copies of one identity, and a
// replayed adjustment; an adjustment booked into a period already
// invoiced; rejections of every reason, one replayed; an aggregator
// rejection whose identity is not the event at the offset it names.

// trickyMs is t ("2006-01-02 15:04:05.000", UTC) in Unix milliseconds.
func trickyMs(t string) int64 {
	v, err := time.Parse("2006-01-02 15:04:05.000", t)
	if err != nil {
		panic(err)
	}
	return v.UnixMilli()
}

// trickyEvents: acme's events in usage.deduped.v2, arriving a minute
// after they happened (kafka_timestamp and ingest_time, in their
// seconds rounded down as the sink writes them).
func trickyEvents(db string) []string {
	var out []string
	ev := func(p, off int, id, meter string, q int64, at, source string) {
		ms := trickyMs(at)
		out = append(out, fmt.Sprintf("INSERT INTO %s.usage_events (kafka_topic, kafka_partition, kafka_offset, kafka_timestamp, kafka_timestamp_ms, "+
			"event_id, customer_id, meter, quantity, event_time, event_time_ms, source, ingest_time, ingest_time_ms, record_offset) "+
			"SELECT 'usage.deduped.v2', toInt32(%d), toInt64(%d), toDateTime(%d), toInt64(%d), '%s', 'acme', '%s', toInt64(%d), "+
			"toDateTime(%d), toInt64(%d), '%s', toDateTime(%d), toInt64(%d), toInt64(%d)",
			db, p, off, (ms+60000)/1000, ms+60000, id, meter, q, ms/1000, ms, source, (ms+60000)/1000, ms+60000, off))
	}
	ev(0, 1, "e-jan31", "api_calls", 10, "2024-01-31 23:59:59.999", "gw") // January's last millisecond; arrives in February
	ev(0, 2, "e-feb1", "api_calls", 20, "2024-02-01 00:00:00.000", "gw")  // February's first
	ev(0, 3, "e-jan1", "api_calls", 5, "2024-01-01 00:00:00.000", "gw")
	ev(0, 4, "e-dec31", "api_calls", 7, "2023-12-31 23:59:59.999", "gw") // December's last; arrives on January 1st
	ev(1, 1, "e-over", "api_calls", 100, "2024-01-15 10:00:00.000", "gw")
	ev(1, 2, "e-nocredit", "api_calls", 200, "2024-01-15 11:00:00.000", "batch")
	ev(1, 3, "e-ok", "api_calls", 1, "2024-01-15 12:00:00.000", "batch")
	ev(0, 5, "e-tok", "tokens", 50, "2024-01-15 12:00:00.000", "gw")
	return out
}

// trickyRejections: one of every reason code (docs/design.md, Bad input),
// at the month's edges, and the no_credit one replayed.
func trickyRejections(db string) []string {
	var out []string
	rej := func(off int, reason, stage, at, srcTopic string, srcPart, srcOff int, meter, id string) {
		ms, cust := trickyMs(at), ""
		if id != "" {
			cust = "acme"
		}
		out = append(out, fmt.Sprintf("INSERT INTO %s.usage_rejected (kafka_topic, kafka_partition, kafka_offset, kafka_timestamp, kafka_timestamp_ms, "+
			"reason, stage, source_topic, source_partition, source_offset, customer_id, meter, event_id, record_offset) "+
			"SELECT 'usage.rejected', toInt32(0), toInt64(%d), toDateTime(%d), toInt64(%d), '%s', '%s', '%s', toInt32(%d), toInt64(%d), "+
			"'%s', '%s', '%s', toInt64(%d)", db, off, ms/1000, ms, reason, stage, srcTopic, srcPart, srcOff, cust, meter, id, off))
	}
	const deduped = "usage.deduped.v2"
	rej(1, "over_limit", "aggregator", "2024-01-15 10:00:01.000", deduped, 1, 1, "api_calls", "e-over")
	rej(2, "no_credit", "aggregator", "2024-01-31 23:59:59.999", deduped, 1, 2, "api_calls", "e-nocredit")
	rej(2, "no_credit", "aggregator", "2024-01-31 23:59:59.999", deduped, 1, 2, "api_calls", "e-nocredit") // replayed
	rej(3, "undecodable", "dedup", "2024-01-01 00:00:00.000", "usage.events", 0, 9, "", "")
	rej(4, "unknown_schema", "sink", "2024-02-01 00:00:00.000", "usage.aggregates", 0, 9, "", "") // February
	rej(5, "invalid", "aggregator", "2024-01-10 00:00:00.000", deduped, 0, 77, "", "")            // no event: not unbilled
	rej(6, "too_old", "dedup", "2024-01-10 00:00:00.000", "usage.events", 0, 10, "api_calls", "x")
	rej(7, "in_future", "dedup", "2024-01-10 00:00:00.000", "usage.events", 0, 11, "api_calls", "y")
	rej(8, "oversized", "aggregator", "2024-01-10 00:00:00.000", deduped, 0, 12, "", "")
	rej(9, "unknown_meter", "aggregator", "2024-01-10 00:00:00.000", deduped, 0, 6, "nometer", "z")
	rej(10, "uninsertable", "sink", "2024-01-10 00:00:00.000", "usage.adjustments", 0, 6, "", "")
	// Names offset 3 of partition 0, e-jan1's, with another identity: it
	// takes no event back.
	rej(11, "invalid", "aggregator", "2024-01-10 00:00:00.000", deduped, 0, 3, "api_calls", "e-other")
	return out
}

// trickyAggregates: acme's revisions, written one per INSERT; January's
// api_calls out of order, its revision 2 replayed after its FINAL.
func trickyAggregates(db string) []string {
	var out []string
	agg := func(p, off int, meter, kind, start, end string, rev int64, status string, v int64) {
		out = append(out, fmt.Sprintf("INSERT INTO %s.usage_aggregates (kafka_topic, kafka_partition, kafka_offset, kafka_timestamp, customer_id, "+
			"meter, group_key, aggregation, period_start, period_end, revision, status, value, event_count) SELECT 'usage.aggregates', toInt32(%d), "+
			"toInt64(%d), toDateTime('%s') + %d, 'acme', '%s', '{}', '%s', toDateTime('%s'), toDateTime('%s'), toInt64(%d), '%s', toInt64(%d), toInt64(%d)",
			db, p, off, start, rev*3600, meter, kind, start, end, rev, status, v, rev))
	}
	const dec, jan, feb, mar = "2023-12-01 00:00:00", "2024-01-01 00:00:00", "2024-02-01 00:00:00", "2024-03-01 00:00:00"
	agg(0, 2, "api_calls", "SUM", jan, feb, 2, "OPEN", 15)
	agg(0, 1, "api_calls", "SUM", jan, feb, 1, "OPEN", 10)
	agg(0, 3, "api_calls", "SUM", jan, feb, 3, "FINAL", 16)
	agg(0, 2, "api_calls", "SUM", jan, feb, 2, "OPEN", 15) // replayed
	agg(0, 4, "api_calls", "SUM", feb, mar, 1, "OPEN", 20)
	agg(0, 5, "api_calls", "SUM", dec, jan, 9, "FINAL", 7)
	agg(1, 1, "tokens", "LATEST", jan, feb, 1, "FINAL", 50)
	agg(1, 2, "tokens", "LATEST", feb, mar, 1, "FINAL", 0) // a line of adjustments only
	return out
}

// trickyAdjustments: late events booked into January (from December),
// into February (from January), and into December after it was
// invoiced; late-a replayed, late-d's two copies two rows.
func trickyAdjustments(db string) []string {
	var out []string
	adj := func(p, off int, id, meter, kind, orig, origEnd, booked, bookedEnd string, delta int64) {
		out = append(out, fmt.Sprintf("INSERT INTO %s.usage_adjustments (kafka_topic, kafka_partition, kafka_offset, kafka_timestamp, event_id, "+
			"customer_id, meter, group_key, aggregation, original_period_start, original_period_end, booked_period_start, booked_period_end, "+
			"delta, quantity, record_offset) SELECT 'usage.adjustments', toInt32(%d), toInt64(%d), toDateTime('%s') + 3600, '%s', 'acme', '%s', "+
			"'{}', '%s', toDateTime('%s'), toDateTime('%s'), toDateTime('%s'), toDateTime('%s'), toInt64(%d), toInt64(%d), toInt64(%d)",
			db, p, off, booked, id, meter, kind, orig, origEnd, booked, bookedEnd, delta, max(delta, -delta), off))
	}
	const dec, jan, feb, mar = "2023-12-01 00:00:00", "2024-01-01 00:00:00", "2024-02-01 00:00:00", "2024-03-01 00:00:00"
	adj(0, 0, "late-a", "api_calls", "SUM", dec, jan, jan, feb, 3)
	adj(0, 0, "late-a", "api_calls", "SUM", dec, jan, jan, feb, 3) // replayed
	adj(0, 1, "late-d", "api_calls", "SUM", dec, jan, jan, feb, 2)
	adj(0, 2, "late-d", "api_calls", "SUM", dec, jan, jan, feb, 2) // its second late copy
	adj(1, 0, "late-b", "tokens", "LATEST", dec, jan, jan, feb, -8)
	adj(1, 1, "late-c", "tokens", "LATEST", dec, jan, jan, feb, 5)
	adj(1, 2, "late-e", "tokens", "LATEST", jan, feb, feb, mar, -30)
	adj(0, 3, "late-f", "api_calls", "SUM", jan, feb, feb, mar, 4)
	adj(0, 4, "late-g", "api_calls", "SUM", dec, jan, dec, jan, 6) // into December, final and invoiced
	return out
}

// trickyInserts is the whole data set, with two duplicates (a copy and a
// conflict) at the month's end and one in mid-month.
func trickyInserts(db string) []string {
	out := append(trickyEvents(db), trickyRejections(db)...)
	out = append(out, trickyAggregates(db)...)
	out = append(out, trickyAdjustments(db)...)
	dup := func(off int, id, source string, conflict int, at string) {
		ms := trickyMs(at)
		out = append(out, fmt.Sprintf("INSERT INTO %s.usage_duplicates (kafka_topic, kafka_partition, kafka_offset, kafka_timestamp, event_id, "+
			"customer_id, meter, source, conflict, duplicate_partition, duplicate_offset, duplicate_arrival, duplicate_arrival_ms) SELECT 'usage.duplicates', "+
			"toInt32(0), toInt64(%d), toDateTime(%d), '%s', 'acme', 'api_calls', '%s', toUInt8(%d), toInt32(2), toInt64(%d), toDateTime(%d), toInt64(%d)",
			db, off, ms/1000, id, source, conflict, 100+off, ms/1000, ms))
	}
	dup(1, "e-jan31", "gw", 0, "2024-01-31 23:59:59.999")
	dup(2, "e-jan31", "gw", 1, "2024-02-01 00:00:00.000")
	dup(3, "e-ok", "batch", 1, "2024-01-15 13:00:00.000")
	return append(out, fmt.Sprintf("INSERT INTO %s.sink_progress (consumer_group, kafka_topic, kafka_partition, next_offset, written_at) "+
		"SELECT 'meterline-sink', 'usage.adjustments', toInt32(p), toUInt64(n), now() FROM (SELECT 0 AS p, 3 AS n UNION ALL SELECT 1 AS p, 5 AS n)", db))
}

// trickyWant: each query of AnalystQueries on trickyInserts, worked out by
// hand, TabSeparated.
var trickyWant = map[string]string{
	// January 15th: e-over and e-nocredit are taken back, e-ok is billed.
	// e-dec31 and e-feb1 are of other months; e-jan1's offset names
	// another identity's rejection.
	"usage_by_day": "2024-01-01\tapi_calls\t1\t5\n2024-01-15\tapi_calls\t1\t1\n2024-01-15\ttokens\t1\t50\n2024-01-31\tapi_calls\t1\t10\n",
	// The highest revision of each, the replayed revision 2 below January's FINAL.
	"current_values": "api_calls\t{}\t2023-12-01 00:00:00\t2024-01-01 00:00:00\tFINAL\t9\t7\n" +
		"api_calls\t{}\t2024-01-01 00:00:00\t2024-02-01 00:00:00\tFINAL\t3\t16\n" +
		"api_calls\t{}\t2024-02-01 00:00:00\t2024-03-01 00:00:00\tOPEN\t1\t20\n" +
		"tokens\t{}\t2024-01-01 00:00:00\t2024-02-01 00:00:00\tFINAL\t1\t50\n" +
		"tokens\t{}\t2024-02-01 00:00:00\t2024-03-01 00:00:00\tFINAL\t1\t0\n",
	// api_calls: 16 + late-a 3 (once) + late-d 2 + 2; tokens: 50 - 8 + 5.
	"invoice_lines": "acme\tapi_calls\t{}\t16\t7\t23\tfinal\nacme\ttokens\t{}\t50\t-3\t47\tfinal\n",
	"top_customers": "acme\t16\n",
	"late_usage":    "2024-01-01 00:00:00\tacme\tapi_calls\t1\t4\n2024-01-01 00:00:00\tacme\ttokens\t1\t-30\n",
	// By day of arrival: e-jan1 and e-dec31 arrive on January 1st,
	// e-jan31 on February 1st; its copy on January 31st, its conflict on
	// February 1st.
	"duplicate_rate": "2024-01-01\tgw\t2\t0\t0\t0\n2024-01-15\tbatch\t2\t1\t1\t0.3333\n2024-01-15\tgw\t2\t0\t0\t0\n2024-01-31\tgw\t0\t1\t0\t1\n",
	"rejections": "2024-01-01\tdedup\tundecodable\t1\n2024-01-10\taggregator\tinvalid\t2\n2024-01-10\taggregator\toversized\t1\n" +
		"2024-01-10\taggregator\tunknown_meter\t1\n2024-01-10\tdedup\tin_future\t1\n2024-01-10\tdedup\ttoo_old\t1\n" +
		"2024-01-10\tsink\tuninsertable\t1\n2024-01-15\taggregator\tover_limit\t1\n2024-01-31\taggregator\tno_credit\t1\n",
	"unbilled":             "api_calls\tinvalid\t1\napi_calls\tno_credit\t1\napi_calls\tover_limit\t1\nnometer\tunknown_meter\t1\n",
	"adjustments_progress": "0\t3\n1\t5\n",
	// Bounds [5, 3], previous [2, 1]: January's lines with late-a, late-d
	// (twice), late-b and late-c; late-g (offset 4 ≥ 2) into invoiced
	// December; late-e and late-f wait for February's run.
	"invoice_run": "2023-12-01 00:00:00\tacme\tapi_calls\t{}\t0\t6\t6\tinvoiced\n" +
		"2024-01-01 00:00:00\tacme\tapi_calls\t{}\t16\t7\t23\tfinal\n" +
		"2024-01-01 00:00:00\tacme\ttokens\t{}\t50\t-3\t47\tfinal\n",
}

func trickyQueries(t *testing.T) []AnalystQuery {
	t.Helper()
	if len(trickyWant) != len(AnalystQueries) {
		t.Fatalf("%d expectations for %d queries", len(trickyWant), len(AnalystQueries))
	}
	return AnalystQueries
}

// TestAnalystQueriesHardCases runs every query of docs/analysts.md on the
// hard cases above, unmerged, on ClickHouse 18.16 (then verify finds every
// month equal) and on current ClickHouse (chdb, 26.x), and requires the
// numbers worked out by hand on both.
func TestAnalystQueriesHardCases(t *testing.T) {
	t.Run("18.16", func(t *testing.T) { checkAnswers1816(t, trickyInserts, trickyQueries(t), trickyWant, 202312) })
	t.Run("chdb", func(t *testing.T) { checkAnswersChdb(t, "hardcases", trickyInserts, trickyQueries(t), trickyWant) })
}

// trickyBalance is one balance: its customer, revision, period, caps
// (meters, usage, limits), grants, overdrawn credits and caps_until.
type trickyBalance struct {
	off           int
	cust          string
	rev           int64
	unmetered     int
	start, end    time.Time
	meters        string // a ClickHouse array literal of names: "['api_calls']"
	usage, limits string // of Int64
	grants        []trickyGrant
	overdrawn     int64
	capsUntilMs   int64
}

type trickyGrant struct {
	id        string
	remaining int64
	expiresMs int64 // 0: never
}

func (b trickyBalance) insert(db string) string {
	ids, prios, from, exp, expMs, amounts, consumed, remaining := "[", "[", "[", "[", "[", "[", "[", "["
	for i, g := range b.grants {
		sep := ", "
		if i == len(b.grants)-1 {
			sep = ""
		}
		ids += "'" + g.id + "'" + sep
		prios += "toInt32(1)" + sep
		from += "toInt64(0)" + sep
		exp += fmt.Sprintf("toDateTime(%d)", g.expiresMs/1000) + sep
		expMs += fmt.Sprintf("toInt64(%d)", g.expiresMs) + sep
		amounts += fmt.Sprintf("toInt64(%d)", g.remaining+100) + sep
		consumed += "toInt64(100)" + sep
		remaining += fmt.Sprintf("toInt64(%d)", g.remaining) + sep
	}
	typed := func(a, typ string) string {
		if a == "[" {
			return "CAST([] AS Array(" + typ + "))"
		}
		return a + "]"
	}
	updated := b.start.Unix() + b.rev
	return fmt.Sprintf("INSERT INTO %s.usage_balances (kafka_topic, kafka_partition, kafka_offset, kafka_timestamp, kafka_timestamp_ms, customer_id, plan, "+
		"unmetered, revision, updated_at, updated_at_ms, period_start, period_end, meter_names, meter_usage, meter_limits, meter_on_limit, grant_ids, "+
		"grant_priorities, grant_effective_from_ms, grant_expires_at, grant_expires_at_ms, grant_amounts, grant_consumed, grant_remaining, "+
		"overdraft_policy, overdraft_limit, overdrawn, caps_until, caps_until_ms) SELECT 'usage.balances', toInt32(0), toInt64(%d), toDateTime(%d), "+
		"toInt64(%d), '%s', 'free', toUInt8(%d), toInt64(%d), toDateTime(%d), toInt64(%d), toDateTime(%d), toDateTime(%d), CAST(%s AS Array(String)), "+
		"CAST(%s AS Array(Int64)), CAST(%s AS Array(Int64)), arrayMap(m -> 'reject', CAST(%s AS Array(String))), %s, %s, %s, %s, %s, %s, %s, %s, "+
		"'deny', toInt64(0), toInt64(%d), toDateTime(%d), toInt64(%d)",
		db, b.off, updated, updated*1000, b.cust, b.unmetered, b.rev, updated, updated*1000, b.start.Unix(), b.end.Unix(), b.meters,
		b.usage, b.limits, b.meters, typed(ids, "String"), typed(prios, "Int32"), typed(from, "Int64"), typed(exp, "DateTime"),
		typed(expMs, "Int64"), typed(amounts, "Int64"), typed(consumed, "Int64"), typed(remaining, "Int64"), b.overdrawn,
		b.capsUntilMs/1000, b.capsUntilMs)
}

// trickyBalances: balances of the month of now and the one before it,
// one per INSERT. flip's revisions are written out of order, its latest
// replayed, and its latest makes it unmetered; closed's latest balance is
// of last month, with a grant that expires this month; twoperiods spent
// last month's grant this month; edge's grants expire at the month's
// end, a second ago, and a millisecond into next month; capsgone's caps
// are no longer in effect, capslater's are.
func trickyBalances(now time.Time) func(db string) []string {
	cur := time.Date(now.Year(), now.Month(), 1, 0, 0, 0, 0, time.UTC)
	next, prev := cur.AddDate(0, 1, 0), cur.AddDate(0, -1, 0)
	soon := now.Add(next.Sub(now) / 2).Truncate(time.Second).UnixMilli()
	const api = "['api_calls']"
	bs := []trickyBalance{
		{off: 3, cust: "flip", rev: 3, unmetered: 1, start: cur, end: next, meters: api, usage: "[950]", limits: "[1000]",
			grants: []trickyGrant{{"g1", 50, soon}}},
		{off: 1, cust: "flip", rev: 1, start: cur, end: next, meters: api, usage: "[900]", limits: "[1000]", grants: []trickyGrant{{"g1", 100, soon}}},
		{off: 3, cust: "flip", rev: 3, unmetered: 1, start: cur, end: next, meters: api, usage: "[950]", limits: "[1000]",
			grants: []trickyGrant{{"g1", 50, soon}}},
		{off: 4, cust: "closed", rev: 4, start: prev, end: cur, meters: api, usage: "[990]", limits: "[1000]", grants: []trickyGrant{{"carry", 300, soon}}},
		{off: 7, cust: "twoperiods", rev: 7, start: prev, end: cur, meters: "[]", usage: "[]", limits: "[]", grants: []trickyGrant{{"old", 500, soon}}},
		{off: 8, cust: "twoperiods", rev: 8, start: cur, end: next, meters: "[]", usage: "[]", limits: "[]", grants: []trickyGrant{{"old", 0, soon}},
			overdrawn: 70},
		{off: 7, cust: "twoperiods", rev: 7, start: prev, end: cur, meters: "[]", usage: "[]", limits: "[]", grants: []trickyGrant{{"old", 500, soon}}},
		{off: 9, cust: "edge", rev: 9, start: cur, end: next, meters: "[]", usage: "[]", limits: "[]",
			grants: []trickyGrant{{"eom", 10, next.UnixMilli()}, {"gone", 20, now.Add(-time.Second).UnixMilli()}, {"nm", 30, next.UnixMilli() + 1}}},
		{off: 10, cust: "capsgone", rev: 10, start: cur, end: next, meters: api, usage: "[900]", limits: "[1000]",
			capsUntilMs: now.Add(-time.Minute).UnixMilli()},
		{off: 11, cust: "capslater", rev: 11, start: cur, end: next, meters: api, usage: "[800]", limits: "[1000]",
			capsUntilMs: now.Add(24 * time.Hour).UnixMilli()},
	}
	return func(db string) []string {
		out := make([]string, len(bs))
		for i, b := range bs {
			out[i] = b.insert(db)
		}
		return out
	}
}

// trickyBalancesWant: BalanceQueries on trickyBalances, worked out by hand.
func trickyBalancesWant(now time.Time) map[string]string {
	cur := time.Date(now.Year(), now.Month(), 1, 0, 0, 0, 0, time.UTC)
	next := cur.AddDate(0, 1, 0)
	soon := now.Add(next.Sub(now) / 2).Truncate(time.Second).Format(time.DateTime)
	at := func(rev int64) string { return cur.Add(time.Duration(rev) * time.Second).Format(time.DateTime) }
	return map[string]string{
		"customers_near_cap": "capslater\tfree\tapi_calls\t800\t1000\t80\n",
		"credits_expiring_this_month": "closed\tcarry\t300\t" + soon + "\nflip\tg1\t50\t" + soon + "\n" +
			"edge\teom\t10\t" + next.Format(time.DateTime) + "\n",
		"credits_left": "capsgone\tfree\t0\t0\tdeny\t" + at(10) + "\ncapslater\tfree\t0\t0\tdeny\t" + at(11) + "\n" +
			"twoperiods\tfree\t0\t70\tdeny\t" + at(8) + "\nedge\tfree\t40\t0\tdeny\t" + at(9) + "\n" +
			"flip\tfree\t50\t0\tdeny\t" + at(3) + "\nclosed\tfree\t300\t0\tdeny\t" + cur.AddDate(0, -1, 0).Add(4*time.Second).Format(time.DateTime) + "\n",
	}
}

// TestBalanceQueriesHardCases runs the queries of docs/entitlements.md
// (Balances in ClickHouse) on the hard cases of trickyBalances, unmerged,
// on ClickHouse 18.16 (then verify finds both months equal) and on chdb,
// and requires the numbers worked out by hand on both.
func TestBalanceQueriesHardCases(t *testing.T) {
	// The queries compare with now(): the data, of the month of now, and
	// the queries run in one month.
	now := testenv.InOneMonth(t, 10*time.Minute, 2*time.Minute)
	since := uint32(now.AddDate(0, -1, 0).Year()*100 + int(now.AddDate(0, -1, 0).Month()))
	want := trickyBalancesWant(now)
	t.Run("18.16", func(t *testing.T) { checkAnswers1816(t, trickyBalances(now), BalanceQueries, want, since) })
	t.Run("chdb", func(t *testing.T) { checkAnswersChdb(t, "balancehardcases", trickyBalances(now), BalanceQueries, want) })
}
