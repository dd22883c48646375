package sink

import (
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/schemas"
)

// TestSinkAllTopics writes records of all five topics, watermarks
// interleaved, and checks that each table holds exactly its rows, with the
// values of the records and their Kafka coordinates, that watermarks are
// skipped but their offsets committed, and that the metrics count rows.
func TestSinkAllTopics(t *testing.T) {
	e := newEnv(t, 4)
	recs, nEvents := e.events(300, base)
	agg := &schemas.Aggregate{CustomerID: "acme", Meter: "api_calls", Group: []schemas.Property{{Name: "region", Value: "eu"}},
		Aggregation: "SUM", PeriodStart: base.Add(-24 * time.Hour).UnixMilli(), PeriodEnd: base.UnixMilli(), Revision: 3,
		Status: schemas.StatusFinal, Value: 42, EventCount: 7, FirstEventTime: 1, LastEventTime: 2, UpdatedAt: 3}
	adj := &schemas.Adjustment{EventID: "late-1", CustomerID: "acme", Meter: "api_calls", Aggregation: "SUM",
		OriginalPeriodStart: 1000, OriginalPeriodEnd: 2000, BookedPeriodStart: 3000, BookedPeriodEnd: 4000, Delta: 5, Quantity: 5,
		EventTime: 1500, IngestTime: 3500}
	dup := &schemas.Duplicate{EventID: "e1", CustomerID: "acme", Meter: "api_calls", Source: "gw", Conflict: true, Quantity: 1,
		EventTime: 10, OriginalPartition: 1, OriginalOffset: 2, OriginalArrival: 3, DuplicatePartition: 4, DuplicateOffset: 5, DuplicateArrival: 6}
	rej := &schemas.Rejected{Reason: schemas.ReasonTooOld, Detail: "event_time", Stage: "dedup", SourceTopic: "usage.events",
		SourcePartition: 2, SourceOffset: 9, SourceTimestamp: 11, RawValue: []byte{0xC3, 0x01, 0xFF}}
	for i := 0; i < 3; i++ {
		recs = append(recs,
			&kgo.Record{Topic: e.names.AggregatesTopic(), Partition: int32(i), Value: schemas.MustEncode(agg), Timestamp: base},
			&kgo.Record{Topic: e.names.AdjustmentsTopic(), Partition: int32(i), Value: schemas.MustEncode(adj), Timestamp: base},
			&kgo.Record{Topic: e.names.DuplicatesTopic(), Partition: int32(i), Value: schemas.MustEncode(dup), Timestamp: base},
			&kgo.Record{Topic: e.names.RejectedTopic(), Partition: int32(i), Value: schemas.MustEncode(rej), Timestamp: base})
	}
	e.produce(recs...)
	r := e.start(nil)
	e.waitCaughtUp(time.Minute)
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	e.exact(TableEvents, uint64(nEvents))
	for _, tb := range []string{TableAggregates, TableAdjustments, TableDuplicates, TableRejected} {
		e.exact(tb, 3)
	}
	if got := metric(t, r.reg, "meterline_sink_rows_total", "table", TableEvents, "outcome", outcomeInserted); got != float64(nEvents) {
		t.Errorf("rows_total{usage_events,inserted} = %v, want %d", got, nEvents)
	}
	if got := metric(t, r.reg, "meterline_sink_insert_seconds", "table", TableEvents); got < 1 {
		t.Errorf("insert_seconds has no samples")
	}

	// Values round-trip, with the Kafka coordinates.
	ctx := ctxT(t, time.Minute)
	var (
		topic, evID, cust, src string
		p, srcP                int32
		off, qty, evMs, ingMs  int64
		ts, evTime             time.Time
		pn, pv                 []string
	)
	row := e.conn.QueryRow(ctx, "SELECT kafka_topic, kafka_partition, kafka_offset, kafka_timestamp, event_id, customer_id, quantity, event_time, event_time_ms, source, property_names, property_values, ingest_time_ms, source_partition FROM "+e.db+".usage_events WHERE event_id = 'ev-2-13'")
	if err := row.Scan(&topic, &p, &off, &ts, &evID, &cust, &qty, &evTime, &evMs, &src, &pn, &pv, &ingMs, &srcP); err != nil {
		t.Fatal(err)
	}
	want := base.Add(13 * time.Second)
	if topic != e.names.DedupedTopic() || p != 2 || off != 14 /* 13 events + 1 watermark before it */ || !ts.Equal(want) ||
		cust != "cust-6" || qty != 4 || evMs != want.Add(-time.Minute).UnixMilli() || !evTime.Equal(want.Add(-time.Minute)) ||
		src != "batch" || len(pn) != 1 || pn[0] != "model" || pv[0] != "m1" || ingMs != want.UnixMilli() || srcP != 2 {
		t.Errorf("usage_events row: %s/%d@%d ts=%s %s %s qty=%d et=%s/%d src=%s props=%v=%v ingest=%d srcp=%d",
			topic, p, off, ts, evID, cust, qty, evTime, evMs, src, pn, pv, ingMs, srcP)
	}
	var gk, status string
	var value, rev int64
	var ps time.Time
	if err := e.conn.QueryRow(ctx, "SELECT group_key, status, value, revision, period_start FROM "+e.db+".usage_aggregates LIMIT 1").Scan(&gk, &status, &value, &rev, &ps); err != nil {
		t.Fatal(err)
	}
	if gk != `{"region":"eu"}` || status != "FINAL" || value != 42 || rev != 3 || !ps.Equal(base.Add(-24*time.Hour)) {
		t.Errorf("usage_aggregates row: %s %s %d %d %s", gk, status, value, rev, ps)
	}
	var rawKey, rawValue *string
	var reason string
	if err := e.conn.QueryRow(ctx, "SELECT reason, raw_key, raw_value FROM "+e.db+".usage_rejected LIMIT 1").Scan(&reason, &rawKey, &rawValue); err != nil {
		t.Fatal(err)
	}
	if reason != "too_old" || rawKey != nil || rawValue == nil || *rawValue != "\xC3\x01\xFF" {
		t.Errorf("usage_rejected row: %s key=%v value=%v", reason, rawKey, rawValue)
	}
}

// TestBackstopCollapsesReplays: a zombie's INSERT of rows already written
// (same records, so byte-identical rows) doubles plain count() until a
// merge; ReplacingMergeTree's merge then collapses each replayed row, and
// only those: distinct revisions of one aggregate all stay.
func TestBackstopCollapsesReplays(t *testing.T) {
	w, conn, db, ctx := offlineWriter(t, "zombie")
	names := testTopics()
	events, aggs := w.byTopic[names.DedupedTopic()], w.byTopic[names.AggregatesTopic()]
	var evRows, agRows []*row
	for i := 0; i < 100; i++ {
		r, err := events.buildRow(deduped(names.DedupedTopic(), 1, i, base.Add(time.Duration(i)*time.Second)))
		if err != nil {
			t.Fatal(err)
		}
		r.rec.Offset = int64(i)
		evRows = append(evRows, r)
		a := &schemas.Aggregate{CustomerID: "acme", Meter: "api_calls", Aggregation: "SUM", PeriodStart: 0, PeriodEnd: 1000,
			Revision: int64(i + 1), Status: schemas.StatusOpen, Value: int64(i)}
		ar, err := aggs.buildRow(&kgo.Record{Topic: names.AggregatesTopic(), Partition: 0, Offset: int64(i), Value: schemas.MustEncode(a), Timestamp: base})
		if err != nil {
			t.Fatal(err)
		}
		agRows = append(agRows, ar)
	}
	for i := 0; i < 2; i++ { // the sink, then a zombie replaying the same records
		if err := w.insert(ctx, events, evRows); err != nil {
			t.Fatal(err)
		}
		if err := w.insert(ctx, aggs, agRows); err != nil {
			t.Fatal(err)
		}
	}
	count := func(table string) uint64 {
		var n uint64
		if err := conn.QueryRow(ctx, "SELECT count() FROM "+db+"."+table).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if count(TableEvents) != 200 || count(TableAggregates) != 200 {
		t.Fatalf("before the merge: %d events, %d aggregates; want 200 each", count(TableEvents), count(TableAggregates))
	}
	for _, tb := range []string{TableEvents, TableAggregates} {
		if err := conn.Exec(ctx, "OPTIMIZE TABLE "+db+"."+tb+" FINAL"); err != nil {
			t.Fatal(err)
		}
	}
	if count(TableEvents) != 100 || count(TableAggregates) != 100 {
		t.Fatalf("after the merge: %d events, %d aggregate revisions; want 100 each", count(TableEvents), count(TableAggregates))
	}
}
