package sink

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/internal/testenv"
	chschema "github.com/meterline/meterline/schemas/clickhouse"
)

func (e *env) acceptConfig() AcceptOffsetsConfig {
	return AcceptOffsetsConfig{Conn: e.conn, Database: e.db, Group: e.group, Admin: testenv.Admin(e.t, e.brokers),
		Topics: e.allTopics(), By: "test"}
}

// TestAcceptOffsets: a skip on purpose (docs/design.md, The ClickHouse
// ledger, "Offsets ahead of the tables"). Partition 0's committed offset is
// moved ten records past its progress, partition 1's five records past its
// start, with no progress. The sink stops, naming `meterline sink
// accept-offsets` besides the reset; the command refuses while a sink of
// the group runs, then records both offsets as progress, with one audit row
// each in sink_offset_skips (from, to, whether there was progress), and
// leaves the other topics alone. The sink then starts and the skipped
// records are in no table.
func TestAcceptOffsets(t *testing.T) {
	e := newEnv(t, 2)
	topic := e.names.DedupedTopic()
	var first, second, third []*kgo.Record
	for i := 0; i < 10; i++ {
		first = append(first, deduped(topic, 0, i, base.Add(time.Duration(i)*time.Second)))
		second = append(second, deduped(topic, 0, 10+i, base.Add(time.Duration(10+i)*time.Second)))
	}
	for i := 0; i < 5; i++ {
		third = append(third, deduped(topic, 1, i, base.Add(time.Duration(i)*time.Second)))
	}
	e.produce(first...)
	r := e.start(nil)
	e.waitCaughtUp(time.Minute, topic)
	if _, err := AcceptOffsets(ctxT(t, time.Minute), e.acceptConfig()); !errors.Is(err, ErrSinkRunning) {
		t.Fatalf("accept offsets while a sink runs: %v, want %v", err, ErrSinkRunning)
	}
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	e.exact(TableEvents, 10)

	e.produce(second...)
	e.produce(third...)
	e.setOffset(topic, 0, 20)
	e.setOffset(topic, 1, 5)
	expectRefusal(t, e.start(nil), "--reset-offsets --to-offset 10 --execute",
		fmt.Sprintf("meterline sink accept-offsets --group %s --database %s --topic %s --partition 0", e.group, e.db, topic),
		fmt.Sprintf("meterline sink accept-offsets --group %s --database %s --topic %s --partition 1", e.group, e.db, topic))

	got, err := AcceptOffsets(ctxT(t, time.Minute), e.acceptConfig())
	if err != nil {
		t.Fatal(err)
	}
	want := []AcceptedOffset{
		{Topic: topic, Partition: 0, From: 10, To: 20, HadProgress: true},
		{Topic: topic, Partition: 1, From: 0, To: 5},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("accepted %+v, want %+v", got, want)
	}
	var rows []string
	q := "SELECT consumer_group, kafka_topic, kafka_partition, from_offset, to_offset, had_progress, accepted_by FROM " +
		e.db + "." + SkipsTable + " ORDER BY kafka_partition"
	res, err := e.conn.Query(ctxT(t, 30*time.Second), q)
	if err != nil {
		t.Fatal(err)
	}
	for res.Next() {
		var g, tpc, by string
		var p int32
		var from, to uint64
		var had uint8
		if err := res.Scan(&g, &tpc, &p, &from, &to, &had, &by); err != nil {
			t.Fatal(err)
		}
		rows = append(rows, fmt.Sprintf("%s %s %d %d..%d %d %s", g, tpc, p, from, to, had, by))
	}
	res.Close()
	wantRows := []string{
		fmt.Sprintf("%s %s 0 10..20 1 test", e.group, topic),
		fmt.Sprintf("%s %s 1 0..5 0 test", e.group, topic),
	}
	if fmt.Sprint(rows) != fmt.Sprint(wantRows) {
		t.Fatalf("%s holds %q, want %q", SkipsTable, rows, wantRows)
	}

	// Nothing is ahead any more: a second run accepts nothing.
	if again, err := AcceptOffsets(ctxT(t, time.Minute), e.acceptConfig()); err != nil || len(again) != 0 {
		t.Fatalf("accept offsets again: %+v, %v; want nothing", again, err)
	}
	e.produce(deduped(topic, 0, 20, base.Add(20*time.Second)))
	e.runOnce(topic)
	e.exact(TableEvents, 11)
	if n := e.count(TableEvents, "kafka_offset >= 10 AND kafka_offset < 20 OR kafka_partition = 1"); n != 0 {
		t.Fatalf("%d rows of the skipped records in %s", n, TableEvents)
	}
}

// TestAcceptOffsetsNamedPartition: with --topic and --partition only that
// partition is accepted; one without a committed offset is refused.
func TestAcceptOffsetsNamedPartition(t *testing.T) {
	e := newEnv(t, 2)
	topic := e.names.DedupedTopic()
	var recs []*kgo.Record
	for p := int32(0); p < 2; p++ {
		for i := 0; i < 5; i++ {
			recs = append(recs, deduped(topic, p, i, base.Add(time.Duration(i)*time.Second)))
		}
	}
	e.produce(recs...)
	e.setOffset(topic, 0, 5)
	e.setOffset(topic, 1, 5)
	cfg := e.acceptConfig()
	cfg.Topic, cfg.Partitions = topic, []int32{1}
	got, err := AcceptOffsets(ctxT(t, time.Minute), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Partition != 1 || got[0].From != 0 || got[0].To != 5 {
		t.Fatalf("accepted %+v, want partition 1, 0..5", got)
	}
	expectRefusal(t, e.start(nil), topic+" partition 0", "committed offset 5")

	cfg.Topic, cfg.Partitions = e.names.AggregatesTopic(), []int32{0}
	if _, err := AcceptOffsets(ctxT(t, time.Minute), cfg); err == nil {
		t.Fatal("accepted a partition without a committed offset")
	}
}

// TestOffsetSkipsOnChdb runs the migrations on current
// ClickHouse (chdb, 26.x) as on 18.16 (the tests above), writes an audit
// row as AcceptOffsets does, and reads the progress of every group with
// the sink's query.
func TestOffsetSkipsOnChdb(t *testing.T) {
	python := testenv.Chdb(t)
	stmts := migrationStatements(t)
	const db = "offset_skips"
	stmts = append(stmts,
		"INSERT INTO "+SkipsTable+" (consumer_group, kafka_topic, kafka_partition, from_offset, to_offset, had_progress, progress_group, accepted_at, accepted_by) VALUES ('g', 't', 3, 10, 20, 1, 'h', now(), 'me@host')",
		"INSERT INTO "+ProgressTable+" (consumer_group, kafka_topic, kafka_partition, next_offset, written_at) VALUES "+
			"('g', 't', 3, 10, now()), ('g', 't', 3, 20, now()), ('h', 't', 3, 30, now())")
	resp, err := runChdb(ctxT(t, 5*time.Minute), python, chdbRequest{Path: t.TempDir(), Database: db, Statements: stmts,
		Queries: []string{"SELECT kafka_partition, from_offset, to_offset, had_progress, progress_group, accepted_by FROM " + SkipsTable, progressQuery(db)}})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"3\t10\t20\t1\th\tme@host\n", "g\tt\t3\t20\t1\nh\tt\t3\t30\t1\n"}
	if fmt.Sprint(resp.Results) != fmt.Sprint(want) {
		t.Fatalf("on chdb %s: %q, want %q", resp.Version, resp.Results, want)
	}
	t.Logf("chdb %s: %q", resp.Version, resp.Results)
}

// migrationStatements returns the statements of every migration, in
// order.
func migrationStatements(t *testing.T) []string {
	t.Helper()
	ms, err := chschema.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	var stmts []string
	for _, m := range ms {
		stmts = append(stmts, m.Statements...)
	}
	return stmts
}

// TestAcceptOffsetsOtherGroupProgress: the database's progress of the
// partition was recorded by another group (the sink ran under an old
// group name). The new group's committed offset is compared with it: two
// records past it, the sink stops naming the old group, and the audit
// row of the acceptance names it too.
func TestAcceptOffsetsOtherGroupProgress(t *testing.T) {
	e := newEnv(t, 1)
	topic := e.names.DedupedTopic()
	var recs []*kgo.Record
	for i := 0; i < 15; i++ {
		recs = append(recs, deduped(topic, 0, i, base.Add(time.Duration(i)*time.Second)))
	}
	e.produce(recs[:10]...)
	e.runOnce(topic)
	e.produce(recs[10:]...)
	old := e.group
	e.group = testenv.Name(t, "sink-renamed")
	e.setOffset(topic, 0, 12)
	expectRefusal(t, e.start(nil), "committed offset 12", "below offset 10", "recorded by group "+old)

	got, err := AcceptOffsets(ctxT(t, time.Minute), e.acceptConfig())
	if err != nil {
		t.Fatal(err)
	}
	want := []AcceptedOffset{{Topic: topic, Partition: 0, From: 10, To: 12, HadProgress: true, RecordedBy: old}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("accepted %+v, want %+v", got, want)
	}
	if n := e.count(SkipsTable, fmt.Sprintf("progress_group = '%s' AND from_offset = 10 AND to_offset = 12", old)); n != 1 {
		t.Fatalf("%d audit rows naming group %s, want 1", n, old)
	}
	e.runOnce(topic)
	e.exact(TableEvents, 13)
}
