package dedup

import (
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/meterline/meterline/internal/testenv"
)

// TestSurvivesDroppedConnections: connections the broker closes in the
// middle of a request (kfake closes the client's connection instead of
// answering) are transport errors that kgo retries, or that rebuild the
// session (docs/design.md, Exactly-once); they never stop the stage. A
// connection closed at its first request is one too (kafka.Config.Opts):
// the new connections of a broker dropping them are. Every request kind
// the stage sends has connections dropped under it, a few times each,
// while events flow, and then while a new instance starts (New reads
// the topics' metadata and configs) and restores; the stage keeps running
// and every event comes out once.
func TestSurvivesDroppedConnections(t *testing.T) {
	c, brokers := testenv.KFake(t)
	h := newHarness(t, brokers, 2)
	r := h.start(h.config("i1", vfs.NewMem()))
	h.produce(h.event("c1", "m", "warm", 1, t0, t0))
	h.caughtUp()

	d := &dropper{c: c}
	// Events e[from, to) flow while the dropper is armed; r must keep
	// running.
	flow := func(r *running, from, to int) {
		t.Helper()
		for i := from; i < to; i++ {
			h.produce(h.event(fmt.Sprintf("c%d", i%5), "m", fmt.Sprintf("e%d", i), 1, t0, t0+int64(i)))
			time.Sleep(50 * time.Millisecond)
			if err, done := r.wait(0); done {
				t.Fatalf("the stage stopped after %d dropped connections: %v", d.dropped.Load(), err)
			}
		}
		d.armed.Store(false)
		h.caughtUp()
		if err, done := r.wait(0); done {
			t.Fatalf("the stage stopped after %d dropped connections: %v", d.dropped.Load(), err)
		}
		ids := h.outputs().byID()
		for i := range to {
			if n := ids[fmt.Sprintf("e%d", i)]; n != 1 {
				t.Errorf("event e%d deduped %d times, want once", i, n)
			}
		}
	}
	d.arm()
	flow(r, 0, 40)
	if d.dropped.Load() == 0 {
		t.Fatal("no connection was dropped")
	}
	if err := r.stop(); err != nil {
		t.Errorf("stop: %v", err)
	}
	// A new instance on empty state reads the topics' metadata and
	// configs (New) and restores every partition from the changelog while
	// its connections are dropped.
	d.arm()
	flow(h.start(h.config("i2", vfs.NewMem())), 40, 60)
	t.Logf("%d connections dropped", d.dropped.Load())
}

// dropper closes the connections of the stage's requests (kfake's
// control functions: an error closes the client's connection instead of
// answering), 3 of each kind per arm, while armed. The test's own
// producer (idempotent, not transactional) is spared.
type dropper struct {
	c       *kfake.Cluster
	armed   atomic.Bool
	dropped atomic.Int64
}

func (d *dropper) arm() {
	keys := []kmsg.Key{kmsg.Produce, kmsg.Fetch, kmsg.EndTxn, kmsg.AddPartitionsToTxn, kmsg.AddOffsetsToTxn, kmsg.TxnOffsetCommit,
		kmsg.Heartbeat, kmsg.ListOffsets, kmsg.Metadata, kmsg.OffsetFetch, kmsg.FindCoordinator, kmsg.JoinGroup,
		kmsg.SyncGroup, kmsg.InitProducerID, kmsg.DescribeConfigs}
	for _, k := range keys {
		left := atomic.Int64{}
		left.Store(3)
		d.c.ControlKey(k.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
			d.c.KeepControl()
			if !d.armed.Load() || !stagesRequest(req) || left.Add(-1) < 0 {
				return nil, nil, false
			}
			d.dropped.Add(1)
			return nil, errors.New("connection dropped by the test"), true
		})
	}
	d.armed.Store(true)
}

// stagesRequest reports whether req is not the test producer's.
func stagesRequest(req kmsg.Request) bool {
	switch r := req.(type) {
	case *kmsg.ProduceRequest:
		return r.TransactionID != nil
	case *kmsg.InitProducerIDRequest:
		return r.TransactionalID != nil
	}
	return true
}
