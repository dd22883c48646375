package sink

import (
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/internal/testenv"
)

// TestAuditCommittedOffsetAheadOfTable (audit, EXPECTED TO FAIL on main;
// real Kafka and ClickHouse): DESIGN §6.6, "Offsets are never reset
// silently ... If the state holds an offset but Kafka has none, or the two
// disagree, it stops with a clear error instead of re-counting." The
// sink's state is its ledger tables. When the group's committed offset is
// moved past records that are in no table (kafka-consumer-groups
// --reset-offsets --to-latest by an operator fighting lag), the sink
// either writes those rows or stops with an error; it must not go on
// with them missing from usage_events (and so from the bill's tables).
func TestAuditCommittedOffsetAheadOfTable(t *testing.T) {
	e := newEnv(t, 1)
	topic := e.names.DedupedTopic()
	start := time.Date(2026, 5, 4, 0, 0, 0, 0, time.UTC)
	var first, second []*kgo.Record
	for i := 0; i < 10; i++ {
		first = append(first, deduped(topic, 0, i, start.Add(time.Duration(i)*time.Second)))
		second = append(second, deduped(topic, 0, 10+i, start.Add(time.Duration(10+i)*time.Second)))
	}
	e.produce(first...)
	r := e.start(nil)
	e.waitCaughtUp(time.Minute, topic)
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	e.exact("usage_events", 10)

	// Ten more records, then the group's offset is moved to the end while
	// no sink runs.
	e.produce(second...)
	adm := testenv.Admin(t, e.brokers)
	ends, err := adm.ListEndOffsets(ctxT(t, 30*time.Second), topic)
	if err != nil {
		t.Fatal(err)
	}
	end, _ := ends.Lookup(topic, 0)
	var os kadm.Offsets
	os.Add(kadm.Offset{Topic: topic, Partition: 0, At: end.Offset, LeaderEpoch: -1})
	if resp, err := adm.CommitOffsets(ctxT(t, 30*time.Second), e.group, os); err != nil || resp.Error() != nil {
		t.Fatalf("reset the group's offset: %v %v", err, resp.Error())
	}

	r = e.start(nil)
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-r.exited:
			t.Logf("the sink stopped: %v", r.err)
			return // a clear error: what the contract asks
		default:
		}
		if e.count("usage_events") == 20 {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("after the group's offset was moved past 10 records that are in no table, the sink runs on with usage_events at %d rows (want 20, or the sink stopping with an error)", e.count("usage_events"))
}
