package dedup

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap/zaptest"

	"github.com/meterline/meterline/internal/kafka"
	"github.com/meterline/meterline/internal/session"
	"github.com/meterline/meterline/internal/stream"
	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/internal/topics"
	"github.com/meterline/meterline/schemas"
)

// t0 is the arrival time tests count from: midnight UTC 20 days ago. It
// follows the wall clock because a re-routed record's broker timestamp is
// the time dedup wrote it, and a re-routed arrival is honoured only within
// W (35 days) of that.
var t0 = time.Now().UTC().Truncate(24 * time.Hour).Add(-20 * 24 * time.Hour).UnixMilli()

const (
	hour = int64(time.Hour / time.Millisecond)
	day  = 24 * hour
)

type harness struct {
	t       testing.TB
	brokers []string
	names   topics.Names
	n       int32
	group   string
	keys    []Key // the ring every instance of the test shares
	// createTime: usage.events uses CreateTime, which config allows.
	createTime bool
}

// newHarness creates the topics on brokers (kfake when nil) with n
// partitions; usage.events uses CreateTime so tests choose arrival times
// (and the harness's configs allow it: AllowCreateTime).
func newHarness(t testing.TB, brokers []string, n int32) *harness {
	return newHarnessWith(t, brokers, n, "CreateTime")
}

// newHarnessWith is newHarness with usage.events' message.timestamp.type
// ts.
func newHarnessWith(t testing.TB, brokers []string, n int32, ts string) *harness {
	if brokers == nil {
		_, brokers = testenv.KFake(t)
	}
	names := testenv.Topics(t, brokers, "", testenv.TopicsOpts{Partitions: n, EventsTimestamp: ts})
	k, err := GenerateKey("test-1")
	if err != nil {
		t.Fatal(err)
	}
	return &harness{t: t, brokers: brokers, names: names, n: n, group: names.Prefix + "dedup", keys: []Key{k},
		createTime: ts == "CreateTime"}
}

func (h *harness) config(instance string, fs vfs.FS) Config {
	return Config{
		Topics:       h.names,
		TickInterval: 200 * time.Millisecond,
		Keys:         h.keys,
		// The test chooses arrival times (CreateTime).
		AllowCreateTime: h.createTime,
		Stream: stream.Config{
			Config: session.Config{
				Kafka:              kafka.Config{Brokers: h.brokers},
				Group:              h.group,
				InstanceID:         instance,
				SessionTimeout:     6 * time.Second,
				TransactionTimeout: 10 * time.Second,
				RestartBackoff:     100 * time.Millisecond,
			},
			FS:             fs,
			StateDir:       "state-" + instance,
			CommitInterval: 20 * time.Millisecond,
			Logger:         zaptest.NewLogger(h.t).Named(instance),
		},
	}
}

type running struct {
	cancel context.CancelFunc
	done   chan struct{} // closed when Run returned; err is then set
	err    error
	stage  *Stage
}

// wait returns Run's error once it returned, or times out.
func (r *running) wait(d time.Duration) (error, bool) {
	select {
	case <-r.done:
		return r.err, true
	case <-time.After(d):
		return nil, false
	}
}

func (h *harness) start(cfg Config) *running {
	h.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	st, err := New(ctx, cfg)
	if err != nil {
		cancel()
		h.t.Fatal(err)
	}
	r := &running{cancel: cancel, done: make(chan struct{}), stage: st}
	go func() {
		r.err = st.Run(ctx)
		close(r.done)
	}()
	h.t.Cleanup(func() { _ = r.stop() })
	return r
}

func (r *running) stop() error {
	r.cancel()
	err, ok := r.wait(30 * time.Second)
	if !ok {
		return errors.New("stage did not stop within 30s")
	}
	return err
}

// event builds a correctly keyed, correctly placed usage event record that
// arrives at arrival (CreateTime).
func (h *harness) event(customer, meter, id string, qty, eventTime, arrival int64) *kgo.Record {
	e := &schemas.UsageEvent{EventID: id, CustomerID: customer, Meter: meter, Quantity: qty, EventTime: eventTime, Source: "test"}
	key := e.Identity().Key()
	return &kgo.Record{Topic: h.names.EventsTopic(), Partition: schemas.Partition(key, h.n), Key: key,
		Value: schemas.MustEncode(e), Timestamp: time.UnixMilli(arrival)}
}

func (h *harness) produce(recs ...*kgo.Record) {
	h.t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(h.brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		h.t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		h.t.Fatal(err)
	}
}

func (h *harness) caughtUp() {
	h.t.Helper()
	testenv.WaitCaughtUp(h.t, h.brokers, h.group, h.names.EventsTopic(), time.Minute)
}

type outputs struct {
	deduped    []*schemas.DedupedEvent
	dedupedRec []*kgo.Record
	watermarks []*schemas.Watermark
	duplicates []*schemas.Duplicate
	rejected   []*schemas.Rejected
}

func (h *harness) outputs() outputs {
	h.t.Helper()
	var o outputs
	for _, r := range testenv.ReadAll(h.t, h.brokers, h.names.DedupedTopic()) {
		m, err := schemas.Decode(r.Value)
		if err != nil {
			h.t.Fatal(err)
		}
		switch v := m.(type) {
		case *schemas.DedupedEvent:
			o.deduped = append(o.deduped, v)
			o.dedupedRec = append(o.dedupedRec, r)
		case *schemas.Watermark:
			o.watermarks = append(o.watermarks, v)
		default:
			h.t.Fatalf("unexpected %T in usage.deduped", m)
		}
	}
	for _, r := range testenv.ReadAll(h.t, h.brokers, h.names.DuplicatesTopic()) {
		var d schemas.Duplicate
		if err := schemas.DecodeInto(r.Value, &d); err != nil {
			h.t.Fatal(err)
		}
		o.duplicates = append(o.duplicates, &d)
	}
	for _, r := range testenv.ReadAll(h.t, h.brokers, h.names.RejectedTopic()) {
		var d schemas.Rejected
		if err := schemas.DecodeInto(r.Value, &d); err != nil {
			h.t.Fatal(err)
		}
		o.rejected = append(o.rejected, &d)
	}
	return o
}

// byID counts deduped events per event_id.
func (o outputs) byID() map[string]int {
	m := map[string]int{}
	for _, d := range o.deduped {
		m[d.EventID]++
	}
	return m
}

func readTopic(t testing.TB, h *harness, topic string) []*kgo.Record {
	return testenv.ReadAll(t, h.brokers, topic)
}
