package sink

import (
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/schemas"
)

// rereadRun runs the sink until the group has committed every record of
// the topic and of the rejected topic, and checks that it parked nothing
// and found want rows parked already.
func (e *env) rereadRun(topic string, want float64) {
	e.t.Helper()
	r := e.start(nil)
	e.waitCaughtUp(time.Minute, topic, e.names.RejectedTopic())
	if err := r.stop(); err != nil {
		e.t.Fatal(err)
	}
	if got := metric(e.t, r.reg, "meterline_sink_rows_total", "table", TableEvents, "outcome", outcomeParked); got != 0 {
		e.t.Errorf("rows parked on the re-read = %v, want 0", got)
	}
	if got := metric(e.t, r.reg, "meterline_sink_rows_total", "table", TableEvents, "outcome", outcomeParkedBefore); got != want {
		e.t.Errorf("rows found parked already on the re-read = %v, want %v", got, want)
	}
}

// lookupParked runs the lookup of the rows of partition k parked in
// [from, progress) by a Writer that is not running.
func (e *env) lookupParked(k tp, from, progress int64) parkedLookup {
	e.t.Helper()
	cfg := e.config("lookup")
	cfg.Conn = e.conn
	w, err := New(cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	found, err := w.lookupParked(ctxT(e.t, time.Minute), k, from, progress)
	if err != nil {
		e.t.Fatal(err)
	}
	return found
}

// parkedOnce checks that the sink parked exactly one record, the one at
// offset off of the test's partition, and that usage_rejected holds it
// once.
func (e *env) parkedOnce(off int64, when string) {
	e.t.Helper()
	if got := e.parkedRecords(); len(got) != 1 || got[0].SourceOffset != off {
		e.t.Fatalf("parked records %+v %s, want the one at offset %d once", got, when, off)
	}
	e.exact(TableRejected, 1)
}

// TestBackwardResetParksNothingTwice: a row parked is never parked twice
// (docs/design.md, The ClickHouse ledger, "Refused blocks"). ClickHouse
// refuses the row at offset 4, which is parked; later rows are written.
// Then an operator moves the group's offset back below the recorded
// progress (kafka-consumer-groups --reset-offsets --to-earliest, to
// replay). The re-read skips the rows in the table and refuses the row at
// offset 4 again: it is not parked a second time, and usage_rejected holds
// it once.
func TestBackwardResetParksNothingTwice(t *testing.T) {
	waitsMostly(t)
	e := newEnv(t, 1)
	topic := e.names.DedupedTopic()
	e.parkOne(topic)
	e.produce(deduped(topic, 0, 10, base.Add(10*time.Second)), deduped(topic, 0, 11, base.Add(11*time.Second)))
	e.runOnce(topic, e.names.RejectedTopic())
	e.exact(TableEvents, 11)
	e.exact(TableRejected, 1)

	e.setOffset(topic, 0, 0)
	e.rereadRun(topic, 1)
	e.exact(TableEvents, 11)
	e.parkedOnce(4, "after the backward reset")
}

// TestBackwardResetParkedRowAtProgress: as above, but the refused row is
// the partition's last record, so the recorded progress is just past it
// (as after a crash between its park and the commit, when it must be
// parked on the re-read). Its park committed: the re-read does not park
// it again.
func TestBackwardResetParkedRowAtProgress(t *testing.T) {
	waitsMostly(t)
	e := newEnv(t, 1)
	topic := e.names.DedupedTopic()
	e.producePoisoned(topic, 10, 9)
	e.runOnce(topic, e.names.RejectedTopic())
	e.exact(TableEvents, 9)
	e.parkedOnce(9, "before the backward reset")

	e.setOffset(topic, 0, 5)
	e.rereadRun(topic, 1)
	e.exact(TableEvents, 9)
	e.parkedOnce(9, "after the backward reset")
}

// TestBackwardResetParkNotInTableYet: the sink is killed right after the
// transaction that parked the partition's last record committed, before
// it read the park back into usage_rejected; then the group's offset is
// moved back. The lookup finds the park in usage.rejected past its
// recorded progress, and the re-read does not park the row again.
func TestBackwardResetParkNotInTableYet(t *testing.T) {
	waitsMostly(t)
	e := newEnv(t, 1)
	topic := e.names.DedupedTopic()
	e.poisonedKill(topic, 9, FaultAfterParkCommit)
	for deadline := time.Now().Add(30 * time.Second); e.committed(topic)[0] != 10; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("committed offset after the park = %d, want 10", e.committed(topic)[0])
		}
	}
	if got := e.parkedRecords(); len(got) != 1 || got[0].SourceOffset != 9 {
		t.Fatalf("parked records %+v, want the row at offset 9 once", got)
	}
	e.exact(TableRejected, 0) // the park is not in the table yet

	// The killed member holds the group until its session times out.
	var os kadm.Offsets
	os.Add(kadm.Offset{Topic: topic, Partition: 0, At: 5, LeaderEpoch: -1})
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(500 * time.Millisecond) {
		resp, err := testenv.Admin(t, e.brokers).CommitOffsets(ctxT(t, 30*time.Second), e.group, os)
		if err == nil {
			err = resp.Error()
		}
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("set the group's offset: %v", err)
		}
	}

	found := e.lookupParked(tp{topic, 0}, 5, 10)
	if _, ok := found.parked[9]; len(found.parked) != 1 || !ok {
		t.Fatalf("rows parked below the progress found: %v, want offset 9 (from %s)", found.parked, e.names.RejectedTopic())
	}

	e.rereadRun(topic, 1)
	e.exact(TableEvents, 9)
	e.parkedOnce(9, "after the backward reset")
}

// TestBackwardResetUndecodableParkedOnce: a record of usage.deduped that
// does not decode is parked; after the group's offset is moved back, the
// re-read does not park it again.
func TestBackwardResetUndecodableParkedOnce(t *testing.T) {
	waitsMostly(t)
	e := newEnv(t, 1)
	topic := e.names.DedupedTopic()
	var recs []*kgo.Record
	for i := 0; i < 10; i++ {
		recs = append(recs, deduped(topic, 0, i, base.Add(time.Duration(i)*time.Second)))
	}
	recs[4].Value = []byte("not avro")
	e.produce(recs...)
	e.runOnce(topic, e.names.RejectedTopic())
	e.exact(TableEvents, 9)
	if got := e.parkedRecords(); len(got) != 1 || got[0].SourceOffset != 4 || got[0].Reason != schemas.ReasonUndecodable {
		t.Fatalf("parked records %+v, want the record at offset 4 once, undecodable", got)
	}

	e.setOffset(topic, 0, 0)
	e.rereadRun(topic, 0)
	e.exact(TableEvents, 9)
	e.parkedOnce(4, "after the backward reset")
}

// TestBackwardResetIntoAcceptedGap: records 10..19 were skipped on purpose
// (accept-offsets), so the progress is past them though none was read.
// The operator then moves the offset back into the gap to write them:
// the row ClickHouse refuses there was never parked and is parked now,
// once, although the sink is killed between its park and the commit; a
// second move back does not park it again.
func TestBackwardResetIntoAcceptedGap(t *testing.T) {
	waitsMostly(t)
	e := newEnv(t, 1)
	topic := e.names.DedupedTopic()
	e.producePoisoned(topic, 10, 4)
	e.runOnce(topic, e.names.RejectedTopic())
	e.exact(TableEvents, 9)
	var gap []*kgo.Record
	for i := 10; i < 20; i++ {
		gap = append(gap, deduped(topic, 0, i, base.Add(time.Duration(i)*time.Second)))
	}
	var ev schemas.DedupedEvent
	if err := schemas.DecodeInto(gap[4].Value, &ev); err != nil {
		t.Fatal(err)
	}
	ev.CustomerID = "poison"
	gap[4].Value = schemas.MustEncode(&ev)
	e.produce(gap...)
	e.setOffset(topic, 0, 20)
	if _, err := AcceptOffsets(ctxT(t, time.Minute), e.acceptConfig()); err != nil {
		t.Fatal(err)
	}

	e.setOffset(topic, 0, 0)
	p := e.spawn(FaultAfterPark, e.sinkArgs()...)
	p.ExpectFaultKill(t, FaultAfterPark, 2*time.Minute)
	p = e.spawn("", e.sinkArgs()...)
	e.waitCaughtUp(2*time.Minute, topic, e.names.RejectedTopic())
	p.Stop(t)
	e.exact(TableEvents, 18)
	check := func(when string) {
		t.Helper()
		got := e.parkedRecords()
		if len(got) != 2 || got[0].SourceOffset+got[1].SourceOffset != 4+14 || got[0].SourceOffset == got[1].SourceOffset {
			t.Fatalf("parked records %+v %s, want the rows at offsets 4 and 14 once each", got, when)
		}
		e.exact(TableRejected, 2)
	}
	check("after the first move back")

	e.setOffset(topic, 0, 0)
	e.rereadRun(topic, 2)
	e.exact(TableEvents, 18)
	check("after the second move back")
}

// TestParkedQueryOnChdb runs the lookup of the rows parked below the
// recorded progress on current ClickHouse (chdb, 26.x) as on 18.16 (the
// tests above): it finds the sink's parks of the partition in the range,
// not another stage's rejection, another partition's park, or one at the
// progress; and in usage_quarantine the values of the rejected topic's
// records refused as rows of usage_rejected, not those that do not
// decode.
func TestParkedQueryOnChdb(t *testing.T) {
	python := testenv.Chdb(t)
	stmts := append(migrationStatements(t), "INSERT INTO "+TableRejected+" (kafka_topic, kafka_partition, kafka_offset, kafka_timestamp, reason, stage, source_topic, source_partition, source_offset) VALUES "+
		"('r', 0, 0, now(), 'uninsertable', 'sink', 't', 0, 7), ('r', 0, 1, now(), 'uninsertable', 'sink', 't', 0, 4), "+
		"('r', 1, 0, now(), 'invalid', 'dedup', 't', 0, 5), ('r', 1, 1, now(), 'uninsertable', 'sink', 't', 1, 6), "+
		"('r', 0, 2, now(), 'uninsertable', 'sink', 't', 0, 10), ('r', 0, 3, now(), 'undecodable', 'sink', 'u', 0, 6)",
		"INSERT INTO "+TableQuarantine+" (kafka_topic, kafka_partition, kafka_offset, kafka_timestamp, reason, raw_value) VALUES "+
			"('r', 0, 4, now(), 'uninsertable', 'park'), ('r', 0, 5, now(), 'undecodable', 'junk'), ('r', 0, 6, now(), 'uninsertable', NULL), "+
			"('other', 0, 0, now(), 'uninsertable', 'other')")
	resp, err := runChdb(ctxT(t, 5*time.Minute), python, chdbRequest{Path: t.TempDir(), Database: "parked",
		Statements: stmts, Queries: []string{parkedQuery("parked", tp{"t", 0}, 2, 10), quarantinedParksQuery("parked", "r")}})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Results) != 2 || resp.Results[0] != "4\n7\n" || resp.Results[1] != "park\n" {
		t.Fatalf("rows parked below the progress on chdb %s: %q, want \"4\\n7\\n\" and the quarantined park \"park\\n\"", resp.Version, resp.Results)
	}
	t.Logf("rows parked below the progress on chdb %s: offsets 4 and 7", resp.Version)
}

// TestLookupParkedKeepsOnlyItsParks: the lookup of the rows parked below
// a partition's recorded progress reads usage.rejected from its recorded
// progress to its end, which after a flood of rejections is large. It
// keeps only the records that are the sink's parks of the partition
// looked up, in its range: 4 of 2,008 records here (dedup's rejections
// with their raw events, the sink's parks of another partition and
// outside the range, a record that does not decode), so its memory is
// bounded by its answer, not by the topic's tail.
func TestLookupParkedKeepsOnlyItsParks(t *testing.T) {
	e := newEnv(t, 2)
	topic, rejected := e.names.DedupedTopic(), e.names.RejectedTopic()
	rec := func(p int32, rej *schemas.Rejected) *kgo.Record {
		return &kgo.Record{Topic: rejected, Partition: p, Value: schemas.MustEncode(rej), Timestamp: base}
	}
	park := func(p int32, src tp, off int64) *kgo.Record {
		return rec(p, &schemas.Rejected{Reason: schemas.ReasonUninsertable, Stage: stage,
			SourceTopic: src.topic, SourcePartition: src.p, SourceOffset: off, RawKeyLength: -1, RawValueLength: -1})
	}
	raw := []byte(strings.Repeat("r", 1<<10))
	var recs []*kgo.Record
	for i := 0; i < 2000; i++ {
		recs = append(recs, rec(int32(i%2), &schemas.Rejected{Reason: schemas.ReasonInvalid, Stage: "dedup",
			SourceTopic: e.names.EventsTopic(), SourcePartition: 0, SourceOffset: int64(i), RawValue: raw, RawValueLength: int64(len(raw))}))
		if i%500 == 0 {
			recs = append(recs, park(int32(i/500%2), tp{topic, 0}, int64(10+i/50)))
		}
	}
	recs = append(recs,
		park(0, tp{topic, 1}, 20), park(1, tp{topic, 0}, 4), park(0, tp{topic, 0}, 100),
		&kgo.Record{Topic: rejected, Partition: 1, Value: []byte("not avro"), Timestamp: base})
	e.produce(recs...)
	found := e.lookupParked(tp{topic, 0}, 5, 100)
	want := map[int64]struct{}{10: {}, 20: {}, 30: {}, 40: {}}
	if !maps.Equal(found.parked, want) {
		t.Errorf("rows parked below the progress found: %v, want offsets 10, 20, 30 and 40", found.parked)
	}
	if found.read != len(recs) || found.kept != len(want) {
		t.Errorf("the lookup read %d records of %s and kept %d; want %d read and %d kept (the parks it answers with)",
			found.read, rejected, found.kept, len(recs), len(want))
	}
}

// TestBackwardResetParkQuarantinedNotParkedTwice: ClickHouse refuses the
// row at offset 4 of usage.deduped, which is parked, and then refuses the
// park itself in usage_rejected (a column added by hand, say), so the
// park's record is in usage_quarantine, not in usage_rejected. After the
// group's offset is moved back below the recorded progress, the re-read
// finds that park in usage_quarantine and does not park the row again.
func TestBackwardResetParkQuarantinedNotParkedTwice(t *testing.T) {
	waitsMostly(t)
	e := newEnv(t, 1)
	topic := e.names.DedupedTopic()
	e.exec("ALTER TABLE " + e.db + ".usage_rejected ADD COLUMN poison UInt8 MATERIALIZED throwIf(stage = 'sink')")
	e.parkOne(topic)
	e.exact(TableRejected, 0)
	e.exact(TableQuarantine, 1)

	e.setOffset(topic, 0, 0)
	e.rereadRun(topic, 1)
	e.exact(TableEvents, 9)
	if got := e.parkedRecords(); len(got) != 1 || got[0].SourceOffset != 4 {
		t.Fatalf("parked records %+v after the backward reset, want the one at offset 4 once", got)
	}
	e.exact(TableQuarantine, 1)
}
