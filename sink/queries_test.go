package sink

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/schemas"
)

// queryStrings runs q and renders each row as strings (queryText).
func queryStrings(t *testing.T, conn driver.Conn, q string) [][]string {
	t.Helper()
	out, err := queryText(ctxT(t, time.Minute), conn, time.Minute, q)
	if err != nil {
		t.Fatalf("%v\n%s", err, q)
	}
	return out
}

func render(rows [][]string) string {
	var b strings.Builder
	for _, r := range rows {
		b.WriteString(strings.Join(r, " | "))
		b.WriteByte('\n')
	}
	return b.String()
}

// checkQueries runs each of qs and compares its rows with want's of its
// name; want has an expectation for each query and no other.
func checkQueries(t *testing.T, conn driver.Conn, qs []AnalystQuery, want map[string][][]string) {
	t.Helper()
	if len(want) != len(qs) {
		t.Fatalf("%d queries, %d expectations", len(qs), len(want))
	}
	for _, q := range qs {
		got := queryStrings(t, conn, q.SQL)
		if render(got) != render(want[q.Name]) {
			t.Errorf("%s:\ngot:\n%swant:\n%s", q.Name, render(got), render(want[q.Name]))
		}
	}
}

// TestAnalystQueries writes a small, fully known data set through Kafka and
// the sink (so through the ledger tables and their views), runs every query
// of docs/analysts.md on the real server with its example values (customer
// acme, meter api_calls, January 2024), and compares each result with
// numbers worked out by hand.
func TestAnalystQueries(t *testing.T) {
	e := newEnv(t, 2)
	day := func(d int, h int) time.Time { return time.Date(2024, 1, d, h, 0, 0, 0, time.UTC) }
	month := func(y int, m time.Month) time.Time { return time.Date(y, m, 1, 0, 0, 0, 0, time.UTC) }
	dec, jan, feb, mar := month(2023, 12), month(2024, 1), month(2024, 2), month(2024, 3)
	ms := func(t time.Time) int64 { return t.UnixMilli() }
	eu := []schemas.Property{{Name: "region", Value: "eu"}}

	var recs []*kgo.Record
	offsets := map[string]map[int32]int64{}
	// add appends a record for partition p of topic at Kafka timestamp ts
	// and returns its offset (the topics are new, so offsets count from 0).
	add := func(topic string, p int32, key string, m schemas.Message, ts time.Time) int64 {
		if offsets[topic] == nil {
			offsets[topic] = map[int32]int64{}
		}
		off := offsets[topic][p]
		offsets[topic][p]++
		recs = append(recs, &kgo.Record{Topic: topic, Partition: p, Key: []byte(key), Value: schemas.MustEncode(m), Timestamp: ts})
		return off
	}
	type ev struct {
		id, cust, meter, source string
		at                      time.Time
		q                       int64
	}
	events := map[string]int64{} // event id -> offset in partition 0
	for _, x := range []ev{
		{"e1", "acme", "api_calls", "gw", day(3, 10), 1},
		{"e2", "acme", "api_calls", "gw", day(3, 11), 2},
		{"e3", "acme", "api_calls", "batch", day(5, 9), 3},
		{"e4", "acme", "api_calls", "batch", day(5, 10), 4}, // unbilled: invalid
		{"e5", "acme", "api_calls", "gw", feb.Add(time.Hour), 5},
		{"e6", "acme", "tokens", "gw", day(3, 12), 100},
		{"e7", "globex", "api_calls", "mobile", day(3, 10), 7},
		{"e8", "acme", "api_calls", "batch", day(7, 10), 8}, // unbilled: over_limit
	} {
		in := x.at.Add(time.Minute)
		events[x.id] = add(e.names.DedupedTopic(), 0, x.cust, &schemas.DedupedEvent{EventID: x.id, CustomerID: x.cust, Meter: x.meter,
			Quantity: x.q, EventTime: ms(x.at), Source: x.source, IngestTime: ms(in)}, in)
	}
	recs = append(recs, watermark(e.names.DedupedTopic(), 1, jan)) // not a row

	aggr := func(cust, meter, kind string, group []schemas.Property, start, end time.Time, rev int64, status schemas.AggregateStatus, v int64) {
		add(e.names.AggregatesTopic(), int32(rev%2), cust+"/"+meter, &schemas.Aggregate{CustomerID: cust, Meter: meter, Group: group, Aggregation: kind,
			PeriodStart: ms(start), PeriodEnd: ms(end), Revision: rev, Status: status, Value: v, EventCount: rev}, start.Add(time.Duration(rev)*time.Hour))
	}
	aggr("acme", "api_calls", "SUM", nil, jan, feb, 1, schemas.StatusOpen, 3)
	aggr("acme", "api_calls", "SUM", nil, jan, feb, 2, schemas.StatusOpen, 6)
	aggr("acme", "api_calls", "SUM", nil, jan, feb, 3, schemas.StatusFinal, 6)
	aggr("acme", "tokens", "SUM", eu, jan, feb, 1, schemas.StatusFinal, 100)
	aggr("acme", "api_calls", "SUM", nil, feb, mar, 1, schemas.StatusOpen, 5)
	aggr("globex", "api_calls", "SUM", nil, jan, feb, 1, schemas.StatusOpen, 7)
	aggr("globex", "api_calls", "SUM", nil, jan, feb, 2, schemas.StatusFinal, 7)
	aggr("initech", "api_calls", "SUM", nil, jan, feb, 1, schemas.StatusOpen, 20) // its FINAL is not out yet
	aggr("initech", "peak_conn", "MAX", nil, jan, feb, 1, schemas.StatusFinal, 9) // MAX: not ranked
	// The FINAL of a line of adjustments only (docs/design.md, Time).
	aggr("hooli", "api_calls", "SUM", nil, jan, feb, 1, schemas.StatusFinal, 0)
	// A replayed revision (a zombie sink's duplicate row): collapses.
	aggr("acme", "api_calls", "SUM", nil, jan, feb, 2, schemas.StatusOpen, 6)

	adjust := func(id, cust string, orig, booked time.Time, delta int64) {
		add(e.names.AdjustmentsTopic(), 0, id, &schemas.Adjustment{EventID: id, CustomerID: cust, Meter: "api_calls", Aggregation: "SUM",
			OriginalPeriodStart: ms(orig), OriginalPeriodEnd: ms(orig.AddDate(0, 1, 0)),
			BookedPeriodStart: ms(booked), BookedPeriodEnd: ms(booked.AddDate(0, 1, 0)), Delta: delta, Quantity: delta}, booked)
	}
	adjust("late-1", "acme", dec, jan, 4)
	adjust("late-2", "initech", dec, jan, 2)
	adjust("late-3", "hooli", dec, jan, 6) // a line of adjustments only
	// A line of adjustments only whose partition has not decided January
	// final, while others have: open.
	adjust("late-7", "umbrella", dec, jan, 5)
	adjust("late-4", "acme", jan, feb, 1)
	adjust("late-5", "globex", jan, feb, 2)
	adjust("late-6", "acme", jan, feb, 3)

	dup := func(id, source string, conflict bool, at time.Time) {
		add(e.names.DuplicatesTopic(), 0, id, &schemas.Duplicate{EventID: id, CustomerID: "acme", Meter: "api_calls", Source: source,
			Conflict: conflict, DuplicateArrival: ms(at)}, at)
	}
	dup("e1", "gw", false, day(3, 13))
	dup("e1", "gw", true, day(3, 14))
	dup("e3", "batch", false, day(5, 12))

	rejected := func(reason, stage string, at time.Time, eventID string) {
		r := &schemas.Rejected{Reason: reason, Stage: stage, SourceTopic: "usage.events"}
		if stage == "aggregator" {
			r.SourceTopic, r.SourceOffset = e.names.DedupedTopic(), events[eventID]
			r.CustomerID, r.Meter, r.EventID = "acme", "api_calls", eventID
		}
		add(e.names.RejectedTopic(), 0, "", r, at)
	}
	rejected(schemas.ReasonTooOld, "dedup", day(4, 1), "")
	rejected(schemas.ReasonTooOld, "dedup", day(4, 2), "")
	rejected(schemas.ReasonInvalid, "dedup", day(4, 3), "")
	rejected(schemas.ReasonInvalid, "aggregator", day(5, 11), "e4")
	rejected("over_limit", "aggregator", day(7, 11), "e8") // docs/design.md, Bad input; raised by caps (docs/entitlements.md, Rejections)
	rejected(schemas.ReasonUninsertable, "sink", feb.Add(24*time.Hour), "")

	e.produce(recs...)
	r := e.start(nil)
	e.waitCaughtUp(time.Minute)
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}

	d := func(t time.Time) string { return t.Format("2006-01-02 15:04:05") }
	date := func(dd int) string { return day(dd, 0).Format("2006-01-02 15:04:05") }
	want := map[string][][]string{
		"usage_by_day": {
			// e4 (Jan 5) and e8 (Jan 7, the day's only event) are unbilled.
			{date(3), "api_calls", "2", "3"},
			{date(3), "tokens", "1", "100"},
			{date(5), "api_calls", "1", "3"},
		},
		"current_values": {
			{"api_calls", "{}", d(jan), d(feb), "FINAL", "3", "6"},
			{"api_calls", "{}", d(feb), d(mar), "OPEN", "1", "5"},
			{"tokens", `{"region":"eu"}`, d(jan), d(feb), "FINAL", "1", "100"},
		},
		"invoice_lines": {
			// customer, meter, group, value, adjustments, invoice quantity, status
			{"acme", "api_calls", "{}", "6", "4", "10", "final"},
			{"acme", "tokens", `{"region":"eu"}`, "100", "0", "100", "final"},
			{"globex", "api_calls", "{}", "7", "0", "7", "final"},
			{"hooli", "api_calls", "{}", "0", "6", "6", "final"}, // adjustments only, its FINAL of value 0 out
			{"initech", "api_calls", "{}", "20", "2", "22", "open"},
			{"initech", "peak_conn", "{}", "9", "0", "9", "final"},
			{"umbrella", "api_calls", "{}", "0", "5", "5", "open"}, // adjustments only, its partition not final yet
		},
		// The sink's progress is recorded under the test's topic names.
		"adjustments_progress": nil,
		"invoice_run": {
			// January's lines with the adjustments booked into them below
			// offset 5 of partition 0 (late-1, -2, -3, -7); February's
			// (late-4, -5, -6) are not this run's.
			{d(jan), "acme", "api_calls", "{}", "6", "4", "10", "final"},
			{d(jan), "acme", "tokens", `{"region":"eu"}`, "100", "0", "100", "final"},
			{d(jan), "globex", "api_calls", "{}", "7", "0", "7", "final"},
			{d(jan), "hooli", "api_calls", "{}", "0", "6", "6", "final"},
			{d(jan), "initech", "api_calls", "{}", "20", "2", "22", "open"},
			{d(jan), "initech", "peak_conn", "{}", "9", "0", "9", "final"},
			{d(jan), "umbrella", "api_calls", "{}", "0", "5", "5", "open"},
		},
		"top_customers": {
			{"initech", "20"},
			{"globex", "7"},
			{"acme", "6"},
			// hooli's only line is of adjustments: usage 0, not listed.
		},
		"late_usage": {
			{d(jan), "acme", "api_calls", "2", "4"},
			{d(jan), "globex", "api_calls", "1", "2"},
		},
		"duplicate_rate": {
			// day, source, accepted, dropped copies, conflicts, rate
			{date(3), "gw", "3", "2", "1", "0.4000"},
			{date(3), "mobile", "1", "0", "0", "0.0000"},
			{date(5), "batch", "2", "1", "0", "0.3333"},
			{date(7), "batch", "1", "0", "0", "0.0000"},
		},
		"rejections": {
			{date(4), "dedup", "invalid", "1"},
			{date(4), "dedup", "too_old", "2"},
			{date(5), "aggregator", "invalid", "1"},
			{date(7), "aggregator", "over_limit", "1"},
		},
		"unbilled": {
			{"api_calls", "invalid", "1"},
			{"api_calls", "over_limit", "1"},
		},
	}
	// The invoice run reads the adjustments of the topic its bounds are
	// of, here the test's.
	qs := append([]AnalystQuery(nil), AnalystQueries...)
	for i := range qs {
		if qs[i].Name == "invoice_run" {
			qs[i].SQL = strings.Replace(qs[i].SQL, "'usage.adjustments'", quote(e.names.AdjustmentsTopic()), 1)
		}
	}
	checkQueries(t, e.conn, qs, want)
}

// twoCopiesInserts: acme's events of January 2024 in usage.deduped's
// partition 0, each INSERT one row (as the sink writes them, in blocks):
// "twice" accepted twice (its key expired: the second copy, at offset 20,
// is counted as a new event), and its first copy (offset 10) rejected by
// the aggregator; "both" accepted twice (offsets 12 and 22) and both
// copies rejected; "once" and "keep" accepted and billed. A copy's row of
// events_by_customer carries its offset in kafka_offset, its rejection in
// source_offset. The copies have different event times, so no merge
// collapses them in events_by_customer.
func twoCopiesInserts(db string) []string {
	var out []string
	ev := func(off int, id, at string, q int) {
		out = append(out, fmt.Sprintf("INSERT INTO %s.usage_events (kafka_topic, kafka_partition, kafka_offset, kafka_timestamp, event_id, "+
			"customer_id, meter, quantity, event_time, ingest_time) SELECT 'usage.deduped', toInt32(0), toInt64(%d), toDateTime('%s') + 60, "+
			"'%s', 'acme', 'api_calls', toInt64(%d), toDateTime('%s'), toDateTime('%s') + 60", db, off, at, id, q, at, at))
	}
	rej := func(rec, off int, id, at string) {
		out = append(out, fmt.Sprintf("INSERT INTO %s.usage_rejected (kafka_topic, kafka_partition, kafka_offset, kafka_timestamp, reason, stage, "+
			"source_topic, source_partition, source_offset, customer_id, meter, event_id, record_offset) SELECT 'usage.rejected', toInt32(0), "+
			"toInt64(%d), toDateTime('%s') + 120, 'over_limit', 'aggregator', 'usage.deduped', toInt32(0), toInt64(%d), 'acme', 'api_calls', '%s', toInt64(%d)",
			db, rec, at, off, id, rec))
	}
	ev(10, "twice", "2024-01-10 09:00:00", 5)
	ev(11, "once", "2024-01-10 12:00:00", 3)
	ev(12, "both", "2024-01-11 08:00:00", 2)
	ev(13, "keep", "2024-01-11 09:00:00", 1)
	ev(20, "twice", "2024-01-10 09:30:00", 7)
	ev(22, "both", "2024-01-11 08:30:00", 4)
	rej(1, 10, "twice", "2024-01-10 09:00:00")
	rej(2, 12, "both", "2024-01-11 08:00:00")
	rej(3, 22, "both", "2024-01-11 08:30:00")
	return out
}

// twoCopiesWant: Jan 10 bills "once" (3) and the second copy of "twice"
// (7); Jan 11 bills "keep" (1) alone.
const twoCopiesWant = "2024-01-10\tapi_calls\t2\t10\n2024-01-11\tapi_calls\t1\t1\n"

func usageByDay(t *testing.T) string { return namedQuery(t, AnalystQueries, "usage_by_day") }

// TestUsageByDayTwoCopies: usage_by_day takes back exactly the copy of an
// event that the aggregator rejected, not every accepted copy of its
// identity, on ClickHouse 18.16.
func TestUsageByDayTwoCopies(t *testing.T) {
	checkQuery1816(t, twoCopiesInserts, usageByDay(t), twoCopiesWant)
}

// TestUsageByDayTwoCopiesOnChdb is TestUsageByDayTwoCopies on current
// ClickHouse (chdb, 26.x).
func TestUsageByDayTwoCopiesOnChdb(t *testing.T) {
	checkQueryChdb(t, "twocopies", twoCopiesInserts, usageByDay(t), twoCopiesWant)
}
