package sink

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/schemas"
)

// checkQuarantined checks that usage_quarantine holds rec exactly once,
// whole (key, value, headers, Kafka coordinates), with reason and a detail
// containing detail.
func (e *env) checkQuarantined(rec *kgo.Record, reason, detail string) {
	e.t.Helper()
	where := fmt.Sprintf("kafka_partition = %d AND kafka_offset = %d", rec.Partition, rec.Offset)
	if n := e.count(TableQuarantine, where); n != 1 {
		e.t.Fatalf("usage_quarantine has %d rows for %s/%d@%d, want 1", n, rec.Topic, rec.Partition, rec.Offset)
	}
	var (
		topic, gotReason, gotDetail string
		key, value                  *string
		hkeys, hvalues              []string
		tsMs                        int64
	)
	q := "SELECT kafka_topic, reason, detail, raw_key, raw_value, header_keys, header_values, kafka_timestamp_ms FROM " +
		e.db + "." + TableQuarantine + " WHERE " + where
	if err := e.conn.QueryRow(ctxT(e.t, 30*time.Second), q).Scan(&topic, &gotReason, &gotDetail, &key, &value, &hkeys, &hvalues, &tsMs); err != nil {
		e.t.Fatal(err)
	}
	if topic != e.names.RejectedTopic() || gotReason != reason || !strings.Contains(gotDetail, detail) || tsMs != rec.Timestamp.UnixMilli() {
		e.t.Errorf("quarantined row: topic %q reason %q detail %q timestamp %d; want %q %q ~%q %d",
			topic, gotReason, gotDetail, tsMs, e.names.RejectedTopic(), reason, detail, rec.Timestamp.UnixMilli())
	}
	if (key == nil) != (rec.Key == nil) || (key != nil && *key != string(rec.Key)) || value == nil || *value != string(rec.Value) {
		e.t.Errorf("quarantined row lost the raw bytes: key %v value %v; want %q %q", key, value, rec.Key, rec.Value)
	}
	if len(hkeys) != len(rec.Headers) || len(hvalues) != len(rec.Headers) {
		e.t.Fatalf("quarantined row has headers %q=%q, want %d", hkeys, hvalues, len(rec.Headers))
	}
	for i, h := range rec.Headers {
		if hkeys[i] != h.Key || hvalues[i] != string(h.Value) {
			e.t.Errorf("header %d: %q=%q, want %q=%q", i, hkeys[i], hvalues[i], h.Key, h.Value)
		}
	}
}

// rejectedInput is two good Rejected records around two that do not
// decode (garbage with a key and a header; an unknown schema), all in
// partition 0 of the rejected topic, produced in one batch.
func (e *env) rejectedInput() (good []*kgo.Record, garbage, unknown *kgo.Record) {
	topic := e.names.RejectedTopic()
	rej := func(id string) *kgo.Record {
		v := schemas.MustEncode(&schemas.Rejected{Reason: schemas.ReasonTooOld, Stage: "dedup", SourceTopic: "usage.events", EventID: id})
		return &kgo.Record{Topic: topic, Partition: 0, Value: v, Timestamp: base}
	}
	good = []*kgo.Record{rej("before"), rej("after")}
	garbage = &kgo.Record{Topic: topic, Partition: 0, Key: []byte("some\xffkey"), Value: []byte("not avro \x00\xff"),
		Headers: []kgo.RecordHeader{{Key: "origin", Value: []byte("a hand-written producer")}}, Timestamp: base.Add(time.Second)}
	unknown = &kgo.Record{Topic: topic, Partition: 0, Value: []byte{0xC3, 0x01, 1, 2, 3, 4, 5, 6, 7, 8, 0}, Timestamp: base.Add(2 * time.Second)}
	e.produce(good[0], garbage, unknown, good[1])
	return good, garbage, unknown
}

// TestQuarantineUndecodable: a record of usage.rejected that does not
// decode is never parked again (docs/design.md, The ClickHouse ledger); the
// sink writes it whole to usage_quarantine, counts it and commits past it.
// A second run changes nothing.
func TestQuarantineUndecodable(t *testing.T) {
	e := newEnv(t, 2)
	_, garbage, unknown := e.rejectedInput()
	r := e.start(nil)
	e.waitCaughtUp(2*time.Minute, e.names.RejectedTopic())
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	e.exact(TableRejected, 2)
	e.exact(TableQuarantine, 2)
	e.checkQuarantined(garbage, schemas.ReasonUndecodable, "usage_rejected")
	e.checkQuarantined(unknown, schemas.ReasonUnknownSchema, "usage_rejected")
	if got := e.parkedRecords(); len(got) != 0 {
		t.Errorf("%d records parked; a record of usage.rejected is never parked again", len(got))
	}
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"meterline_sink_quarantined_total", []string{"reason", schemas.ReasonUndecodable}, 1},
		{"meterline_sink_quarantined_total", []string{"reason", schemas.ReasonUnknownSchema}, 1},
		{"meterline_sink_rows_total", []string{"table", TableRejected, "outcome", outcomeQuarantined}, 2},
		{"meterline_rejected_total", nil, 0},
	} {
		if got := metric(t, r.reg, c.name, c.labels...); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	// The group committed past them: a second run writes nothing more.
	r = e.start(nil)
	e.waitCaughtUp(time.Minute, e.names.RejectedTopic())
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	e.exact(TableQuarantine, 2)
	e.exact(TableRejected, 2)
}

// TestCrashAfterQuarantine kills the real binary after the window that
// quarantined undecodable records wrote them, before its offsets were
// committed: the restart reads them again and finds them in
// usage_quarantine, so each is there exactly once.
func TestCrashAfterQuarantine(t *testing.T) {
	waitsMostly(t)
	e := newEnv(t, 2)
	_, garbage, unknown := e.rejectedInput()
	p := e.spawn(FaultAfterInsert, e.sinkArgs()...)
	p.ExpectFaultKill(t, FaultAfterInsert, 2*time.Minute)
	if n := e.count(TableQuarantine); n != 2 {
		t.Fatalf("after the kill usage_quarantine has %d rows; the killed window should have written both (was the input polled in two windows?)", n)
	}
	if c, ok := e.committed(e.names.RejectedTopic())[0]; ok && c > garbage.Offset {
		t.Fatalf("committed offset %d is past the quarantined record %d: the kill did not fall in the window", c, garbage.Offset)
	}
	p = e.spawn("", e.sinkArgs()...)
	e.waitCaughtUp(2*time.Minute, e.names.RejectedTopic())
	p.Stop(t)
	e.exact(TableQuarantine, 2)
	e.exact(TableRejected, 2)
	e.checkQuarantined(garbage, schemas.ReasonUndecodable, "usage_rejected")
	e.checkQuarantined(unknown, schemas.ReasonUnknownSchema, "usage_rejected")
}

// TestCrashAfterQuarantineRefused: ClickHouse refuses a record of
// usage.rejected, which is quarantined; the process dies before the
// commit, and the table is fixed before the restart. The replay must not
// write the record to usage_rejected as well: it is in one table, once.
func TestCrashAfterQuarantineRefused(t *testing.T) {
	waitsMostly(t)
	e := newEnv(t, 2)
	e.exec("ALTER TABLE " + e.db + ".usage_rejected ADD COLUMN poison UInt8 MATERIALIZED throwIf(event_id = 'poison-rej')")
	topic := e.names.RejectedTopic()
	var recs []*kgo.Record
	for _, id := range []string{"a", "b", "poison-rej", "c", "d"} {
		v := schemas.MustEncode(&schemas.Rejected{Reason: schemas.ReasonInvalid, Stage: "dedup", SourceTopic: "usage.events", EventID: id})
		recs = append(recs, &kgo.Record{Topic: topic, Partition: 0, Value: v, Timestamp: base})
	}
	e.produce(recs...)
	poison := recs[2]
	p := e.spawn(FaultAfterInsert, e.sinkArgs()...)
	p.ExpectFaultKill(t, FaultAfterInsert, 2*time.Minute)
	if n := e.count(TableQuarantine); n != 1 {
		t.Fatalf("after the kill usage_quarantine has %d rows, want the refused record", n)
	}
	e.exec("ALTER TABLE " + e.db + ".usage_rejected DROP COLUMN poison")
	p = e.spawn("", e.sinkArgs()...)
	e.waitCaughtUp(2*time.Minute, topic)
	p.Stop(t)
	e.exact(TableRejected, 4)
	if n := e.count(TableRejected, "event_id = 'poison-rej'"); n != 0 {
		t.Fatalf("the quarantined record was also written to usage_rejected on the replay")
	}
	e.exact(TableQuarantine, 1)
	e.checkQuarantined(poison, schemas.ReasonUninsertable, "code: 395")
}

// TestQuarantineManyRows: a batch of tens of thousands of records of
// usage.rejected that do not decode (a newer stage writing a schema this
// sink does not know yet, while the sink catches up) is written to
// usage_quarantine, each once, and the sink moves on. Its lookup of the
// rows already there names a range of offsets per partition, not every
// offset: 50,000 offsets in an IN list made a query longer than the
// server's max_query_size (256 KiB), which failed on every retry, and the
// sink backed off forever, taking ClickHouse for unavailable.
func TestQuarantineManyRows(t *testing.T) {
	waitsMostly(t)
	e := newEnv(t, 1)
	const n = 50_000
	recs := make([]*kgo.Record, n)
	for i := range recs {
		recs[i] = &kgo.Record{Topic: e.names.RejectedTopic(), Value: []byte{0xC3, 0x01, 9, 9, 9, 9, 9, 9, 9, 9}, Timestamp: base}
	}
	e.produce(recs...)
	r := e.start(func(c *Config) {
		// One INSERT batch: the records are all there when it starts.
		c.MaxBatchRecords, c.MaxBatchWait, c.CommitInterval = n, 10*time.Second, 10*time.Second
	})
	e.waitCaughtUp(2*time.Minute, e.names.RejectedTopic())
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	e.exact(TableQuarantine, n)
	e.exact(TableRejected, 0)
}
