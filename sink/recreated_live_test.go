package sink

import (
	"fmt"
	"testing"
	"time"
)

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
	var fromNew uint64
	q := fmt.Sprintf("SELECT count() FROM %s.%s WHERE toUInt32OrZero(substring(event_id, 6)) >= 100", e.db, TableEvents)
	if err := e.conn.QueryRow(ctxT(t, 30*time.Second), q).Scan(&fromNew); err != nil {
		t.Fatal(err)
	}
	if fromNew != 0 {
		t.Errorf("%d rows of the new log written into the old log's database", fromNew)
	}
	e.exact(TableEvents, 10)
}
