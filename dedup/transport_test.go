package dedup

import (
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
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

	keys := []int16{kmsg.Produce.Int16(), kmsg.Fetch.Int16(), kmsg.EndTxn.Int16(), kmsg.AddPartitionsToTxn.Int16(),
		kmsg.AddOffsetsToTxn.Int16(), kmsg.TxnOffsetCommit.Int16(), kmsg.Heartbeat.Int16(), kmsg.ListOffsets.Int16(),
		kmsg.Metadata.Int16(), kmsg.OffsetFetch.Int16(), kmsg.FindCoordinator.Int16(), kmsg.JoinGroup.Int16(),
		kmsg.SyncGroup.Int16(), kmsg.InitProducerID.Int16(), kmsg.DescribeConfigs.Int16()}
	var dropped atomic.Int64
	var armed atomic.Bool
	armed.Store(true)
	// The test's own producer (idempotent, not transactional) is spared.
	stages := func(req kmsg.Request) bool {
		switch r := req.(type) {
		case *kmsg.ProduceRequest:
			return r.TransactionID != nil
		case *kmsg.InitProducerIDRequest:
			return r.TransactionalID != nil
		}
		return true
	}
	for _, k := range keys {
		left := atomic.Int64{}
		left.Store(3)
		c.ControlKey(k, func(req kmsg.Request) (kmsg.Response, error, bool) {
			c.KeepControl()
			if !armed.Load() || !stages(req) || left.Add(-1) < 0 {
				return nil, nil, false
			}
			dropped.Add(1)
			return nil, errors.New("connection dropped by the test"), true
		})
	}
	for i := range 40 {
		h.produce(h.event(fmt.Sprintf("c%d", i%5), "m", fmt.Sprintf("e%d", i), 1, t0, t0+int64(i)))
		time.Sleep(50 * time.Millisecond)
		if err, done := r.wait(0); done {
			t.Fatalf("the stage stopped after %d dropped connections: %v", dropped.Load(), err)
		}
	}
	armed.Store(false)
	h.caughtUp()
	if err, done := r.wait(0); done {
		t.Fatalf("the stage stopped after %d dropped connections: %v", dropped.Load(), err)
	}
	if dropped.Load() == 0 {
		t.Fatal("no connection was dropped")
	}
	ids := h.outputs().byID()
	for i := range 40 {
		if n := ids[fmt.Sprintf("e%d", i)]; n != 1 {
			t.Errorf("event e%d deduped %d times, want once", i, n)
		}
	}
	if err := r.stop(); err != nil {
		t.Errorf("stop: %v", err)
	}

	// A new instance on empty state restores every partition from the
	// changelog while its fetches lose their connections.
	for _, k := range keys {
		left := atomic.Int64{}
		left.Store(3)
		c.ControlKey(k, func(req kmsg.Request) (kmsg.Response, error, bool) {
			c.KeepControl()
			if !armed.Load() || !stages(req) || left.Add(-1) < 0 {
				return nil, nil, false
			}
			dropped.Add(1)
			return nil, errors.New("connection dropped by the test"), true
		})
	}
	armed.Store(true)
	r2 := h.start(h.config("i2", vfs.NewMem()))
	for i := 40; i < 60; i++ {
		h.produce(h.event(fmt.Sprintf("c%d", i%5), "m", fmt.Sprintf("e%d", i), 1, t0, t0+int64(i)))
		time.Sleep(50 * time.Millisecond)
		if err, done := r2.wait(0); done {
			t.Fatalf("the restoring stage stopped after %d dropped connections: %v", dropped.Load(), err)
		}
	}
	armed.Store(false)
	h.caughtUp()
	if err, done := r2.wait(0); done {
		t.Fatalf("the restoring stage stopped after %d dropped connections: %v", dropped.Load(), err)
	}
	ids = h.outputs().byID()
	for i := range 60 {
		if n := ids[fmt.Sprintf("e%d", i)]; n != 1 {
			t.Errorf("event e%d deduped %d times, want once", i, n)
		}
	}
	t.Logf("%d connections dropped", dropped.Load())
}
