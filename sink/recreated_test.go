package sink

import (
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/internal/testenv"
)

// recreateTopic deletes topic and creates it again with parts partitions
// (no sink runs): a broker's data wiped, or an operator recreating the
// topics at another partition count. Its offsets start at 0 again and
// the group's committed offsets of it are gone.
func (e *env) recreateTopic(topic string, parts int32) {
	e.t.Helper()
	adm := testenv.Admin(e.t, e.brokers)
	resp, err := adm.DeleteTopics(ctxT(e.t, 30*time.Second), topic)
	if err == nil {
		err = resp.Error()
	}
	if err != nil {
		e.t.Fatalf("delete %s: %v", topic, err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		tds, err := adm.ListTopics(ctxT(e.t, 30*time.Second), topic)
		if err == nil && !tds.Has(topic) {
			break
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("%s still listed 30 s after its deletion (%v)", topic, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	testenv.CreateTopic(e.t, e.brokers, topic, parts, nil)
	// A producer of its own: the env's knows the old topic's ID.
	prod, err := kgo.NewClient(kgo.SeedBrokers(e.brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(prod.Close)
	e.prod = prod
}

// TestRecreatedTopicRefused: the database is a ledger of each input topic
// by (topic, partition, offset), and the resume rule skips a record whose
// coordinates are in a table (docs/design.md, The ClickHouse ledger). A
// topic deleted and created again under its name is another log whose
// offsets start at 0: read into the database of the old one, its records
// at offsets the old log wrote would be skipped as present, and billing
// rows lost without a word. The sink refuses the topic by its topic ID,
// before it uses any record of it, also once the group's offsets of the
// new topic were set to its start as "committed offsets lost" advises.
func TestRecreatedTopicRefused(t *testing.T) {
	e := newEnv(t, 1)
	topic := e.names.DedupedTopic()
	base := time.Date(2026, 5, 4, 0, 0, 0, 0, time.UTC)
	e.produce(tenFrom(topic, 0, base)...)
	e.runOnce(topic)
	e.exact(TableEvents, 10)

	e.recreateTopic(topic, 1)
	e.produce(tenFrom(topic, 100, base)...)
	e.resetToEarliest(topic)
	r := e.start(nil)
	expectStop(t, r, ErrTopicRecreated, topic, e.db, "deleted and created again", "--database")
	t.Logf("refused: %v", r.err)
	e.exact(TableEvents, 10)
	if n := e.count(TableEvents); n != 10 {
		t.Fatalf("%d rows, want the old log's 10", n)
	}
	var fromNew uint64
	q := fmt.Sprintf("SELECT count() FROM %s.%s WHERE event_id LIKE 'ev-0-1__'", e.db, TableEvents)
	if err := e.conn.QueryRow(ctxT(t, 30*time.Second), q).Scan(&fromNew); err != nil {
		t.Fatal(err)
	}
	if fromNew != 0 {
		t.Errorf("%d rows of the new log written into the old log's database", fromNew)
	}

	// Into a database of its own, the new log is written whole.
	conn, db := testenv.ClickHouseDB(t)
	if _, err := Migrate(ctxT(t, time.Minute), conn); err != nil {
		t.Fatal(err)
	}
	e.conn, e.db = conn, db
	r = e.start(nil)
	e.waitCaughtUp(time.Minute, topic)
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	e.exact(TableEvents, 10)
}

// TestRecreatedTopicUnderRunningSink: a topic deleted and created again
// while the sink runs is another log whose offsets start at 0 again
// (TestRecreatedTopicRefused). None of its records is written into the
// database of the old log, and the sink does not stay up as if nothing
// happened: it stops with ErrTopicRecreated.
func TestRecreatedTopicUnderRunningSink(t *testing.T) {
	e := newEnv(t, 1)
	topic := e.names.DedupedTopic()
	start := time.Date(2026, 5, 4, 0, 0, 0, 0, time.UTC)
	e.produce(tenFrom(topic, 0, start)...)
	r := e.start(nil)
	e.waitCaughtUp(time.Minute, topic)
	e.exact(TableEvents, 10)

	e.recreateTopic(topic, 1)
	// Thirty records: the new log reaches past the old one's end.
	for i := 100; i < 130; i += 10 {
		e.produce(tenFrom(topic, i, start)...)
	}
	expectStop(t, r, ErrTopicRecreated, topic, e.db, "deleted and created again")
	if n := e.count(TableEvents, "toUInt32OrZero(substring(event_id, 6)) >= 100"); n != 0 {
		t.Errorf("%d rows of the new log written into the old log's database", n)
	}
	e.exact(TableEvents, 10)
}

// TestTopicIDsOnChdb: the table of topic IDs and the sink's query of it
// on current ClickHouse (chdb, 26.x): a topic recorded twice by two
// instances reads once, and only the topics asked for.
func TestTopicIDsOnChdb(t *testing.T) {
	python := testenv.Chdb(t)
	const db = "topic_ids"
	stmts := append(migrationStatements(t),
		"INSERT INTO "+TopicIDsTable+" (kafka_topic, topic_id, recorded_at) VALUES ('a', 'id1', now()), ('a', 'id1', now()), ('b', 'id2', now()), ('c', 'id3', now())")
	resp, err := runChdb(ctxT(t, 5*time.Minute), python, chdbRequest{Path: t.TempDir(), Database: db, Statements: stmts,
		Queries: []string{topicIDsQuery(db, []string{"a", "b"})}})
	if err != nil {
		t.Fatal(err)
	}
	if want := "a\tid1\nb\tid2\n"; len(resp.Results) != 1 || resp.Results[0] != want {
		t.Fatalf("on chdb %s: %q, want %q", resp.Version, resp.Results, want)
	}
}
