package lag

import (
	"context"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/internal/kafka"
	"github.com/meterline/meterline/internal/testenv"
)

// fakeNow is a settable wall clock.
type fakeNow struct {
	mu sync.Mutex
	t  time.Time
}

func (f *fakeNow) now() time.Time { f.mu.Lock(); defer f.mu.Unlock(); return f.t }
func (f *fakeNow) add(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.t = f.t.Add(d)
}

// TestCollector exports lag as meterline_consumer_lag_records and
// meterline_consumer_lag_seconds per group, topic and partition: zero on a
// partition caught up to its commit marker, the records and the age of the
// first unconsumed record on a partition that is behind; scrapes within the
// cache TTL reuse one computation; a group without committed offsets
// exports nothing, unless its input topics are named: then it is behind
// from the start of every partition.
func TestCollector(t *testing.T) {
	_, brokers := testenv.KFake(t)
	ctx := context.Background()
	topic := testenv.Name(t, "lag")
	group := testenv.Name(t, "group")
	idle := testenv.Name(t, "never-committed")
	stuck := testenv.Name(t, "stuck-at-first-start")
	t0 := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	testenv.CreateTopic(t, brokers, topic, 2, nil)

	// Partition 0: one transaction of 10 records, consumed (committed at
	// the marker's offset, 10).
	tcl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.TransactionalID(group+"-tx"),
		kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.DefaultProduceTopic(topic))
	if err != nil {
		t.Fatal(err)
	}
	defer tcl.Close()
	if err := tcl.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 10; i++ {
		if err := tcl.ProduceSync(ctx, &kgo.Record{Partition: 0, Value: []byte("x"), Timestamp: t0.Add(-10 * time.Second)}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	if err := tcl.EndTransaction(ctx, kgo.TryCommit); err != nil {
		t.Fatal(err)
	}
	var offs kadm.Offsets
	offs.AddOffset(topic, 0, 10, -1)
	offs.AddOffset(topic, 1, 0, -1)
	if _, err := testenv.Admin(t, brokers).CommitOffsets(ctx, group, offs); err != nil {
		t.Fatal(err)
	}
	// Partition 1: 25 records the group has not consumed, the first one
	// stamped t0 (the topic uses CreateTime).
	pcl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.DefaultProduceTopic(topic))
	if err != nil {
		t.Fatal(err)
	}
	defer pcl.Close()
	produce := func(n int, ts time.Time) {
		t.Helper()
		for i := 0; i < n; i++ {
			if err := pcl.ProduceSync(ctx, &kgo.Record{Partition: 1, Value: []byte("y"), Timestamp: ts}).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
	}
	produce(25, t0)

	clock := &fakeNow{t: t0.Add(90 * time.Second)}
	c, err := NewCollector(kafka.Config{Brokers: brokers}, []string{group, idle, stuck}, WithClock(clock.now), WithCacheTTL(5*time.Second),
		WithInputTopics(stuck, topic, testenv.Name(t, "not-created-yet")))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)

	want := func(stage string, records map[int32]float64, seconds map[int32]float64) {
		t.Helper()
		got := gather(t, reg)
		for k := range got[MetricRecords] {
			if k.group == stuck {
				delete(got[MetricRecords], k)
				delete(got[MetricSeconds], k)
			}
		}
		if len(got[MetricRecords]) != len(records) || len(got[MetricSeconds]) != len(seconds) {
			t.Fatalf("%s: series %v, want partitions %v", stage, got, records)
		}
		for p, v := range records {
			if g := got[MetricRecords][key{group, topic, p}]; g != v {
				t.Errorf("%s: %s partition %d = %v, want %v", stage, MetricRecords, p, g, v)
			}
		}
		for p, v := range seconds {
			if g := got[MetricSeconds][key{group, topic, p}]; g != v {
				t.Errorf("%s: %s partition %d = %v, want %v", stage, MetricSeconds, p, g, v)
			}
		}
	}
	want("first scrape", map[int32]float64{0: 0, 1: 25}, map[int32]float64{0: 0, 1: 90})
	// The group that never committed, with its input named: behind from
	// the start (partition 0: 10 records and the commit marker).
	got := gather(t, reg)
	for p, w := range map[int32][2]float64{0: {11, 100}, 1: {25, 90}} {
		k := key{stuck, topic, p}
		if got[MetricRecords][k] != w[0] || got[MetricSeconds][k] != w[1] {
			t.Errorf("never-committed group, partition %d: %v records, %v seconds; want %v", p, got[MetricRecords][k], got[MetricSeconds][k], w)
		}
	}
	if n := len(got[MetricRecords]); n != 4 {
		t.Errorf("%d lag series, want 4 (two partitions of two groups): %v", n, got[MetricRecords])
	}

	// More input within the TTL: the scrape serves the cached computation.
	produce(5, t0.Add(time.Second))
	clock.add(2 * time.Second)
	want("cached", map[int32]float64{0: 0, 1: 25}, map[int32]float64{0: 0, 1: 90})

	// Past the TTL the lag is computed again.
	clock.add(4 * time.Second)
	want("refreshed", map[int32]float64{0: 0, 1: 30}, map[int32]float64{0: 0, 1: 96})

	// The group consumes everything: zero lag everywhere.
	var all kadm.Offsets
	all.AddOffset(topic, 1, 30, -1)
	if _, err := testenv.Admin(t, brokers).CommitOffsets(ctx, group, all); err != nil {
		t.Fatal(err)
	}
	clock.add(5 * time.Second)
	want("caught up", map[int32]float64{0: 0, 1: 0}, map[int32]float64{0: 0, 1: 0})
}

// TestCollectorBrokerDown: when the lag cannot be computed, the scrape
// still succeeds, without lag series but with MetricComputed 0 (so that an
// alert sees the lag is unknown), and the failure is cached for the TTL
// instead of being retried by every scrape.
func TestCollectorBrokerDown(t *testing.T) {
	cluster, brokers := testenv.KFake(t)
	clock := &fakeNow{t: time.Now()}
	c, err := NewCollector(kafka.Config{Brokers: brokers}, []string{"g"}, WithClock(clock.now), WithTimeout(300*time.Millisecond),
		WithStage("g", "dedup"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cluster.Close()
	reg := prometheus.NewRegistry()
	reg.MustRegister(c, prometheus.NewCounter(prometheus.CounterOpts{Name: "other_total", Help: "x"}))
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather failed: %v", err)
	}
	computed := 0
	for _, mf := range mfs {
		switch mf.GetName() {
		case MetricRecords, MetricSeconds, MetricHeldRecords, MetricHeldSeconds:
			t.Fatalf("lag series exported while the broker is down: %v", mf)
		case MetricComputed:
			for _, s := range mf.GetMetric() {
				computed++
				if v := s.GetGauge().GetValue(); v != 0 {
					t.Errorf("%s %v = %v while the broker is down, want 0", MetricComputed, s.GetLabel(), v)
				}
				if l := s.GetLabel(); len(l) != 2 || l[0].GetValue() != "g" || l[1].GetValue() != "dedup" {
					t.Errorf("%s labels %v, want group g, stage dedup", MetricComputed, l)
				}
			}
		}
	}
	if computed != 1 {
		t.Errorf("%d %s series, want 1", computed, MetricComputed)
	}
	if len(mfs) != 2 {
		t.Fatalf("the rest of the scrape is missing: %v", mfs)
	}
	if _, err := c.Rows(); err == nil {
		t.Fatal("Rows reports no error while the broker is down")
	}
	failedAt := c.at
	clock.add(time.Second)
	if _, err := c.Rows(); err == nil || c.at != failedAt {
		t.Fatalf("a scrape within the TTL retried the broker (error %v, computed at %s, failed at %s)", err, c.at, failedAt)
	}
	clock.add(5 * time.Second)
	if _, _ = c.Rows(); c.at == failedAt {
		t.Fatal("a scrape past the TTL did not retry")
	}
}

// TestCollectorSharesComputationInFlight: scrapes that arrive while a
// computation runs wait for it and take its result, also when it ran as
// long as the cache TTL, as it does against a broker that accepts
// connections and answers nothing (paused, or its host cut off): it then
// takes the whole timeout, which is the TTL by default. Were each waiting
// scrape to compute again once the one before it ended, N scrapes at the
// same moment (two Prometheus servers, the status page) would take N
// timeouts, and the later ones would miss Prometheus's scrape timeout.
func TestCollectorSharesComputationInFlight(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	dialed := make(chan struct{}, 1)
	var conns sync.WaitGroup
	defer conns.Wait()
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			select {
			case dialed <- struct{}{}:
			default:
			}
			conns.Add(1)
			go func() { // read every request, answer none
				defer conns.Done()
				_, _ = io.Copy(io.Discard, conn)
			}()
		}
	}()
	const timeout = time.Second
	c, err := NewCollector(kafka.Config{Brokers: []string{ln.Addr().String()}}, []string{"g"}, WithTimeout(timeout), WithCacheTTL(timeout))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	defer ln.Close() // before conns.Wait: the client's connections end with Close

	first := make(chan error, 1)
	go func() { _, err := c.Rows(); first <- err }()
	<-dialed // the first computation waits on the broker
	start := time.Now()
	var wg sync.WaitGroup
	var errs [2]error
	var took [2]time.Duration
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = c.Rows()
			took[i] = time.Since(start)
		}()
	}
	wg.Wait()
	err0 := <-first
	if err0 == nil {
		t.Fatal("the lag was computed against a broker that answers nothing")
	}
	for i, err := range errs {
		if err != err0 {
			t.Errorf("scrape %d waited for the computation in flight, then computed again (answered after %s; its error %v, the one in flight's %v)",
				i, took[i].Round(10*time.Millisecond), err, err0)
		}
	}
}

type key struct {
	group, topic string
	partition    int32
}

func gather(t *testing.T, reg *prometheus.Registry) map[string]map[key]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]map[key]float64{}
	for _, mf := range mfs {
		m := map[key]float64{}
		for _, s := range mf.GetMetric() {
			var k key
			for _, l := range s.GetLabel() {
				switch l.GetName() {
				case "group":
					k.group = l.GetValue()
				case "topic":
					k.topic = l.GetValue()
				case "partition":
					var p int
					for _, ch := range l.GetValue() {
						p = p*10 + int(ch-'0')
					}
					k.partition = int32(p)
				}
			}
			m[k] = value(s)
		}
		out[mf.GetName()] = m
	}
	return out
}

func value(m *dto.Metric) float64 {
	if g := m.GetGauge(); g != nil {
		return g.GetValue()
	}
	return m.GetCounter().GetValue()
}

// TestCollectorStage: each series carries its group's stage label
// (WithStage), so that the aggregator's and the sink's lag on
// usage.deduped differ under `meterline run`, one process for every
// stage; a group given no stage has an empty one (no label to Prometheus).
func TestCollectorStage(t *testing.T) {
	_, brokers := testenv.KFake(t)
	topic := testenv.Name(t, "deduped")
	testenv.CreateTopic(t, brokers, topic, 1, nil)
	agg, snk, other := testenv.Name(t, "aggregate"), testenv.Name(t, "sink"), testenv.Name(t, "other")
	c, err := NewCollector(kafka.Config{Brokers: brokers}, []string{agg, snk, other},
		WithInputTopics(agg, topic), WithInputTopics(snk, topic), WithInputTopics(other, topic),
		WithStage(agg, "aggregate"), WithStage(snk, "sink"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{agg: "aggregate", snk: "sink", other: ""}
	n := 0
	for _, mf := range mfs {
		for _, s := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range s.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if st, w := labels["stage"], want[labels["group"]]; st != w {
				t.Errorf("%s%v: stage %q, want %q", mf.GetName(), labels, st, w)
			}
			if mf.GetName() == MetricComputed && s.GetGauge().GetValue() != 1 {
				t.Errorf("%s%v = %v after a computation that succeeded, want 1", mf.GetName(), labels, s.GetGauge().GetValue())
			}
			n++
		}
	}
	if n != 15 {
		t.Errorf("%d lag series, want 15 (records, seconds, held records, held seconds and computed of three groups)", n)
	}
}
