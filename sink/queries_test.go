package sink

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/schemas"
)

// queryStrings runs q and renders each row as strings: times as
// "2006-01-02 15:04:05" (UTC), floats with 4 decimals.
func queryStrings(t *testing.T, conn driver.Conn, q string) [][]string {
	t.Helper()
	rows, err := conn.Query(ctxT(t, time.Minute), q)
	if err != nil {
		t.Fatalf("%v\n%s", err, q)
	}
	defer rows.Close()
	cts := rows.ColumnTypes()
	var out [][]string
	for rows.Next() {
		dst := make([]any, len(cts))
		for i, ct := range cts {
			dst[i] = reflect.New(ct.ScanType()).Interface()
		}
		if err := rows.Scan(dst...); err != nil {
			t.Fatal(err)
		}
		row := make([]string, len(dst))
		for i, d := range dst {
			switch v := reflect.ValueOf(d).Elem().Interface().(type) {
			case time.Time:
				row[i] = v.UTC().Format("2006-01-02 15:04:05")
			case float64:
				row[i] = fmt.Sprintf("%.4f", v)
			default:
				row[i] = fmt.Sprint(v)
			}
		}
		out = append(out, row)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
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

// TestAnalystQueries writes a small, fully known data set through Kafka and
// the sink, runs every query of docs/analysts.md on the real server, and compares each
// result with numbers worked out by hand.
func TestAnalystQueries(t *testing.T) {
	e := newEnv(t, 2)
	month := func(y int, m time.Month) time.Time { return time.Date(y, m, 1, 0, 0, 0, 0, time.UTC) }
	jan, feb, mar, dec := month(2024, 1), month(2024, 2), month(2024, 3), month(2023, 12)
	now := time.Now().UTC()
	cur := month(now.Year(), now.Month())
	next := cur.AddDate(0, 1, 0)
	ms := func(t time.Time) int64 { return t.UnixMilli() }
	eu := []schemas.Property{{Name: "region", Value: "eu"}}
	us := []schemas.Property{{Name: "region", Value: "us"}}

	var recs []*kgo.Record
	kts := base // Kafka timestamps: irrelevant to the queries except rejected's first/last seen
	add := func(topic string, key string, m schemas.Message) {
		recs = append(recs, &kgo.Record{Topic: topic, Partition: int32(len(recs) % 2), Key: []byte(key), Value: schemas.MustEncode(m), Timestamp: kts})
		kts = kts.Add(time.Second)
	}
	aggr := func(cust, meter, kind string, group []schemas.Property, start, end time.Time, rev int64, status schemas.AggregateStatus, v int64) {
		add(e.names.AggregatesTopic(), cust+"/"+meter, &schemas.Aggregate{CustomerID: cust, Meter: meter, Group: group, Aggregation: kind,
			PeriodStart: ms(start), PeriodEnd: ms(end), Revision: rev, Status: status, Value: v, EventCount: rev})
	}
	// January 2024: revisions up to FINAL; February open; the current month open.
	aggr("acme", "api_calls", "SUM", nil, jan, feb, 1, schemas.StatusOpen, 10)
	aggr("acme", "api_calls", "SUM", nil, jan, feb, 2, schemas.StatusOpen, 25)
	aggr("acme", "api_calls", "SUM", nil, jan, feb, 3, schemas.StatusFinal, 30)
	aggr("globex", "api_calls", "SUM", nil, jan, feb, 1, schemas.StatusOpen, 5)
	aggr("globex", "api_calls", "SUM", nil, jan, feb, 2, schemas.StatusFinal, 7)
	aggr("acme", "tokens", "SUM", eu, jan, feb, 1, schemas.StatusOpen, 100)
	aggr("acme", "tokens", "SUM", eu, jan, feb, 2, schemas.StatusFinal, 150)
	aggr("acme", "tokens", "SUM", us, jan, feb, 1, schemas.StatusFinal, 40)
	aggr("acme", "api_calls", "SUM", nil, feb, mar, 1, schemas.StatusOpen, 3)
	aggr("acme", "api_calls", "SUM", nil, cur, next, 1, schemas.StatusOpen, 50)
	aggr("acme", "api_calls", "SUM", nil, cur, next, 2, schemas.StatusOpen, 70)
	aggr("globex", "api_calls", "SUM", nil, cur, next, 1, schemas.StatusOpen, 90)
	aggr("initech", "api_calls", "SUM", nil, cur, next, 1, schemas.StatusOpen, 20)
	aggr("acme", "tokens", "SUM", eu, cur, next, 1, schemas.StatusOpen, 500)
	aggr("acme", "tokens", "SUM", us, cur, next, 1, schemas.StatusOpen, 5)
	aggr("globex", "tokens", "SUM", nil, cur, next, 1, schemas.StatusOpen, 400)
	aggr("initech", "peak_conn", "MAX", nil, cur, next, 1, schemas.StatusOpen, 9) // not SUM/COUNT: not ranked

	adjust := func(id, cust, meter string, orig, booked time.Time, delta int64) {
		add(e.names.AdjustmentsTopic(), id, &schemas.Adjustment{EventID: id, CustomerID: cust, Meter: meter, Aggregation: "SUM",
			OriginalPeriodStart: ms(orig), OriginalPeriodEnd: ms(orig.AddDate(0, 1, 0)),
			BookedPeriodStart: ms(booked), BookedPeriodEnd: ms(booked.AddDate(0, 1, 0)), Delta: delta, Quantity: delta})
	}
	adjust("late-1", "acme", "api_calls", jan, feb, 4)
	adjust("late-2", "acme", "api_calls", jan, feb, 1)
	adjust("late-3", "globex", "api_calls", jan, feb, 2)
	adjust("late-4", "initech", "api_calls", dec, jan, 6)

	event := func(id, cust, meter, source string, at time.Time, q int64) {
		add(e.names.DedupedTopic(), cust+"/"+meter, &schemas.DedupedEvent{EventID: id, CustomerID: cust, Meter: meter, Quantity: q,
			EventTime: ms(at), Source: source, IngestTime: ms(at)})
	}
	event("e1", "acme", "api_calls", "gw", jan.Add(time.Hour), 1)
	event("e2", "acme", "api_calls", "gw", jan.Add(2*time.Hour), 2)
	event("e3", "acme", "api_calls", "batch", jan.Add(3*time.Hour), 3)
	event("e4", "acme", "api_calls", "batch", feb.Add(time.Hour), 4)
	event("e5", "globex", "api_calls", "gw", jan.Add(time.Hour), 7)
	event("e6", "globex", "api_calls", "batch", jan.Add(time.Hour), 5)
	event("e7", "globex", "api_calls", "mobile", jan.Add(time.Hour), 1)
	recs = append(recs, watermark(e.names.DedupedTopic(), 0, base)) // not a row

	dup := func(id, source string, conflict bool) {
		add(e.names.DuplicatesTopic(), id, &schemas.Duplicate{EventID: id, CustomerID: "acme", Meter: "api_calls", Source: source, Conflict: conflict})
	}
	dup("e1", "gw", false)
	dup("e1", "gw", true)
	dup("e3", "batch", false)

	rejected := func(reason, stage string) {
		add(e.names.RejectedTopic(), "", &schemas.Rejected{Reason: reason, Stage: stage, SourceTopic: "usage.events"})
	}
	rejected(schemas.ReasonTooOld, "dedup")
	rejected(schemas.ReasonTooOld, "dedup")
	rejected(schemas.ReasonTooOld, "dedup")
	rejected(schemas.ReasonInvalid, "dedup")
	rejected(schemas.ReasonInvalid, "dedup")
	rejected(schemas.ReasonUninsertable, "sink")

	e.produce(recs...)
	r := e.start(nil)
	e.waitCaughtUp(time.Minute)
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}

	d := func(t time.Time) string { return t.Format("2006-01-02 15:04:05") }
	day := func(t time.Time) string { return t.Format("2006-01-02 00:00:00") }
	firstRej, lastRej := base.Add(time.Duration(len(recs)-7)*time.Second), base.Add(time.Duration(len(recs)-2)*time.Second)
	_ = lastRej
	want := map[string][][]string{
		"usage_per_customer_period": {
			{"acme", "api_calls", "{}", d(jan), d(feb), "30", "FINAL", "3"},
			{"acme", "api_calls", "{}", d(feb), d(mar), "3", "OPEN", "1"},
			{"acme", "api_calls", "{}", d(cur), d(next), "70", "OPEN", "2"},
			{"acme", "tokens", `{"region":"eu"}`, d(jan), d(feb), "150", "FINAL", "2"},
			{"acme", "tokens", `{"region":"us"}`, d(jan), d(feb), "40", "FINAL", "1"},
			{"acme", "tokens", `{"region":"eu"}`, d(cur), d(next), "500", "OPEN", "1"},
			{"acme", "tokens", `{"region":"us"}`, d(cur), d(next), "5", "OPEN", "1"},
			{"globex", "api_calls", "{}", d(jan), d(feb), "7", "FINAL", "2"},
			{"globex", "api_calls", "{}", d(cur), d(next), "90", "OPEN", "1"},
			{"globex", "tokens", "{}", d(cur), d(next), "400", "OPEN", "1"},
			{"initech", "api_calls", "{}", d(cur), d(next), "20", "OPEN", "1"},
			{"initech", "peak_conn", "{}", d(cur), d(next), "9", "OPEN", "1"},
		},
		"raw_usage_per_customer_month": {
			{"acme", "api_calls", day(jan), "3", "6"},
			{"acme", "api_calls", day(feb), "1", "4"},
			{"globex", "api_calls", day(jan), "3", "13"},
		},
		"invoice_quantities": {
			// customer, meter, group, period, FINAL, adjustments, invoice, finalized
			{"acme", "api_calls", "{}", d(jan), "30", "0", "30", "1"},
			{"acme", "api_calls", "{}", d(feb), "0", "5", "5", "0"},
			{"acme", "tokens", `{"region":"eu"}`, d(jan), "150", "0", "150", "1"},
			{"acme", "tokens", `{"region":"us"}`, d(jan), "40", "0", "40", "1"},
			{"globex", "api_calls", "{}", d(jan), "7", "0", "7", "1"},
			{"globex", "api_calls", "{}", d(feb), "0", "2", "2", "0"},
			{"initech", "api_calls", "{}", d(jan), "0", "6", "6", "0"},
		},
		"adjustments_per_period": {
			{d(jan), d(dec), "initech", "api_calls", "1", "6"},
			{d(feb), d(jan), "acme", "api_calls", "2", "5"},
			{d(feb), d(jan), "globex", "api_calls", "1", "2"},
		},
		"duplicate_rate_per_source": {
			// gw: 2 dropped of 3 accepted + 2 = 0.4; batch: 1 of 3 + 1 = 0.25; mobile: 0.
			{"gw", "2", "1", "3", "0.4000"},
			{"batch", "1", "0", "3", "0.2500"},
			{"mobile", "0", "0", "1", "0.0000"},
		},
		"rejected_by_reason": {
			{"too_old", "dedup", "3", d(firstRej), d(firstRej.Add(2 * time.Second))},
			{"invalid", "dedup", "2", d(firstRej.Add(3 * time.Second)), d(firstRej.Add(4 * time.Second))},
			{"uninsertable", "sink", "1", d(firstRej.Add(5 * time.Second)), d(firstRej.Add(5 * time.Second))},
		},
		"top_customers_this_month": {
			{"api_calls", "globex", "90"},
			{"api_calls", "acme", "70"},
			{"api_calls", "initech", "20"},
			{"tokens", "acme", "505"},
			{"tokens", "globex", "400"},
		},
	}
	if len(want) != len(AnalystQueries) {
		t.Fatalf("%d queries, %d expectations", len(AnalystQueries), len(want))
	}
	for _, q := range AnalystQueries {
		got := queryStrings(t, e.conn, q.SQL)
		if render(got) != render(want[q.Name]) {
			t.Errorf("%s:\ngot:\n%swant:\n%s", q.Name, render(got), render(want[q.Name]))
		}
	}
}
