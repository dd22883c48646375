package sink

import (
	"fmt"
	"testing"
	"time"

	"github.com/meterline/meterline/internal/testenv"
)

// TestNewGroupOnExistingDatabase: the sink of a database that holds rows
// and a parked row is started under a new group name. Left alone it would
// read the topic again from the start and park the refused row in
// usage.rejected a second time (docs/design.md, The ClickHouse ledger). It
// stops instead, naming the group that recorded the progress and the
// command; once the new group's offset is set to that progress it goes on,
// and the row is parked once.
func TestNewGroupOnExistingDatabase(t *testing.T) {
	e := newEnv(t, 1)
	topic := e.names.DedupedTopic()
	e.parkOne(topic)

	old := e.group
	e.group = testenv.Name(t, "sink-renamed")
	r := e.start(nil)
	expectStop(t, r, ErrOtherGroup, "group "+e.group+" has no committed offset and no progress for "+topic+" partition 0",
		"group "+old+" recorded progress 10", "--group "+e.group+" --topic "+topic+":0 --reset-offsets --to-offset 10 --execute",
		"--group "+old)
	if got := e.parkedRecords(); len(got) != 1 {
		t.Fatalf("parked records %+v after the stop, want the row at offset 4 once", got)
	}
	// The rejected topic too holds records below old's progress: set
	// both as the error says, for each partition it names.
	e.setOffset(topic, 0, 10)
	e.setOffset(e.names.RejectedTopic(), 0, e.committedOf(old, e.names.RejectedTopic())[0])
	e.produce(deduped(topic, 0, 10, base.Add(10*time.Second)))
	e.runOnce(topic, e.names.RejectedTopic())
	e.exact(TableEvents, 10)
	if got := e.parkedRecords(); len(got) != 1 || got[0].SourceOffset != 4 {
		t.Fatalf("parked records %+v, want the row at offset 4 once", got)
	}
	e.exact(TableRejected, 1)
	if got := e.count(ProgressTable, fmt.Sprintf("consumer_group = '%s' AND kafka_topic = '%s'", e.group, topic)); got == 0 {
		t.Fatalf("no progress recorded for the new group")
	}
}

// committedOf returns group's committed offsets of topic.
func (e *env) committedOf(group, topic string) map[int32]int64 {
	e.t.Helper()
	out, err := testenv.Committed(ctxT(e.t, 30*time.Second), e.brokers, group, topic)
	if err != nil {
		e.t.Fatal(err)
	}
	return out
}
