package aggregator

import (
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/meterline/meterline/entitlements"
	"github.com/meterline/meterline/internal/benchinput"
	"github.com/meterline/meterline/internal/stream"
	"github.com/meterline/meterline/internal/topics"
	"github.com/meterline/meterline/schemas"
)

// The input of BenchmarkPartitionProcess is bench aggregate's
// (internal/benchinput), the records of partition 0 of usage.deduped of
// procBenchPartitions: procBenchEvents events of procBenchCustomers
// customers, five meters, every customer on the default plan "bench".
const (
	procBenchEvents     = 1_000_000
	procBenchCustomers  = 5_000
	procBenchPartitions = 8
)

// procBenchNow is the input's arrival; the plan and the rate card are
// benchinput.EventSpread and a millisecond older, the tick a millisecond
// younger.
var procBenchNow = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

type procInput struct {
	names  topics.Names
	ent    []*kgo.Record // plan, rate card, tick: the partition's usage.entitlements
	events []*kgo.Record // the partition's usage.deduped: events and watermarks
	n      int           // events among them
}

var procBench struct {
	once sync.Once
	in   procInput
	err  error
}

func procBenchInput() (procInput, error) {
	procBench.once.Do(func() { procBench.in, procBench.err = makeProcInput() })
	return procBench.in, procBench.err
}

func makeProcInput() (procInput, error) {
	in := procInput{names: topics.DefaultNames()}
	in.names.Prefix = "bench."
	now := procBenchNow
	var err error
	if in.ent, err = procBenchEnt(in.names, now); err != nil {
		return in, err
	}
	wm := schemas.MustEncode(&schemas.Watermark{SourcePartition: 0, SourcePartitions: 1, Watermark: now.Add(-time.Hour).UnixMilli()})
	topic := in.names.DedupedTopic()
	add := func(key, v []byte) {
		in.events = append(in.events, &kgo.Record{Topic: topic, Partition: 0, Offset: int64(len(in.events)),
			Key: key, Value: v, Timestamp: now})
	}
	for i := range procBenchEvents {
		if i%100_000 == 0 {
			add(nil, wm)
		}
		e := benchinput.Event(i, i%procBenchCustomers, procBenchCustomers, now)
		key := schemas.CustomerKey(e.CustomerID)
		if schemas.Partition(key, procBenchPartitions) != 0 {
			continue
		}
		v, err := schemas.Encode(e)
		if err != nil {
			return in, err
		}
		add(key, v)
		in.n++
	}
	return in, nil
}

// procBenchEnt is partition 0 of usage.entitlements of the input arriving
// at now: the default plan and the rate card benchinput.EventSpread and a
// millisecond older, a tick a millisecond younger.
func procBenchEnt(names topics.Names, now time.Time) ([]*kgo.Record, error) {
	var recs []*kgo.Record
	written := now.Add(-benchinput.EventSpread - time.Millisecond)
	for i, kv := range []struct {
		key string
		m   schemas.Message
		at  time.Time
	}{{schemas.DefaultPlanKey, benchinput.Plan(), written}, {schemas.RateCardKey, benchinput.Rates(), written},
		{schemas.TickKey, &schemas.Tick{InstanceID: "bench"}, now.Add(time.Millisecond)}} {
		v, err := schemas.Encode(kv.m)
		if err != nil {
			return nil, err
		}
		recs = append(recs, &kgo.Record{Topic: names.EntitlementsTopic(), Partition: 0, Offset: int64(i),
			Key: []byte(kv.key), Value: v, Timestamp: kv.at})
	}
	return recs, nil
}

// procBenchProcessor is the aggregator's processor of partition counts
// procBenchPartitions, with entitlements or not, on a registry of its own.
func procBenchProcessor(tb testing.TB, names topics.Names, ent bool) *processor {
	tb.Helper()
	cat, err := ParseMeters([]byte(benchinput.Meters))
	if err != nil {
		tb.Fatal(err)
	}
	cfg := Config{Topics: names, Meters: cat, Entitlements: ent}
	cfg.EnsureDefaults()
	var ledger *entitlements.Ledger
	if ent {
		if ledger, err = entitlements.New(cfg.ledgerConfig()); err != nil {
			tb.Fatal(err)
		}
	}
	n := int32(procBenchPartitions)
	// One source partition of usage.events: the input's watermarks claim
	// one (with more, the partition would ignore each of them).
	return &processor{ledger: ledger, cfg: cfg, aggregatesTopic: cfg.Topics.AggregatesTopic(), log: zap.NewNop(),
		counts: partitionCountsT{events: 1, deduped: n, aggregates: n, adjustments: n, rejected: n, entitlements: n, balances: n},
		m:      newMetrics(prometheus.NewRegistry()), now: func() time.Time { return procBenchNow }}
}

// procShape is how runProcInput cuts the input: fetches of fetch records,
// and a transaction's end after every txn records (a multiple of fetch)
// and at the end.
type procShape struct{ fetch, txn int }

// procShapeWhole is one partition alone: fetches of 5,000 records and
// transactions of DefaultMaxBatchRecords.
var procShapeWhole = procShape{fetch: 5_000, txn: DefaultMaxBatchRecords}

// procShapeStage is one partition of a stage that owns every partition
// of the input, as bench aggregate's aggregator does: its transactions of
// DefaultMaxBatchRecords records span the procBenchPartitions partitions,
// so each partition's share of one is DefaultMaxBatchRecords /
// procBenchPartitions records (6,250), in fetches of a fifth of that.
// What a partition does once a transaction (its Flush: the changed
// aggregates' and accounts' writes, the pending customers) then weighs
// as much an event as in bench aggregate, about 2 events an aggregate and
// 10 a customer per transaction.
var procShapeStage = procShape{fetch: DefaultMaxBatchRecords / procBenchPartitions / 5, txn: DefaultMaxBatchRecords / procBenchPartitions}

// runProcInput runs the whole input through a new partition 0 on an
// in-memory store (stream.Local), shaped as procShapeWhole,
// usage.entitlements first.
func runProcInput(tb testing.TB, in procInput, ent bool, before func()) *stream.Local {
	return runProcInputShaped(tb, in, ent, procShapeWhole, before)
}

// runProcInputShaped is runProcInput in fetches and transactions of
// shape.
func runProcInputShaped(tb testing.TB, in procInput, ent bool, shape procShape, before func()) *stream.Local {
	tb.Helper()
	l, err := stream.NewLocal(procBenchProcessor(tb, in.names, ent), 0, in.names.DedupedTopic())
	if err != nil {
		tb.Fatal(err)
	}
	before()
	if ent {
		if err := l.Process(in.ent); err != nil {
			tb.Fatal(err)
		}
	}
	fetch := shape.fetch
	for i := 0; i < len(in.events); i += fetch {
		if err := l.Process(in.events[i:min(i+fetch, len(in.events))]); err != nil {
			tb.Fatal(err)
		}
		if (i+fetch)%shape.txn == 0 || i+fetch >= len(in.events) {
			if err := l.Commit(); err != nil {
				tb.Fatal(err)
			}
		}
	}
	return l
}

// processCPU is the CPU time the process has used (user and system, all
// its threads: the garbage collector's included).
func processCPU(tb testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkPartitionProcess is the aggregator's whole per-partition work
// on one partition of bench aggregate's input (Process, Flush, the
// changelog records and the store's writes), without a broker: an op is
// the partition's input from an empty state; ns/event divides it by its
// events, and cpu-ns/event the process's CPU time over them (steadier than
// ns/event on a shared machine). "without" is the aggregator without
// entitlements, "with" with, in fetches and transactions of the partition
// alone (procShapeWhole); "stage-without" and "stage-with" are the same
// in those of one partition of bench aggregate's stage (procShapeStage).
func BenchmarkPartitionProcess(b *testing.B) {
	in, err := procBenchInput()
	if err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct {
		name  string
		ent   bool
		shape procShape
	}{{"without", false, procShapeWhole}, {"with", true, procShapeWhole},
		{"stage-without", false, procShapeStage}, {"stage-with", true, procShapeStage}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			var cpu time.Duration
			for b.Loop() {
				b.StopTimer()
				var c0 time.Duration
				l := runProcInputShaped(b, in, c.ent, c.shape, func() { b.StartTimer(); c0 = processCPU(b) })
				cpu += processCPU(b) - c0
				b.StopTimer()
				if err := l.Close(); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
			events := float64(b.N * in.n)
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/events, "ns/event")
			b.ReportMetric(float64(cpu.Nanoseconds())/events, "cpu-ns/event")
		})
	}
}

// TestPartitionProcessBenchInput: the benchmark's input decides as bench
// aggregate's does (about 7 % of the events over_limit, the others
// accepted and paid), and emits one revision per changed aggregate.
func TestPartitionProcessBenchInput(t *testing.T) {
	in, err := procBenchInput()
	if err != nil {
		t.Fatal(err)
	}
	l := runProcInput(t, in, true, func() {})
	defer l.Close()
	rejected := l.Emitted(in.names.RejectedTopic())
	if rejected == 0 || rejected*100 > 10*in.n || l.Emitted(in.names.AggregatesTopic()) == 0 || l.Emitted(in.names.BalancesTopic()) == 0 {
		t.Fatalf("%d events: %d rejected, %d revisions, %d balances", in.n, rejected,
			l.Emitted(in.names.AggregatesTopic()), l.Emitted(in.names.BalancesTopic()))
	}
	t.Logf("%d events: %d rejected, %d revisions, %d balances", in.n, rejected,
		l.Emitted(in.names.AggregatesTopic()), l.Emitted(in.names.BalancesTopic()))
	// In the stage's transactions (procShapeStage) the decisions are the
	// same, and each of the more transactions emits a revision per
	// aggregate it changed.
	ls := runProcInputShaped(t, in, true, procShapeStage, func() {})
	defer ls.Close()
	if got := ls.Emitted(in.names.RejectedTopic()); got != rejected {
		t.Fatalf("stage's transactions: %d rejected, want %d", got, rejected)
	}
	if got, whole := ls.Emitted(in.names.AggregatesTopic()), l.Emitted(in.names.AggregatesTopic()); got <= whole {
		t.Fatalf("stage's transactions: %d revisions, want more than %d", got, whole)
	}
}

// TestNewPartitionNoWorkAfterFirstWatermark: the first watermark of a new
// partition with entitlements starts its first roll, which has periods to
// prune only (no balances). Its first chunk goes in the watermark's
// transaction, so a new partition has no chunked work left: Work would
// commit a transaction of its own for it at once, one per partition of a
// new aggregator.
func TestNewPartitionNoWorkAfterFirstWatermark(t *testing.T) {
	in, err := procBenchInput()
	if err != nil {
		t.Fatal(err)
	}
	l := runProcInput(t, in, true, func() {})
	defer l.Close()
	if l.HasWork() {
		t.Fatal("a new partition has chunked work after its input")
	}
}
