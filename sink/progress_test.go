package sink

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/schemas"
	chschema "github.com/meterline/meterline/schemas/clickhouse"
)

// setOffset commits offset for the env's group on partition p of topic,
// as kafka-consumer-groups --reset-offsets does while no sink runs.
func (e *env) setOffset(topic string, p int32, offset int64) {
	e.t.Helper()
	adm := testenv.Admin(e.t, e.brokers)
	var os kadm.Offsets
	os.Add(kadm.Offset{Topic: topic, Partition: p, At: offset, LeaderEpoch: -1})
	if resp, err := adm.CommitOffsets(ctxT(e.t, 30*time.Second), e.group, os); err != nil || resp.Error() != nil {
		e.t.Fatalf("set the group's offset: %v %v", err, resp.Error())
	}
}

// endOffset is the partition's high watermark.
func (e *env) endOffset(topic string, p int32) int64 {
	e.t.Helper()
	ends, err := testenv.Admin(e.t, e.brokers).ListEndOffsets(ctxT(e.t, 30*time.Second), topic)
	if err != nil {
		e.t.Fatal(err)
	}
	end, _ := ends.Lookup(topic, p)
	return end.Offset
}

// expectRefusal waits for the sink to stop with ErrOffsetsAhead and
// checks that its error says each of want.
func expectRefusal(t *testing.T, r *running, want ...string) {
	t.Helper()
	expectStop(t, r, ErrOffsetsAhead, want...)
}

// expectStop waits for the sink to stop with an error wrapping target and
// checks that its error says each of want.
func expectStop(t *testing.T, r *running, target error, want ...string) {
	t.Helper()
	select {
	case <-r.exited:
	case <-time.After(time.Minute):
		_ = r.stop()
		t.Fatalf("the sink did not stop on its own within a minute, want %v", target)
	}
	if !errors.Is(r.err, target) {
		t.Fatalf("the sink stopped with %v, want %v", r.err, target)
	}
	for _, s := range want {
		if !strings.Contains(r.err.Error(), s) {
			t.Errorf("the error does not say %q: %v", s, r.err)
		}
	}
}

// runOnce runs the sink until the group has committed every record of
// topics, checks that it did not stop on its own, and returns it stopped.
func (e *env) runOnce(topics ...string) *running {
	e.t.Helper()
	r := e.start(nil)
	e.waitCaughtUp(time.Minute, topics...)
	select {
	case <-r.exited:
		e.t.Fatalf("the sink stopped: %v", r.err)
	default:
	}
	if err := r.stop(); err != nil {
		e.t.Fatal(err)
	}
	return r
}

// writtenThenMore produces ten records to partition 0 of topic, event
// times a second apart from start, runs the sink until it has written
// them, then produces ten more that it has not.
func (e *env) writtenThenMore(topic string, start time.Time) {
	e.t.Helper()
	e.produce(tenFrom(topic, 0, start)...)
	e.runOnce(topic)
	e.exact(TableEvents, 10)
	e.produce(tenFrom(topic, 10, start)...)
}

// tenFrom returns ten records of partition 0 of topic, numbered from i
// on, event times a second apart from start + i seconds.
func tenFrom(topic string, i int, start time.Time) (recs []*kgo.Record) {
	for j := i; j < i+10; j++ {
		recs = append(recs, deduped(topic, 0, j, start.Add(time.Duration(j)*time.Second)))
	}
	return recs
}

// deleteRecordsBelow deletes the records of partition p of topic below
// offset, as retention does.
func (e *env) deleteRecordsBelow(topic string, p int32, offset int64) {
	e.t.Helper()
	var os kadm.Offsets
	os.Add(kadm.Offset{Topic: topic, Partition: p, At: offset, LeaderEpoch: -1})
	resp, err := testenv.Admin(e.t, e.brokers).DeleteRecords(ctxT(e.t, 30*time.Second), os)
	if err == nil {
		err = resp.Error()
	}
	if err != nil {
		e.t.Fatalf("delete records below offset %d: %v", offset, err)
	}
}

// TestCommittedOffsetAheadOfProgress: docs/design.md, The ClickHouse
// ledger, "Offsets ahead of the tables". The group's committed offset is
// moved past ten records that are in no table (an operator's
// kafka-consumer-groups --reset-offsets --to-latest). The sink stops before
// writing anything of the partition, naming it, both offsets and the
// command; once the offset is set back as it says, every row arrives.
func TestCommittedOffsetAheadOfProgress(t *testing.T) {
	e := newEnv(t, 1)
	topic := e.names.DedupedTopic()
	e.writtenThenMore(topic, time.Date(2026, 5, 4, 0, 0, 0, 0, time.UTC))
	e.setOffset(topic, 0, e.endOffset(topic, 0))
	expectRefusal(t, e.start(nil), topic+" partition 0", "committed offset 20", "below offset 10",
		"--group "+e.group+" --topic "+topic+":0 --reset-offsets --to-offset 10 --execute")
	e.exact(TableEvents, 10)

	e.setOffset(topic, 0, 10)
	e.runOnce(topic)
	e.exact(TableEvents, 20)
}

// TestCommittedOffsetAheadPastLogStart: the sink fell behind until
// retention deleted records it had not written, stopped with
// OFFSET_OUT_OF_RANGE, and its group's offset was reset to the earliest
// offset (docs/operations.md, Outages). The records between the progress
// and the log start are gone: the sink stops, and its error says so and
// names accept-offsets, never a reset to the progress, which would only
// stop it with OFFSET_OUT_OF_RANGE again. With the committed offset past
// the log start, it names the reset to the log start first. Following
// the error, the records the log still holds are written.
func TestCommittedOffsetAheadPastLogStart(t *testing.T) {
	e := newEnv(t, 1)
	topic := e.names.DedupedTopic()
	e.writtenThenMore(topic, base)
	e.deleteRecordsBelow(topic, 0, 15)
	accept := fmt.Sprintf("meterline sink accept-offsets --group %s --database %s --topic %s --partition 0", e.group, e.db, topic)
	notToProgress := func(r *running) {
		t.Helper()
		if strings.Contains(r.err.Error(), "--to-offset 10 --execute") {
			t.Errorf("the error tells to reset to the progress, whose records are gone: %v", r.err)
		}
	}

	e.setOffset(topic, 0, 15)
	r := e.start(nil)
	expectRefusal(t, r, "committed offset 15", "below offset 10", "the partition now starts at 15",
		"records 10..14 are no longer in the log", "OFFSET_OUT_OF_RANGE", accept)
	notToProgress(r)

	e.setOffset(topic, 0, 18)
	r = e.start(nil)
	expectRefusal(t, r, "records 10..14 are no longer in the log", "To write records 15..17",
		"--group "+e.group+" --topic "+topic+":0 --reset-offsets --to-offset 15 --execute", accept)
	notToProgress(r)
	e.exact(TableEvents, 10)

	e.setOffset(topic, 0, 15)
	if _, err := AcceptOffsets(ctxT(t, time.Minute), e.acceptConfig()); err != nil {
		t.Fatal(err)
	}
	e.runOnce(topic)
	e.exact(TableEvents, 15)
}

// TestNewDatabaseBehindExistingGroup: the sink is pointed at a new
// database with the group of an existing one. The database has no
// progress and the committed offset is above the partition's start: the
// sink stops, telling to reset to the earliest offset; after that reset
// the new database gets every row.
func TestNewDatabaseBehindExistingGroup(t *testing.T) {
	e := newEnv(t, 1)
	topic := e.names.DedupedTopic()
	recs, n := e.events(10, base)
	e.produce(recs...)
	e.runOnce(topic)
	e.exact(TableEvents, uint64(n))

	conn, db := testenv.ClickHouseDB(t)
	if _, err := Migrate(ctxT(t, time.Minute), conn); err != nil {
		t.Fatal(err)
	}
	if got := countIn(t, e, db, ProgressTable); got != 0 {
		t.Fatalf("a new database has %d rows in %s, want none (no adoption marker)", got, ProgressTable)
	}
	e.db = db
	expectRefusal(t, e.start(nil), "database "+db+" has no progress", topic+" partition 0",
		fmt.Sprintf("committed offset %d", len(recs)), "--reset-offsets --to-earliest --execute")
	e.exact(TableEvents, 0)

	e.setOffset(topic, 0, 0)
	e.runOnce(topic)
	e.exact(TableEvents, uint64(n))
}

func countIn(t *testing.T, e *env, db, table string) uint64 {
	t.Helper()
	var n uint64
	if err := e.conn.QueryRow(ctxT(t, 30*time.Second), "SELECT count() FROM "+db+"."+table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestProgressWatermarkTail: the partition ends with records that make no
// row (watermarks). The committed offset is past the last row; the
// recorded progress is at the committed offset, and a restart goes on.
func TestProgressWatermarkTail(t *testing.T) {
	e := newEnv(t, 1)
	topic := e.names.DedupedTopic()
	var recs []*kgo.Record
	for i := 0; i < 10; i++ {
		recs = append(recs, deduped(topic, 0, i, base.Add(time.Duration(i)*time.Second)))
	}
	for i := 0; i < 5; i++ {
		recs = append(recs, watermark(topic, 0, base.Add(time.Duration(10+i)*time.Second)))
	}
	e.produce(recs...)
	e.runOnce(topic)
	e.exact(TableEvents, 10)
	if c := e.committed(topic); c[0] != 15 {
		t.Fatalf("committed offset %d, want 15 (past the watermarks)", c[0])
	}
	e.produce(deduped(topic, 0, 15, base.Add(15*time.Second)))
	e.runOnce(topic)
	e.exact(TableEvents, 11)
}

// TestProgressParkedRowAtEnd: the partition's last record is a row
// ClickHouse refuses; it is parked in the transaction that commits past
// it (the topic it is parked to gets transaction markers). A restart is
// not refused and parks nothing twice.
func TestProgressParkedRowAtEnd(t *testing.T) {
	e := newEnv(t, 1)
	topic := e.names.DedupedTopic()
	e.producePoisoned(topic, 10, 9)
	e.runOnce(topic, e.names.RejectedTopic())
	e.exact(TableEvents, 9)
	if c := e.committed(topic); c[0] != 10 {
		t.Fatalf("committed offset %d, want 10 (past the parked row)", c[0])
	}
	e.produce(deduped(topic, 0, 10, base.Add(10*time.Second)))
	e.runOnce(topic, e.names.RejectedTopic())
	e.exact(TableEvents, 10)
	if got := e.parkedRecords(); len(got) != 1 || got[0].SourceOffset != 9 {
		t.Fatalf("parked records %+v, want the row at offset 9 once", got)
	}
}

// TestCrashAfterProgress kills the real binary after a window's progress
// row is written and before its offsets are committed: the progress is
// ahead of the committed offsets, which is normal; the restart goes on
// and every row is written once.
func TestCrashAfterProgress(t *testing.T) {
	waitsMostly(t)
	e := newEnv(t, 2)
	topic := e.names.DedupedTopic()
	first, n1 := e.events(100, base)
	e.produce(first...)
	e.runOnce(topic)
	second, n2 := e.events(200, base.Add(time.Hour))
	e.produce(second...)
	p := e.spawn(FaultAfterProgress, e.sinkArgs()...)
	p.ExpectFaultKill(t, FaultAfterProgress, 2*time.Minute)
	committed := e.committed(topic)
	q := fmt.Sprintf("SELECT kafka_partition, toInt64(max(next_offset)) FROM %s.%s WHERE kafka_topic = '%s' GROUP BY kafka_partition", e.db, ProgressTable, topic)
	rows, err := e.conn.Query(ctxT(t, 30*time.Second), q)
	if err != nil {
		t.Fatal(err)
	}
	ahead := 0
	for rows.Next() {
		var p int32
		var progress int64
		if err := rows.Scan(&p, &progress); err != nil {
			t.Fatal(err)
		}
		t.Logf("killed after recording progress: partition %d progress %d, committed %d", p, progress, committed[p])
		if progress > committed[p] {
			ahead++
		}
	}
	rows.Close()
	if ahead == 0 {
		t.Fatal("no partition's progress ahead of its committed offset after the kill")
	}
	p = e.spawn("", e.sinkArgs()...)
	e.waitCaughtUp(2*time.Minute, topic)
	p.Stop(t)
	e.exact(TableEvents, uint64(n1+n2))
}

// TestProgressAdoptsExistingDatabase: a database that held rows before
// sink_progress existed (migration 008 applied to an existing deployment)
// carries the adoption marker: committed offsets without progress are
// accepted, and progress is recorded from then on.
func TestProgressAdoptsExistingDatabase(t *testing.T) {
	e := newEnv(t, 1)
	topic := e.names.DedupedTopic()
	recs, _ := e.events(10, base)
	e.produce(recs...)
	e.runOnce(topic)
	// As before migration 008: no progress table. Then apply it, and the
	// migration that adds from_committed.
	e.exec("DROP TABLE " + e.db + "." + ProgressTable)
	m, _ := progressMigration(t)
	_, fc := fromCommittedMigration(t)
	for _, stmt := range append(m.Statements, fc.Statements...) {
		if err := e.conn.Exec(ctxT(t, time.Minute), stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	if got := e.count(ProgressTable, "kafka_topic = ''"); got != 1 {
		t.Fatalf("%d adoption markers, want 1", got)
	}
	// The first ten events again, then ten more: only the new ones are
	// produced.
	more, total := e.events(20, base)
	e.produce(more[len(recs):]...)
	e.runOnce(topic)
	e.exact(TableEvents, uint64(total))

	if got := e.count(ProgressTable, "kafka_topic = '"+topic+"'"); got == 0 {
		t.Fatal("no progress recorded after the adoption")
	}
}

// TestProgressMigrationOnChdb runs migration 008 on current ClickHouse
// (chdb, 26.x) as on 18.16 (the tests above): on a database created empty
// it leaves no adoption marker, on one whose ledger tables hold rows it
// leaves one, and max(next_offset) reads a partition's progress.
func TestProgressMigrationOnChdb(t *testing.T) {
	python := testenv.Chdb(t)
	last, before := progressMigration(t)
	markers := "SELECT count() FROM " + ProgressTable + " WHERE kafka_topic = ''"
	progress := "INSERT INTO " + ProgressTable + " (consumer_group, kafka_topic, kafka_partition, next_offset, written_at) VALUES " +
		"('g', 't', 0, 10, now()), ('g', 't', 0, 30, now()), ('g', 't', 0, 20, now())"
	read := "SELECT kafka_partition, max(next_offset) FROM " + ProgressTable + " WHERE consumer_group IN ('g', '') AND kafka_topic = 't' GROUP BY kafka_partition"
	row := "INSERT INTO usage_quarantine (kafka_topic, kafka_partition, kafka_offset, kafka_timestamp, kafka_timestamp_ms, reason, detail, raw_key, raw_value, header_keys, header_values) " +
		"VALUES ('t', 0, 5, now(), 0, 'undecodable', '', NULL, NULL, [], [])"
	for _, c := range []struct {
		name  string
		rows  []string
		wantM string
	}{
		{"empty", nil, "0\n"},
		{"existing", []string{row}, "1\n"},
	} {
		stmts := append(append(append([]string{}, before...), c.rows...), last.Statements...)
		stmts = append(stmts, progress)
		resp, err := runChdb(ctxT(t, 5*time.Minute), python, chdbRequest{Path: t.TempDir(), Database: "progress_" + c.name,
			Statements: stmts, Queries: []string{markers, read}})
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Results) != 2 || resp.Results[0] != c.wantM || resp.Results[1] != "0\t30\n" {
			t.Fatalf("%s database on chdb %s: markers %q, progress %q; want %q and \"0\\t30\\n\"", c.name, resp.Version, resp.Results[0], resp.Results[1], c.wantM)
		}
		t.Logf("%s database on chdb %s: %d markers, progress 30", c.name, resp.Version, strings.Count(c.wantM, "1"))
	}
}

// progressMigration returns the migration that creates sink_progress and
// the statements of the migrations before it.
func progressMigration(t *testing.T) (chschema.Migration, []string) {
	t.Helper()
	ms, err := chschema.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	var before []string
	for _, m := range ms {
		if strings.Contains(m.Name, ProgressTable) {
			return m, before
		}
		before = append(before, m.Statements...)
	}
	t.Fatalf("no migration creates %s", ProgressTable)
	return chschema.Migration{}, nil
}

// deleteGroup deletes the env's consumer group (no sink runs), as an
// operator does or as offsets.retention.minutes does to its offsets.
func (e *env) deleteGroup() {
	e.t.Helper()
	resp, err := testenv.Admin(e.t, e.brokers).DeleteGroup(ctxT(e.t, 30*time.Second), e.group)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		e.t.Fatalf("delete group %s: %v", e.group, err)
	}
}

// TestLostGroupOffsets: offsets are never reset silently (docs/design.md,
// The ClickHouse ledger, "Offsets ahead of the tables"). The tables hold
// every row and sink_progress records how far, but the group has no
// committed offsets any more (deleted, or expired after
// offsets.retention.minutes) and the sink parked no row. It stops before
// writing anything, naming each partition, its progress, its log start and
// the repairs; after the documented reset to the earliest offset it reads
// the topic again and the resume rule skips every row it finds: nothing is
// written twice.
func TestLostGroupOffsets(t *testing.T) {
	e := newEnv(t, 4)
	topic := e.names.DedupedTopic()
	recs, n := e.events(500, base)
	e.produce(recs...)
	e.runOnce(topic)
	e.exact(TableEvents, uint64(n))
	e.deleteGroup()
	if c := e.committed(topic); len(c) != 0 {
		t.Fatalf("committed offsets %v after deleting the group, want none", c)
	}
	end := e.endOffset(topic, 0)
	r := e.start(nil)
	e.expectLost(r, topic, 0, end, 0)
	for p := int32(1); p < 4; p++ {
		if want := topic + fmt.Sprintf(" partition %d ", p); !strings.Contains(r.err.Error(), want) {
			t.Errorf("the error does not name %q: %v", want, r.err)
		}
	}
	e.exact(TableEvents, uint64(n))

	e.resetToEarliest(topic)
	r = e.runOnce(topic)
	e.exact(TableEvents, uint64(n))
	if got := metric(t, r.reg, "meterline_sink_rows_total", "table", TableEvents, "outcome", outcomePresent); got != float64(n) {
		t.Errorf("rows skipped as already present = %v, want %d", got, n)
	}
}

// expectLost waits for the sink to stop with ErrOffsetsLost for partition
// p of topic, recorded progress progress and log start start, and checks
// that it names both repairs and not a reset to exactly the progress.
func (e *env) expectLost(r *running, topic string, p int32, progress, start int64) {
	e.t.Helper()
	reset := fmt.Sprintf("--group %s --topic %s:%d --reset-offsets", e.group, topic, p)
	expectStop(e.t, r, ErrOffsetsLost, fmt.Sprintf("group %s has no committed offset for %s partition %d ", e.group, topic, p),
		fmt.Sprintf("records progress %d ", progress), fmt.Sprintf("the partition starts at %d", start),
		reset+" --to-earliest --execute", fmt.Sprintf("from an offset N at or below %d", progress), reset+" --to-offset N --execute")
	if errors.Is(r.err, ErrOffsetsAhead) || errors.Is(r.err, ErrOtherGroup) {
		e.t.Errorf("the error wraps ErrOffsetsAhead or ErrOtherGroup: %v", r.err)
	}
	if s := fmt.Sprintf("--to-offset %d ", progress); strings.Contains(r.err.Error(), s) {
		e.t.Errorf("the error advises %q (a reset to exactly the progress can skip a park aborted with its window): %v", s, r.err)
	}
}

// resetToEarliest sets the group's offset of every partition of topics
// to its log start, as kafka-consumer-groups --reset-offsets
// --to-earliest --execute does while no sink runs.
func (e *env) resetToEarliest(topics ...string) {
	e.t.Helper()
	adm := testenv.Admin(e.t, e.brokers)
	starts, err := adm.ListStartOffsets(ctxT(e.t, 30*time.Second), topics...)
	if err == nil {
		err = starts.Error()
	}
	if err != nil {
		e.t.Fatal(err)
	}
	starts.Each(func(o kadm.ListedOffset) { e.setOffset(o.Topic, o.Partition, o.Offset) })
}

// TestLostGroupOffsetsParkedRow: a row parked is never parked twice
// (docs/design.md, The ClickHouse ledger, "Refused blocks"). A row
// ClickHouse refuses is parked in usage.rejected; then the group's offsets
// are lost. The sink stops; after the documented reset to the earliest
// offset it reads the partition again: the rows in the table are skipped,
// the refused row is refused again and found parked already, and nothing is
// written or parked twice.
func TestLostGroupOffsetsParkedRow(t *testing.T) {
	waitsMostly(t)
	e := newEnv(t, 1)
	topic := e.names.DedupedTopic()
	e.parkOne(topic)

	e.deleteGroup()
	e.expectLost(e.start(nil), topic, 0, 10, 0)
	e.parkedOnce(4, "after the stop")

	e.produce(deduped(topic, 0, 10, base.Add(10*time.Second)))
	e.resetToEarliest(topic, e.names.RejectedTopic())
	r := e.runOnce(topic, e.names.RejectedTopic())
	for outcome, want := range map[string]float64{outcomeParked: 0, outcomeParkedBefore: 1, outcomePresent: 9, outcomeInserted: 1} {
		if got := metric(t, r.reg, "meterline_sink_rows_total", "table", TableEvents, "outcome", outcome); got != want {
			t.Errorf("rows %s on the re-read = %v, want %v", outcome, got, want)
		}
	}
	e.exact(TableEvents, 10)
	e.parkedOnce(4, "after the re-read from the start")
}

// TestLostGroupOffsetsCrashes: docs/design.md, The ClickHouse ledger,
// "Offsets ahead of the tables", and parking, across crashes. Row 4 is
// parked and committed. The sink is then killed after the progress row of
// the window that refused row 14 and before its commit, so row 14's park is
// aborted while the progress (15) is past it; then the group's offsets are
// lost. The sink stops; after the documented reset to the earliest offset,
// row 4 is found parked and row 14 is parked, and the sink is killed again
// between that park and its commit. The next run parks row 14 once: each
// refused row is parked once, every other row is written once.
func TestLostGroupOffsetsCrashes(t *testing.T) {
	waitsMostly(t)
	e := newEnv(t, 1)
	topic := e.names.DedupedTopic()
	e.parkOne(topic)
	e.produce(e.poisonedRange(topic, 10, 20, 14)...)

	p := e.spawn(FaultAfterProgress, e.sinkArgs()...)
	p.ExpectFaultKill(t, FaultAfterProgress, 2*time.Minute)
	if c := e.committed(topic)[0]; c != 10 {
		t.Fatalf("committed offset after the kill = %d, want 10", c)
	}
	if got := e.count(ProgressTable, "kafka_topic = '"+topic+"' AND next_offset = 15 AND from_committed = 1"); got != 1 {
		t.Fatalf("progress rows at 15 from a committed offset after the kill = %d, want 1 (the window cut before its commit)", got)
	}
	e.waitDeleteGroup()
	e.expectLost(e.start(nil), topic, 0, 15, 0)

	e.resetToEarliest(topic, e.names.RejectedTopic())
	p = e.spawn(FaultAfterPark, e.sinkArgs()...)
	p.ExpectFaultKill(t, FaultAfterPark, 2*time.Minute)
	p = e.spawn("", e.sinkArgs()...)
	e.waitCaughtUp(2*time.Minute, topic, e.names.RejectedTopic())
	p.Stop(t)
	e.exact(TableEvents, 18)
	got := e.parkedRecords()
	if len(got) != 2 || got[0].SourceOffset+got[1].SourceOffset != 4+14 || got[0].SourceOffset == got[1].SourceOffset {
		t.Fatalf("parked records %+v, want the rows at offsets 4 and 14 once each", got)
	}
	e.exact(TableRejected, 2)
}

// TestCrashBeforeFirstCommit: a fresh group's sink is killed after the
// progress row of its first window (ClickHouse refused row 4: progress 5)
// and before that window's commit, so the group never committed the
// partition. That is no lost offset: the restart reads the partition from
// its start without stopping, skips the rows in the table, parks row 4
// once and writes every other row once. Once the group committed, its
// offsets lost stop the sink.
func TestCrashBeforeFirstCommit(t *testing.T) {
	waitsMostly(t)
	e := newEnv(t, 1)
	topic := e.names.DedupedTopic()
	e.poisonedKill(topic, 4, FaultAfterProgress)
	if c := e.committed(topic); len(c) != 0 {
		t.Fatalf("committed offsets %v after the kill, want none", c)
	}
	if got := e.count(ProgressTable, "kafka_topic = '"+topic+"' AND from_committed = 0"); got != 1 {
		t.Fatalf("progress rows from no committed offset after the kill = %d, want 1", got)
	}
	if got := e.count(ProgressTable, "kafka_topic = '"+topic+"' AND from_committed = 1"); got != 0 {
		t.Fatalf("progress rows from a committed offset after the kill = %d, want 0", got)
	}
	e.runOnce(topic, e.names.RejectedTopic())
	e.exact(TableEvents, 9)
	e.parkedOnce(4, "after the restart")

	// The group has committed now: offsets lost from here stop the sink.
	e.deleteGroup()
	e.expectLost(e.start(nil), topic, 0, 10, 0)
}

// waitDeleteGroup deletes the group once a killed member's session timed
// out (until then the group is not empty).
func (e *env) waitDeleteGroup() {
	e.t.Helper()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(500 * time.Millisecond) {
		resp, err := testenv.Admin(e.t, e.brokers).DeleteGroup(ctxT(e.t, 30*time.Second), e.group)
		if err == nil {
			err = resp.Err
		}
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("delete group %s: %v", e.group, err)
		}
	}
}

// TestLostGroupOffsetsLogPastProgress: the group's offsets are lost and
// the partition's log now starts at the recorded progress (retention
// deleted every record below it). The sink stops all the same; the reset
// to the earliest offset then reads nothing again.
func TestLostGroupOffsetsLogPastProgress(t *testing.T) {
	waitsMostly(t)
	e := newEnv(t, 1)
	topic := e.names.DedupedTopic()
	e.producePoisoned(topic, 10, 4)
	e.runOnce(topic, e.names.RejectedTopic())
	e.exact(TableEvents, 9)
	e.deleteGroup()

	e.produce(deduped(topic, 0, 10, base.Add(10*time.Second)), deduped(topic, 0, 11, base.Add(11*time.Second)))
	e.deleteRecordsBelow(topic, 0, 10)
	e.expectLost(e.start(nil), topic, 0, 10, 10)
	e.resetToEarliest(topic, e.names.RejectedTopic())
	e.runOnce(topic, e.names.RejectedTopic())
	e.exact(TableEvents, 11)
	e.parkedOnce(4, "after the reset")
}

// parkOne produces ten records to partition 0 of topic, ClickHouse
// refusing the one at offset 4, and runs the sink until it has written
// nine rows and parked that one.
func (e *env) parkOne(topic string) {
	e.t.Helper()
	e.producePoisoned(topic, 10, 4)
	e.runOnce(topic, e.names.RejectedTopic())
	e.exact(TableEvents, 9)
	if got := e.parkedRecords(); len(got) != 1 || got[0].SourceOffset != 4 {
		e.t.Fatalf("parked records %+v, want the row at offset 4 once", got)
	}
}

// producePoisoned makes usage_events refuse rows of customer "poison" and
// produces n records to partition 0 of topic, the one at offset bad of
// that customer.
func (e *env) producePoisoned(topic string, n, bad int) {
	e.t.Helper()
	e.exec("ALTER TABLE " + e.db + ".usage_events ADD COLUMN poison UInt8 MATERIALIZED throwIf(customer_id = 'poison')")
	e.produce(e.poisonedRange(topic, 0, n, bad)...)
}

// poisonedKill produces ten records to partition 0 of topic, ClickHouse
// refusing the one at offset bad, and runs the sink until it kills itself
// at fault point faultSpec.
func (e *env) poisonedKill(topic string, bad int, faultSpec string) {
	e.t.Helper()
	e.producePoisoned(topic, 10, bad)
	p := e.spawn(faultSpec, e.sinkArgs()...)
	p.ExpectFaultKill(e.t, faultSpec, 2*time.Minute)
}

// poisonedRange returns the records at offsets from..to-1 of partition 0 of
// topic, the one at offset bad of customer "poison".
func (e *env) poisonedRange(topic string, from, to, bad int) []*kgo.Record {
	e.t.Helper()
	var recs []*kgo.Record
	for i := from; i < to; i++ {
		recs = append(recs, deduped(topic, 0, i, base.Add(time.Duration(i)*time.Second)))
	}
	var ev schemas.DedupedEvent
	if err := schemas.DecodeInto(recs[bad-from].Value, &ev); err != nil {
		e.t.Fatal(err)
	}
	ev.CustomerID = "poison"
	recs[bad-from].Value = schemas.MustEncode(&ev)
	return recs
}

// TestFirstCommitRecordedOnAssignment: the sink is killed after the
// progress row of a fresh group's first window, and the group's offset
// then stands at that progress (as if the commit had landed and the sink
// died before recording it with from_committed = 1). The next sink
// records it on assignment, with no record to consume: the group's
// offsets lost afterwards stop the sink instead of reading again.
func TestFirstCommitRecordedOnAssignment(t *testing.T) {
	waitsMostly(t)
	e := newEnv(t, 1)
	topic := e.names.DedupedTopic()
	recs, _ := e.events(10, base)
	e.produce(recs...)
	p := e.spawn(FaultAfterProgress, e.sinkArgs()...)
	p.ExpectFaultKill(t, FaultAfterProgress, 2*time.Minute)
	end := e.endOffset(topic, 0)
	if got := e.count(ProgressTable, fmt.Sprintf("kafka_topic = '%s' AND next_offset = %d AND from_committed = 0", topic, end)); got != 1 {
		t.Fatalf("progress rows at %d from no committed offset after the kill = %d, want 1", end, got)
	}
	e.waitDeleteGroup()
	e.setOffset(topic, 0, end)

	r := e.start(nil)
	for deadline := time.Now().Add(time.Minute); e.count(ProgressTable, fmt.Sprintf("kafka_topic = '%s' AND next_offset = %d AND from_committed = 1", topic, end)) == 0; time.Sleep(200 * time.Millisecond) {
		if time.Now().After(deadline) {
			_ = r.stop()
			t.Fatalf("no progress row at %d from a committed offset a minute after the assignment", end)
		}
	}
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	e.deleteGroup()
	e.expectLost(e.start(nil), topic, 0, end, 0)
}
