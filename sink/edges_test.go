package sink

import (
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/schemas"
)

// TestDateTimeOutOfRange: a time outside ClickHouse's DateTime (seconds
// in [1970-01-01, 2106-02-07 06:28:15], an unsigned 32-bit number) is
// written at the nearest end of that range, never wrapped around to
// another date; its _ms column keeps it exactly. A grant that expires in
// 2200 is valid entitlements (expires_at is any later instant), and the
// driver turned it into 2063 without an error.
func TestDateTimeOutOfRange(t *testing.T) {
	e := newEnv(t, 1)
	far := time.Date(2200, 1, 1, 0, 0, 0, 0, time.UTC).UnixMilli()
	before := int64(-86_400_000) // 1969-12-31
	b := &schemas.Balance{CustomerID: "acme", Plan: "pro", Revision: 1, UpdatedAt: base.UnixMilli(),
		PeriodStart: base.UnixMilli(), PeriodEnd: base.Add(time.Hour).UnixMilli(), OverdraftPolicy: schemas.OverdraftDeny,
		Grants: []schemas.GrantBalance{{ID: "forever", Amount: 10, Remaining: 10, ExpiresAt: far}}}
	ev := &schemas.DedupedEvent{EventID: "e1", CustomerID: "acme", Meter: "api_calls", Quantity: 1,
		EventTime: before, IngestTime: far}
	e.produce(
		&kgo.Record{Topic: e.names.BalancesTopic(), Value: schemas.MustEncode(b), Timestamp: base},
		&kgo.Record{Topic: e.names.DedupedTopic(), Value: schemas.MustEncode(ev), Timestamp: base})
	r := e.start(nil)
	e.waitCaughtUp(time.Minute, e.names.BalancesTopic(), e.names.DedupedTopic())
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	e.exact(TableBalances, 1)
	e.exact(TableEvents, 1)
	last := fmt.Sprint(uint32(math.MaxUint32))
	got := render(queryStrings(t, e.conn, "SELECT toUInt32(grant_expires_at[1]), grant_expires_at_ms[1] FROM "+e.db+"."+TableBalances))
	if want := last + " | " + fmt.Sprint(far) + "\n"; got != want {
		t.Errorf("usage_balances grant expiring in 2200: got %q, want %q", got, want)
	}
	got = render(queryStrings(t, e.conn, "SELECT toUInt32(event_time), event_time_ms, toUInt32(ingest_time), ingest_time_ms FROM "+e.db+"."+TableEvents))
	if want := fmt.Sprintf("0 | %d | %s | %d\n", before, last, far); got != want {
		t.Errorf("usage_events event of 1969 ingested in 2200: got %q, want %q", got, want)
	}
}

// TestInsertOutlivesItsTimeout: an INSERT that the server is still
// running when the sink's deadline for it passes (here every row takes
// 0.1 s to write, so the block takes 2 s against a 1 s deadline) lands
// after the sink gave up on it. The sink's retry must not write its rows
// a second time: before it looks up which rows are in the table, the
// attempt that timed out has ended on the server.
func TestInsertOutlivesItsTimeout(t *testing.T) {
	e := newEnv(t, 1)
	ctx := ctxT(t, time.Minute)
	if err := e.conn.Exec(ctx, "ALTER TABLE "+e.db+"."+TableEvents+" ADD COLUMN slow UInt8 MATERIALIZED sleepEachRow(0.1)"); err != nil {
		t.Fatal(err)
	}
	var recs []*kgo.Record
	for i := 0; i < 20; i++ {
		recs = append(recs, deduped(e.names.DedupedTopic(), 0, i, base.Add(time.Duration(i)*time.Second)))
	}
	e.produce(recs...)
	r := e.start(func(c *Config) {
		c.InsertTimeout = time.Second
		c.MaxBatchWait = 2 * time.Second // one block of 20 rows
		c.CommitInterval = 3 * time.Second
	})
	e.waitCaughtUp(time.Minute, e.names.DedupedTopic())
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	// Let any INSERT still running on the server finish: the attempt that
	// timed out, and a second write of its rows if the retry did not wait.
	insertsEnded(t, e.conn, e.db, time.Minute)
	e.exact(TableEvents, 20)
	if got := render(queryStrings(t, e.conn, "SELECT sum(events) FROM "+e.db+"."+TableUsageDaily)); got != "20\n" {
		t.Errorf("usage_daily counts %s events, want 20", got)
	}
}

// TestRejectedRecordsOfOneSource: two records of usage.rejected about one
// source record (the aggregator rejected an event over_limit, and the sink
// parked the same record of usage.deduped as uninsertable) are two rows of
// usage_rejected for good: the ledger's ReplacingMergeTree collapses only a
// replayed record (same partition and offset), and a merge used to keep
// one of the two (and verify then dropped the event from unbilled_events).
func TestRejectedRecordsOfOneSource(t *testing.T) {
	w, conn, db, ctx := offlineWriter(t, "i1")
	names := testTopics()
	rt := w.byTopic[names.RejectedTopic()]
	var rows []*row
	for i, rej := range []*schemas.Rejected{
		{Reason: schemas.ReasonOverLimit, Stage: "aggregator"},
		{Reason: schemas.ReasonUninsertable, Stage: "sink"},
	} {
		rej.SourceTopic, rej.SourcePartition, rej.SourceOffset = names.DedupedTopic(), 3, 77
		rej.CustomerID, rej.Meter, rej.EventID = "acme", "api_calls", "e1"
		r, err := rt.buildRow(&kgo.Record{Topic: names.RejectedTopic(), Partition: 0, Offset: int64(10 + i), Value: schemas.MustEncode(rej), Timestamp: base})
		if err != nil {
			t.Fatal(err)
		}
		rows = append(rows, r)
	}
	// Written twice: the second INSERT is a replay (a zombie's), which the
	// merge collapses.
	for i := 0; i < 2; i++ {
		if err := w.insert(ctx, rt, rows); err != nil {
			t.Fatal(err)
		}
	}
	if err := conn.Exec(ctx, "OPTIMIZE TABLE "+db+"."+TableRejected+" FINAL"); err != nil {
		t.Fatal(err)
	}
	got := render(queryStrings(t, conn, "SELECT kafka_offset, stage, reason FROM "+db+"."+TableRejected+" ORDER BY kafka_offset"))
	if want := "10 | aggregator | over_limit\n11 | sink | uninsertable\n"; got != want {
		t.Errorf("usage_rejected after a merge:\n%s\nwant\n%s", got, want)
	}
}
