package sink

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/ClickHouse/clickhouse-go/v2/lib/proto"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap/zaptest"

	"github.com/meterline/meterline/internal/kafka"
	"github.com/meterline/meterline/internal/session"
	"github.com/meterline/meterline/internal/testenv"
)

// instanceOn is a Writer of another instance on the database db of
// offlineWriter, never run, with its metrics in reg.
func instanceOn(t *testing.T, conn driver.Conn, db, instance string, mod func(*Config)) (*Writer, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	cfg := Config{Config: session.Config{Kafka: kafka.Config{Brokers: []string{"unused:9092"}}, InstanceID: instance},
		Topics: testTopics(), Conn: conn, Database: db, Logger: zaptest.NewLogger(t), Registerer: reg}
	if mod != nil {
		mod(&cfg)
	}
	w, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return w, reg
}

// slowEventRows makes every row of usage_events take 0.1 s to write on
// the server and returns n rows of usage.deduped partition p at offsets
// 0…n-1, built by w.
func slowEventRows(t *testing.T, w *Writer, conn driver.Conn, db string, p int32, n int) []*row {
	t.Helper()
	if conn != nil {
		if err := conn.Exec(ctxT(t, time.Minute), "ALTER TABLE "+db+"."+TableEvents+" ADD COLUMN slow UInt8 MATERIALIZED sleepEachRow(0.1)"); err != nil {
			t.Fatal(err)
		}
	}
	topic := testTopics().DedupedTopic()
	var rows []*row
	for i := 0; i < n; i++ {
		rec := deduped(topic, p, i, base.Add(time.Duration(i)*time.Second))
		rec.Offset = int64(i)
		r, err := w.byTopic[topic].buildRow(rec)
		if err != nil {
			t.Fatal(err)
		}
		rows = append(rows, r)
	}
	return rows
}

// insertRunning waits until the server runs an INSERT into db's
// usage_events (found by its text, whatever its query_id).
func insertRunning(t *testing.T, conn driver.Conn, db string) string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		got := queryStrings(t, conn, "SELECT query_id FROM system.processes WHERE query LIKE "+quote("INSERT INTO "+db+"."+TableEvents+"%"))
		if len(got) > 0 {
			return got[0][0]
		}
		if time.Now().After(deadline) {
			t.Fatal("the zombie's INSERT is not running on the server after 30 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// insertsEnded waits until the server runs no INSERT into db's
// usage_events (found as insertRunning finds them), failing the test
// after d.
func insertsEnded(t *testing.T, conn driver.Conn, db string, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		got := queryStrings(t, conn, "SELECT query_id FROM system.processes WHERE query LIKE "+quote("INSERT INTO "+db+"."+TableEvents+"%"))
		if len(got) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("INSERTs into %s.%s still running on the server after %s: %v", db, TableEvents, d, got)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// assign gives w partition p of the deduped topic at committed offset
// committed, as the group's assignment does (every partition assigned
// starts dirty).
func assign(t *testing.T, w *Writer, p int32, committed int64) {
	t.Helper()
	offs := map[string]map[int32]kgo.Offset{testTopics().DedupedTopic(): {p: kgo.NewOffset().At(committed)}}
	if _, err := w.adjustOffsets(context.Background(), offs); err != nil {
		t.Fatal(err)
	}
}

// TestZombieInsertBeforeResume: a zombie sink (it lost partition 0, to a
// rebalance or a pause, but has an INSERT of its rows in flight) is still
// writing when the new owner resumes the partition. The new owner's resume
// lookup must not run before the zombie's INSERT ended on the server:
// otherwise it finds none of the rows, writes them again, and plain
// count() and the daily rollup count them twice.
func TestZombieInsertBeforeResume(t *testing.T) {
	zombie, conn, db, ctx := offlineWriter(t, "zombie")
	owner, reg := instanceOn(t, conn, db, "owner", nil)
	zrows := slowEventRows(t, zombie, conn, db, 0, 20) // 2 s on the server
	orows := slowEventRows(t, owner, nil, db, 0, 20)
	et := owner.byTopic[testTopics().DedupedTopic()]

	zdone := make(chan error, 1)
	go func() { zdone <- zombie.insert(ctx, zombie.byTopic[et.topic], zrows) }()
	id := insertRunning(t, conn, db)
	t.Logf("the zombie's INSERT runs on the server: query_id %s", id)

	assign(t, owner, 0, 0)
	start := time.Now()
	if _, err := owner.writeTable(ctx, et, orows, nil); err != nil {
		t.Fatalf("the new owner's write: %v", err)
	}
	t.Logf("the new owner's write took %s", time.Since(start).Round(time.Millisecond))
	if err := <-zdone; err != nil {
		t.Fatalf("the zombie's INSERT: %v", err)
	}
	if got := render(queryStrings(t, conn, "SELECT count(), uniqExact(kafka_partition, kafka_offset) FROM "+db+"."+TableEvents)); got != "20 | 20\n" {
		t.Errorf("usage_events: count(), distinct (partition, offset) = %s; want 20 | 20 (the zombie's rows written again by the new owner)", strings.TrimSpace(got))
	}
	if got := render(queryStrings(t, conn, "SELECT sum(events) FROM "+db+"."+TableUsageDaily)); got != "20\n" {
		t.Errorf("usage_daily counts %s events, want 20", strings.TrimSpace(got))
	}
	if got := metric(t, reg, "meterline_sink_rows_total", "table", TableEvents, "outcome", outcomePresent); got != 20 {
		t.Errorf("the new owner skipped %v rows as already present, want 20", got)
	}
	if got := metric(t, reg, "meterline_sink_insert_waits_total", "table", TableEvents, "outcome", waitEnded); got != 1 {
		t.Errorf("insert waits that ended: %v, want 1", got)
	}
}

// TestZombieInsertOutlivesTheWait: a zombie's INSERT that still runs when
// the new owner's wait ends (a tenth of the zombie's 2 s here) fails the
// resume lookup, naming the query_id, counted as still_running; nothing is
// looked up or written meanwhile. Retried once the INSERT ended, the lookup
// finds every row.
func TestZombieInsertOutlivesTheWait(t *testing.T) {
	zombie, conn, db, ctx := offlineWriter(t, "zombie")
	owner, reg := instanceOn(t, conn, db, "owner", func(c *Config) { c.InsertTimeout = 200 * time.Millisecond })
	zrows := slowEventRows(t, zombie, conn, db, 3, 20)
	orows := slowEventRows(t, owner, nil, db, 3, 20)
	et := owner.byTopic[testTopics().DedupedTopic()]

	zdone := make(chan error, 1)
	go func() { zdone <- zombie.insert(ctx, zombie.byTopic[et.topic], zrows) }()
	id := insertRunning(t, conn, db)
	assign(t, owner, 3, 0)
	start := time.Now()
	todo, err := owner.filterPresent(ctx, et, orows)
	waited := time.Since(start)
	if err == nil || !strings.Contains(err.Error(), "still runs on the server") || !strings.Contains(err.Error(), id) {
		t.Fatalf("resume lookup while the zombie's INSERT %s runs past the wait: %d rows, %v; want an error naming it", id, len(todo), err)
	}
	t.Logf("after %s: %v", waited.Round(time.Millisecond), err)
	if waited > time.Second {
		t.Errorf("the wait took %s; its bound is the insert timeout, %s", waited, owner.cfg.InsertTimeout)
	}
	if got := metric(t, reg, "meterline_sink_insert_waits_total", "table", TableEvents, "outcome", waitStillRunning); got != 1 {
		t.Errorf("insert waits still running at the bound: %v, want 1", got)
	}
	if got := metric(t, reg, "meterline_sink_resume_lookup_seconds", "table", TableEvents); got != 0 {
		t.Errorf("%v resume lookups ran while the zombie's INSERT did", got)
	}
	if err := <-zdone; err != nil {
		t.Fatalf("the zombie's INSERT: %v", err)
	}
	todo, err = owner.filterPresent(ctx, et, orows)
	if err != nil || len(todo) != 0 {
		t.Fatalf("resume lookup after the zombie's INSERT ended: %d rows to write, %v; want none (all present)", len(todo), err)
	}
}

// TestInsertIDNamesPartitions: an INSERT's query_id is unique and names
// its database, topic and partitions, so that another instance finds it by
// prefix and partition (awaitInserts), and no other partition's or
// topic's.
func TestInsertIDNamesPartitions(t *testing.T) {
	w, err := New(Config{Config: session.Config{Kafka: kafka.Config{Brokers: []string{"unused:9092"}}, InstanceID: "i/1"},
		Topics: testTopics(), ClickHouse: "unused:9000", Database: "meter_line"})
	if err != nil {
		t.Fatal(err)
	}
	topic := testTopics().DedupedTopic()
	spans := map[int32][2]int64{12: {5, 9}, 0: {1, 1}, 3: {7, 8}}
	a, b := w.newInsertID(topic, spans), w.newInsertID(topic, spans)
	if a == b {
		t.Fatalf("two INSERTs share the query_id %s", a)
	}
	prefix := insertIDPrefix("meter_line", topic)
	if !strings.HasPrefix(a, prefix+"0,3,12/i/1/") {
		t.Fatalf("query_id %s; want it to begin %s0,3,12/i/1/", a, prefix)
	}
	for p, want := range map[int32]bool{0: true, 3: true, 12: true, 1: false, 2: false, 4: false} {
		if got := namesPartition(a, prefix, map[int32]bool{p: true}); got != want {
			t.Errorf("query_id %s names partition %d: %v, want %v", a, p, got, want)
		}
	}
	for _, other := range []string{insertIDPrefix("meter_line", topic+".x"), insertIDPrefix("meter_lin", topic), insertIDPrefix("meter_line2", topic)} {
		if strings.HasPrefix(a, other) {
			t.Errorf("query_id %s begins with %s, another database's or topic's prefix", a, other)
		}
	}
}

// TestInsertIDManyPartitionsNamesOnlyThem: an INSERT of many partitions
// (an instance that owns a hundred of them writes each batch of all of
// them in one INSERT) still names only its own, in a short query_id, so
// that another instance's resume lookup of a partition it does not write
// never waits for it: those INSERTs follow each other all the time, and a
// lookup that waited for them could wait until its bound again and again.
func TestInsertIDManyPartitionsNamesOnlyThem(t *testing.T) {
	w, err := New(Config{Config: session.Config{Kafka: kafka.Config{Brokers: []string{"unused:9092"}}, InstanceID: "i1"},
		Topics: testTopics(), ClickHouse: "unused:9000", Database: "meterline"})
	if err != nil {
		t.Fatal(err)
	}
	topic := testTopics().DedupedTopic()
	prefix := insertIDPrefix("meterline", topic)
	for _, c := range []struct {
		name  string
		parts func(p int32) bool // which of 0…999 the INSERT has rows of
	}{
		{"contiguous 0-99", func(p int32) bool { return p < 100 }},
		{"every other of 0-399", func(p int32) bool { return p < 400 && p%2 == 0 }},
		{"0-49 and 300-349", func(p int32) bool { return p < 50 || (p >= 300 && p < 350) }},
		{"every third of 0-599", func(p int32) bool { return p < 600 && p%3 == 0 }},
	} {
		spans := map[int32][2]int64{}
		for p := int32(0); p < 1000; p++ {
			if c.parts(p) {
				spans[p] = [2]int64{0, 0}
			}
		}
		id := w.newInsertID(topic, spans)
		if len(id) > len(prefix)+maxIDPartitions+40 {
			t.Errorf("%s: query_id of %d bytes: %s", c.name, len(id), id)
		}
		for p := int32(0); p < 1000; p++ {
			if got := namesPartition(id, prefix, map[int32]bool{p: true}); got != c.parts(p) {
				t.Fatalf("%s: query_id %s names partition %d: %v, want %v", c.name, id, p, got, c.parts(p))
			}
		}
	}
	// Past what a bitmap of maxIDPartitions bytes holds, and a list the
	// sink cannot read: every partition.
	spans := map[int32][2]int64{}
	for p := int32(0); p < 2000; p += 2 {
		spans[p] = [2]int64{0, 0}
	}
	if id := w.newInsertID(topic, spans); !namesPartition(id, prefix, map[int32]bool{1: true}) || len(id) > len(prefix)+40 {
		t.Errorf("an INSERT of every other of 2,000 partitions: query_id %s; want a short one naming every partition", id)
	}
	for _, list := range []string{"1-x", "x1g", "a", "", "3-"} {
		if !namesPartition(prefix+list+"/i1/1/1", prefix, map[int32]bool{7: true}) {
			t.Errorf("partition list %q taken to name none of 7", list)
		}
	}
}

// TestInsertOfOtherPartitionsNotWaitedFor: another instance's INSERT of
// a hundred partitions, running on the server, does not hold the resume
// lookup of a partition it has no rows of.
func TestInsertOfOtherPartitionsNotWaitedFor(t *testing.T) {
	other, conn, db, ctx := offlineWriter(t, "other")
	owner, reg := instanceOn(t, conn, db, "owner", nil)
	if err := conn.Exec(ctxT(t, time.Minute), "ALTER TABLE "+db+"."+TableEvents+" ADD COLUMN slow UInt8 MATERIALIZED sleepEachRow(0.03)"); err != nil {
		t.Fatal(err)
	}
	topic := testTopics().DedupedTopic()
	build := func(w *Writer, p int32, off int) *row {
		rec := deduped(topic, p, off, base.Add(time.Duration(off)*time.Second))
		rec.Offset = int64(off)
		r, err := w.byTopic[topic].buildRow(rec)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	var orows, mine []*row
	for p := int32(0); p < 100; p++ {
		orows = append(orows, build(other, p, 0)) // 3 s on the server
	}
	for i := 0; i < 5; i++ {
		mine = append(mine, build(owner, 100, i))
	}
	odone := make(chan error, 1)
	go func() { odone <- other.insert(ctx, other.byTopic[topic], orows) }()
	id := insertRunning(t, conn, db)
	assign(t, owner, 100, 0)
	start := time.Now()
	todo, err := owner.filterPresent(ctx, owner.byTopic[topic], mine)
	took := time.Since(start)
	if err != nil || len(todo) != len(mine) {
		t.Fatalf("resume lookup of partition 100: %d rows to write, %v; want all %d", len(todo), err, len(mine))
	}
	if got := metric(t, reg, "meterline_sink_insert_waits_total"); got != 0 {
		t.Fatalf("the lookup of partition 100 waited %s for the INSERT %s of partitions 0-99 (%v waits)", took.Round(time.Millisecond), id, got)
	}
	select {
	case <-odone:
		t.Fatalf("the other instance's INSERT %s ended before the lookup did: the test shows nothing", id)
	default:
	}
	if err := <-odone; err != nil {
		t.Fatal(err)
	}
}

// TestInsertWaitSQLTwoVersions: the queries of the wait for INSERTs of
// other instances run on ClickHouse 18.16 and on chdb (26.x) alike, and
// the prefix condition picks the same query_ids on both: those of the
// database and topic, no other's.
func TestInsertWaitSQLTwoVersions(t *testing.T) {
	python := testenv.Chdb(t)
	conn, db := testenv.ClickHouseDB(t)
	ctx := ctxT(t, 2*time.Minute)
	topic := testTopics().DedupedTopic()
	prefix := insertIDPrefix("meter_line", topic)
	var ids []string
	for _, id := range []string{
		prefix + "0,3/i1/1/1", prefix + "*/i2/1/2",
		insertIDPrefix("meterXline", topic) + "0/i1/1/3", insertIDPrefix("meter_line", topic+"x") + "0/i1/1/4",
		insertIDPrefix("meter_line2", topic) + "0/i1/1/5", "meterline-sink-i1-1-6",
	} {
		ids = append(ids, quote(id))
	}
	queries := []string{
		processesQuery(idHasPrefix(prefix)),
		"SELECT query_id FROM (SELECT arrayJoin([" + strings.Join(ids, ", ") + "]) AS query_id) WHERE " + idHasPrefix(prefix) + " ORDER BY query_id",
	}
	ch, err := runChdb(ctx, python, chdbRequest{Path: t.TempDir(), Database: db, Statements: []string{}, Queries: queries})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"", prefix + "*/i2/1/2\n" + prefix + "0,3/i1/1/1\n"}
	for i, q := range queries {
		got, err := tsv(ctx, conn, q)
		if err != nil {
			t.Fatalf("18.16: %v\n%s", err, q)
		}
		if got != want[i] || ch.Results[i] != want[i] {
			t.Errorf("%s\n18.16: %q\n%s: %q\nwant %q", q, got, ch.Version, ch.Results[i], want[i])
		}
	}
}

// TestZombieInsertHoldsTheResume: on a real broker, a running sink that is
// assigned a partition while a zombie's INSERT of its rows is held open
// on the server for 3 s (well past the sink's wait, its 500 ms insert
// timeout) backs off, /readyz naming the zombie's query_id, and writes
// nothing of the partition until the INSERT has ended; then it skips every
// row the zombie wrote.
func TestZombieInsertHoldsTheResume(t *testing.T) {
	e := newEnv(t, 1)
	var recs []*kgo.Record
	for i := 0; i < 20; i++ {
		recs = append(recs, deduped(e.names.DedupedTopic(), 0, i, base.Add(time.Duration(i)*time.Second)))
	}
	e.produce(recs...)
	zombie, _ := instanceOn(t, e.conn, e.db, "zombie", func(c *Config) { c.Topics = e.names })
	zt := zombie.byTopic[e.names.DedupedTopic()]
	var zrows []*row
	for i, rec := range recs {
		rec.Offset = int64(i)
		r, err := zt.buildRow(rec)
		if err != nil {
			t.Fatal(err)
		}
		zrows = append(zrows, r)
	}
	ctx := ctxT(t, 2*time.Minute)
	id := zombie.newInsertID(zt.topic, spansOf(zrows))
	b, err := e.conn.PrepareBatch(clickhouse.Context(ctx, clickhouse.WithQueryID(id)), zt.insertSQL(e.db))
	if err != nil {
		t.Fatal(err)
	}
	for j, c := range zt.columns {
		if err := b.Column(j).Append(c.slice(zrows)); err != nil {
			t.Fatal(err)
		}
	}
	zdone := make(chan error, 1)
	go func() {
		time.Sleep(3 * time.Second)
		zdone <- b.Send()
	}()
	insertRunning(t, e.conn, e.db)

	r := e.start(func(c *Config) { c.InsertTimeout = 500 * time.Millisecond })
	deadline := time.Now().Add(2500 * time.Millisecond)
	for err := r.w.Ready(); err == nil || !strings.Contains(err.Error(), id); err = r.w.Ready() {
		if time.Now().After(deadline) {
			t.Fatalf("/readyz does not name the zombie's INSERT while it runs: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("while the zombie's INSERT runs, Ready() = %v", r.w.Ready())
	if n := e.count(TableEvents); n != 0 {
		t.Fatalf("%d rows in usage_events while the zombie's INSERT runs; want none", n)
	}
	if err := <-zdone; err != nil {
		t.Fatalf("the zombie's INSERT: %v", err)
	}
	e.waitCaughtUp(time.Minute, e.names.DedupedTopic())
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	e.exact(TableEvents, 20)
	if got := metric(t, r.reg, "meterline_sink_insert_waits_total", "table", TableEvents, "outcome", waitStillRunning); got < 1 {
		t.Errorf("insert waits still running at the bound: %v, want at least 1", got)
	}
	if got := metric(t, r.reg, "meterline_sink_rows_total", "table", TableEvents, "outcome", outcomePresent); got != 20 {
		t.Errorf("the sink skipped %v rows as already present, want 20", got)
	}
}

// processesBusy is a ClickHouse connection whose first reads of
// system.processes the server answers as an overloaded one does (code
// 202, TOO_MANY_SIMULTANEOUS_QUERIES).
type processesBusy struct {
	driver.Conn
	busy atomic.Int32
}

func (c *processesBusy) Query(ctx context.Context, q string, args ...any) (driver.Rows, error) {
	if strings.HasPrefix(q, processesQuery("")) && c.busy.Add(-1) >= 0 {
		return nil, &proto.Exception{Code: 202, Name: "DB::Exception", Message: "Too many simultaneous queries. Maximum: 100"}
	}
	return c.Conn.Query(ctx, q, args...)
}

// TestZombieInsertWaitOnBusyServer: the new owner's read of
// system.processes is answered with an error of an overloaded server, not
// a refusal to let the sink's user read it. It says nothing of the
// zombie's INSERT: the owner asks again (it used to give up the wait, as
// for a user that may not read the table, and write the zombie's rows a
// second time).
func TestZombieInsertWaitOnBusyServer(t *testing.T) {
	zombie, conn, db, ctx := offlineWriter(t, "zombie")
	busy := &processesBusy{Conn: conn}
	busy.busy.Store(1)
	owner, _ := instanceOn(t, busy, db, "owner", func(c *Config) { c.BackoffMin, c.BackoffMax = 50*time.Millisecond, 100*time.Millisecond })
	owner.paused.Store(true)                           // no Kafka session whose fetching a back-off would pause
	zrows := slowEventRows(t, zombie, conn, db, 0, 20) // 2 s on the server
	orows := slowEventRows(t, owner, nil, db, 0, 20)
	et := owner.byTopic[testTopics().DedupedTopic()]

	zdone := make(chan error, 1)
	go func() { zdone <- zombie.insert(ctx, zombie.byTopic[et.topic], zrows) }()
	insertRunning(t, conn, db)
	assign(t, owner, 0, 0)
	if _, err := owner.writeTable(ctx, et, orows, nil); err != nil {
		t.Fatalf("the new owner's write: %v", err)
	}
	if err := <-zdone; err != nil {
		t.Fatalf("the zombie's INSERT: %v", err)
	}
	if got := render(queryStrings(t, conn, "SELECT count(), uniqExact(kafka_partition, kafka_offset) FROM "+db+"."+TableEvents)); got != "20 | 20\n" {
		t.Errorf("usage_events: count(), distinct (partition, offset) = %s; want 20 | 20 (the zombie's rows written again by the new owner)", strings.TrimSpace(got))
	}
}
