package sink

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap/zaptest"

	"github.com/meterline/meterline/internal/kafka"
	"github.com/meterline/meterline/internal/session"
	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/internal/testenv/crash"
	"github.com/meterline/meterline/internal/topics"
	"github.com/meterline/meterline/schemas"
)

func testTopics() topics.Names { return topics.DefaultNames() }

// sideBySide holds the slots of the tests that run beside each other
// (waitsMostly, keepsServerBusy): two at a time, whatever -parallel is, as
// on the 2-core machine of docs/testing.md, Time by part.
var sideBySide = make(chan struct{}, 2)

// waitsMostly marks a test whose time is mostly waiting (a killed member's
// session timing out, a ClickHouse outage, a broker fault held past the
// transaction timeout) as one that runs beside other such tests
// (testenv.Beside, in sideBySide's slots). Such a test has topics, a group
// and databases of its own and reads no server-wide state, and its waits
// have room for a loaded machine.
func waitsMostly(t *testing.T) {
	t.Helper()
	testenv.Beside(t, sideBySide)
}

// keepsServerBusy marks a test whose time is mostly the work of the
// ClickHouse server (or of chdb) on millions of rows, timed by nothing it
// asserts, as one that runs beside the tests that mostly wait
// (waitsMostly), on the cores they leave idle. It too has databases of its
// own and reads no server-wide state but its own queries' log.
func keepsServerBusy(t *testing.T) {
	t.Helper()
	testenv.Beside(t, sideBySide)
}

// offlineWriter is a Writer on a throwaway database with the migrations
// applied, never run: tests call its insert directly, as a sink (or a
// zombie) would.
func offlineWriter(t *testing.T, instance string) (w *Writer, conn driver.Conn, db string, ctx context.Context) {
	t.Helper()
	conn, db = testenv.ClickHouseDB(t)
	ctx = ctxT(t, time.Minute)
	if _, err := Migrate(ctx, conn); err != nil {
		t.Fatal(err)
	}
	w, err := New(Config{Config: session.Config{Kafka: kafka.Config{Brokers: []string{"unused:9092"}}, InstanceID: instance},
		Topics: testTopics(), Conn: conn, Database: db})
	if err != nil {
		t.Fatal(err)
	}
	return w, conn, db, ctx
}

// env is one integration test's world: real Kafka topics under a unique
// prefix, and a throwaway ClickHouse database with the migrations applied.
type env struct {
	t       *testing.T
	brokers []string
	addr    string
	conn    driver.Conn
	db      string
	names   topics.Names
	group   string
	parts   int32
	prod    *kgo.Client
	// children are the real binaries the test started (spawn).
	children *crash.Children
}

func newEnv(t *testing.T, parts int32) *env {
	t.Helper()
	brokers := testenv.RealKafka(t)
	addr := testenv.RealClickHouse(t)
	conn, db := testenv.ClickHouseDB(t)
	ctx := ctxT(t, time.Minute)
	if _, err := Migrate(ctx, conn); err != nil {
		t.Fatal(err)
	}
	names := topics.DefaultNames()
	names.Prefix = testenv.Name(t, "sink") + "."
	for _, tp := range []string{names.DedupedTopic(), names.AggregatesTopic(), names.AdjustmentsTopic(), names.DuplicatesTopic(), names.RejectedTopic(), names.BalancesTopic()} {
		testenv.CreateTopic(t, brokers, tp, parts, nil)
	}
	prod, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.ProducerLinger(5*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(prod.Close)
	return &env{t: t, brokers: brokers, addr: addr, conn: conn, db: db, names: names,
		group: testenv.Name(t, "sink-group"), parts: parts, prod: prod}
}

// produce writes records (Topic, Partition and Timestamp set by the caller).
func (e *env) produce(recs ...*kgo.Record) {
	e.t.Helper()
	ctx := ctxT(e.t, time.Minute)
	for i := 0; i < len(recs); i += 5000 {
		j := min(i+5000, len(recs))
		if err := e.prod.ProduceSync(ctx, recs[i:j]...).FirstErr(); err != nil {
			e.t.Fatal(err)
		}
	}
}

func (e *env) config(instance string) Config {
	return Config{
		Config: session.Config{Kafka: kafka.Config{Brokers: e.brokers}, Group: e.group, InstanceID: instance,
			SessionTimeout: 6 * time.Second},
		Topics:     e.names,
		ClickHouse: e.addr, Database: e.db,
		MaxBatchWait: 200 * time.Millisecond, CommitInterval: 300 * time.Millisecond,
		BackoffMax: time.Second, PingInterval: 300 * time.Millisecond,
	}
}

// running is a Writer run in-process.
type running struct {
	w    *Writer
	reg  *prometheus.Registry
	stop func() error
	// exited is closed when Run returned; err is then its error.
	exited chan struct{}
	err    error
}

func (e *env) start(mod func(*Config)) *running {
	e.t.Helper()
	cfg := e.config("i1")
	cfg.Logger = zaptest.NewLogger(e.t)
	reg := prometheus.NewRegistry()
	cfg.Registerer = reg
	if mod != nil {
		mod(&cfg)
	}
	w, err := New(cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{w: w, reg: reg, exited: make(chan struct{})}
	go func() {
		r.err = w.Run(ctx)
		close(r.exited)
	}()
	var once sync.Once
	var runErr error
	r.stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case <-r.exited:
				runErr = r.err
			case <-time.After(time.Minute):
				runErr = errors.New("writer did not stop within a minute")
			}
		})
		return runErr
	}
	e.t.Cleanup(func() { _ = r.stop() })
	return r
}

func (e *env) allTopics() []string {
	return []string{e.names.DedupedTopic(), e.names.AggregatesTopic(), e.names.AdjustmentsTopic(), e.names.DuplicatesTopic(), e.names.RejectedTopic(), e.names.BalancesTopic()}
}

// waitCaughtUp waits until the group has committed past every record of
// the given topics (default: all six).
func (e *env) waitCaughtUp(d time.Duration, ts ...string) {
	e.t.Helper()
	if len(ts) == 0 {
		ts = e.allTopics()
	}
	for _, tp := range ts {
		testenv.WaitCaughtUp(e.t, e.brokers, e.group, tp, d)
	}
}

func (e *env) count(table string, where ...string) uint64 {
	e.t.Helper()
	q := "SELECT count() FROM " + e.db + "." + table
	if len(where) > 0 {
		q += " WHERE " + strings.Join(where, " AND ")
	}
	var n uint64
	if err := e.conn.QueryRow(ctxT(e.t, 30*time.Second), q).Scan(&n); err != nil {
		e.t.Fatalf("%s: %v", q, err)
	}
	return n
}

// exact checks that table holds exactly want rows, each (partition,
// offset) once, with plain count() (no FINAL, no OPTIMIZE).
func (e *env) exact(table string, want uint64) {
	e.t.Helper()
	n := e.count(table)
	var distinct uint64
	q := "SELECT uniqExact(kafka_partition, kafka_offset) FROM " + e.db + "." + table
	if err := e.conn.QueryRow(ctxT(e.t, 30*time.Second), q).Scan(&distinct); err != nil {
		e.t.Fatal(err)
	}
	if n != want || distinct != want {
		e.t.Fatalf("%s: count() = %d, distinct (partition, offset) = %d; want exactly %d", table, n, distinct, want)
	}
}

func metric(t *testing.T, reg *prometheus.Registry, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	total := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				found := false
				for _, lp := range m.GetLabel() {
					if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
						found = true
					}
				}
				if !found {
					continue next
				}
			}
			switch {
			case m.Counter != nil:
				total += m.Counter.GetValue()
			case m.Gauge != nil:
				total += m.Gauge.GetValue()
			case m.Histogram != nil:
				total += float64(m.Histogram.GetSampleCount())
			}
		}
	}
	return total
}

// Record builders. base is a fixed instant so rows are reproducible.
var base = time.Date(2026, 1, 31, 23, 0, 0, 0, time.UTC)

func deduped(topic string, p int32, i int, ts time.Time) *kgo.Record {
	e := &schemas.DedupedEvent{
		EventID: fmt.Sprintf("ev-%d-%d", p, i), CustomerID: fmt.Sprintf("cust-%d", i%7), Meter: "api_calls",
		Quantity: int64(i%5 + 1), EventTime: ts.Add(-time.Minute).UnixMilli(), Source: []string{"gw", "batch"}[i%2],
		Properties: []schemas.Property{{Name: "model", Value: fmt.Sprint("m", i%3)}},
		IngestTime: ts.UnixMilli(), SourcePartition: p, SourceOffset: int64(i),
	}
	return &kgo.Record{Topic: topic, Partition: p, Key: []byte(e.CustomerID + "/" + e.Meter), Value: schemas.MustEncode(e), Timestamp: ts}
}

func watermark(topic string, p int32, ts time.Time) *kgo.Record {
	return &kgo.Record{Topic: topic, Partition: p, Value: schemas.MustEncode(&schemas.Watermark{SourcePartition: p, SourcePartitions: 4, Watermark: ts.UnixMilli()}), Timestamp: ts}
}

// events returns n DedupedEvents per partition with a watermark after every
// 10th, timestamps one second apart from start.
func (e *env) events(n int, start time.Time) (recs []*kgo.Record, rows int) {
	for p := int32(0); p < e.parts; p++ {
		for i := 0; i < n; i++ {
			ts := start.Add(time.Duration(i) * time.Second)
			recs = append(recs, deduped(e.names.DedupedTopic(), p, i, ts))
			rows++
			if i%10 == 9 {
				recs = append(recs, watermark(e.names.DedupedTopic(), p, ts))
			}
		}
	}
	return recs, rows
}
