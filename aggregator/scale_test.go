package aggregator

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/schemas"
)

// Environment variables of TestRealKafkaMonthEndAtScale: the number of
// aggregates, the transaction timeout and the FINAL chunk of the month end.
const (
	EnvScaleAggregates = "METERLINE_SCALE_AGGREGATES"
	EnvScaleTxnTimeout = "METERLINE_SCALE_TXN_TIMEOUT"
	EnvScaleChunk      = "METERLINE_SCALE_CHUNK"
)

// The defaults of TestRealKafkaMonthEndAtScale (in make test): 200,000
// aggregates, a 2 s transaction timeout, which one transaction carrying
// their 200,000 FINAL revisions and 400,000 changelog records outlasts many
// times over, and a chunk that commits in tens of milliseconds. A loaded
// 2-core machine (load average 25–35, other builds running) showed single
// transactions of 1–3 s whatever their size, so the timeout leaves that
// much room. The measurement: 1,000,000 aggregates with the
// product's defaults, a 10 s timeout and chunks of 10,000.
const (
	scaleAggregates = 200_000
	scaleTxnTimeout = 2 * time.Second
	scaleChunk      = 2_000
)

// scaleParam reads a positive integer or duration from the environment,
// or returns def.
func scaleParam[T int | time.Duration](t *testing.T, name string, def T) T {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	var out T
	switch p := any(&out).(type) {
	case *int:
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			t.Fatalf("%s=%q: want a positive integer", name, v)
		}
		*p = n
	case *time.Duration:
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			t.Fatalf("%s=%q: want a positive duration", name, v)
		}
		*p = d
	}
	return out
}

// TestRealKafkaMonthEndAtScale (real broker): one partition holds N OPEN
// aggregates (N events of N customers), then one watermark passes the
// month's end + grace, with no input after it. DESIGN
// §6 invariant 9: exactly one FINAL per aggregate; no transaction carries
// more FINAL revisions than the chunk (measured per transaction by kgo
// hooks); and the session never restarts: no transaction aborted, refused
// or of unknown outcome, no session rebuilt (the runtime's metrics). It
// logs the time from the watermark to the last FINAL committed, the number
// of transactions and the longest (first record to EndTxn response).
func TestRealKafkaMonthEndAtScale(t *testing.T) {
	brokers := testenv.RealKafka(t)
	n := scaleParam(t, EnvScaleAggregates, scaleAggregates)
	txnTimeout := scaleParam(t, EnvScaleTxnTimeout, scaleTxnTimeout)
	chunk := scaleParam(t, EnvScaleChunk, scaleChunk)
	t.Logf("%d aggregates, transaction timeout %s, chunk %d", n, txnTimeout, chunk)
	h := newAggHarnessSources(t, brokers, 1, 1)
	stateDir := t.TempDir()
	config := func(reg prometheus.Registerer) Config {
		cfg := Config{Topics: h.names}
		cfg.Stream.Kafka.Brokers, cfg.Stream.Group, cfg.Stream.InstanceID = brokers, h.group, "scale"
		cfg.Stream.StateDir = stateDir
		cfg.Stream.SessionTimeout = 6 * time.Second
		cfg.Stream.Registerer = reg
		cfg.Stream.Logger = zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel)).Named("scale")
		return cfg
	}

	// The set-up, with the default timeouts: N OPEN aggregates, every
	// event processed and committed.
	month := ms(t, "2026-03-01")
	end := ms(t, "2026-04-01")
	t0 := time.Now()
	setup := prometheus.NewRegistry()
	run := h.start(config(setup))
	produceScale(t, brokers, h.names.DedupedTopic(), n, month)
	deadline := time.Now().Add(10 * time.Minute)
	for counterOf(setup, "meterline_stream_records_in_total") < float64(n) {
		if time.Now().After(deadline) {
			t.Fatalf("%v of %d events processed after 10 minutes", counterOf(setup, "meterline_stream_records_in_total"), n)
		}
		time.Sleep(200 * time.Millisecond)
	}
	testenv.WaitCaughtUp(t, brokers, h.group, h.names.DedupedTopic(), 2*time.Minute)
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d OPEN aggregates in one partition after %s", n, time.Since(t0).Round(time.Millisecond))

	// The month end: the same instance (its state kept) with the
	// transaction timeout and the chunk.
	meter := newTxnMeter(h.names)
	reg := prometheus.NewRegistry()
	cfg := config(reg)
	cfg.Stream.TransactionTimeout = txnTimeout
	cfg.Stream.ClientOptions = []kgo.Opt{kgo.WithHooks(meter)}
	setFinalChunk(&cfg, chunk)
	h.start(cfg)
	// A new producer's first transactions can stall on the broker (issue
	// 11, finding 9; seen here as one transaction of 4.7 s): a few
	// watermarks that decide nothing commit them before the month end.
	for i := int64(1); i <= 3; i++ {
		h.produce(h.watermark(0, 0, 1, month+i*3600*1000))
		deadline := time.Now().Add(time.Minute)
		for counterOf(reg, "meterline_stream_records_in_total") < float64(i) {
			if time.Now().After(deadline) {
				t.Fatal("the restarted instance processed no input within a minute")
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	testenv.WaitCaughtUp(t, brokers, h.group, h.names.DedupedTopic(), time.Minute)
	meter.reset()
	before := transactionCounts(reg)
	refused, restarts := counterOf(reg, "meterline_stream_commits_refused_total"), counterOf(reg, "meterline_stream_session_restarts_total")
	sent := time.Now()
	h.produce(h.watermark(0, 0, 1, end+48*3600*1000+1))
	deadline = time.Now().Add(5 * time.Minute)
	for {
		rep := meter.report()
		pending, _ := gaugeOf(reg, "meterline_aggregate_finalizing_periods", "partition", "0")
		if rep.finals >= n && pending == 0 && rep.lastEnd.After(sent) && transactionCounts(reg)["committed"] > before["committed"] {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not finalized 5 minutes after the watermark: %d FINAL revisions emitted of %d, %v transactions, %v session restarts",
				rep.finals, n, transactionCounts(reg), counterOf(reg, "meterline_stream_session_restarts_total"))
		}
		time.Sleep(50 * time.Millisecond)
	}
	rep := meter.report()
	after := transactionCounts(reg)
	t.Logf("finalized %d aggregates in %s: %d transactions with FINAL revisions (at most %d FINAL and %d records each), %d transactions in all, longest %s (first record to EndTxn response); commit latency: %d commits, mean %s",
		n, rep.lastEnd.Sub(sent).Round(time.Millisecond), rep.finalTxs, rep.max.finals, rep.max.records, rep.ends,
		rep.longest.Round(time.Millisecond), int(histCount(reg, "meterline_stream_commit_seconds")),
		(time.Duration(histSum(reg, "meterline_stream_commit_seconds")/histCount(reg, "meterline_stream_commit_seconds")*1e9) * time.Nanosecond).Round(time.Millisecond))

	var slow []string
	for i, sp := range rep.spans {
		if sp.d > txnTimeout/2 {
			slow = append(slow, fmt.Sprintf("#%d %s (%d records, %d FINAL)", i+1, sp.d.Round(time.Millisecond), sp.records, sp.finals))
		}
	}
	if len(slow) > 0 {
		t.Logf("transactions longer than half the timeout: %v", slow)
	}
	if rep.max.finals > chunk {
		t.Errorf("a transaction carried %d FINAL revisions, more than the chunk of %d", rep.max.finals, chunk)
	}
	if min := (n + chunk - 1) / chunk; rep.finalTxs < min {
		t.Errorf("%d transactions carried FINAL revisions, want at least %d", rep.finalTxs, min)
	}
	for _, outcome := range []string{"aborted", "unknown"} {
		if d := after[outcome] - before[outcome]; d != 0 {
			t.Errorf("%v transactions %s", d, outcome)
		}
	}
	if v := counterOf(reg, "meterline_stream_commits_refused_total") - refused; v != 0 {
		t.Errorf("%v commits refused (fenced)", v)
	}
	if v := counterOf(reg, "meterline_stream_session_restarts_total") - restarts; v != 0 {
		t.Errorf("the session restarted %v times", v)
	}

	// Exactly one FINAL per aggregate, after its one OPEN revision.
	finals := make([]uint8, n)
	extra := 0
	readCommittedEach(t, brokers, h.names.AggregatesTopic(), func(r *kgo.Record) {
		var a schemas.Aggregate
		if err := schemas.DecodeInto(r.Value, &a); err != nil {
			t.Fatal(err)
		}
		if a.Status != schemas.StatusFinal {
			return
		}
		i, err := strconv.Atoi(a.CustomerID[1:])
		if err != nil || i >= n || a.Value != 1 || a.EventCount != 1 || a.Revision != 2 {
			if extra++; extra <= 5 {
				t.Errorf("unexpected FINAL %+v", a)
			}
			return
		}
		finals[i]++
	})
	bad := 0
	for i, c := range finals {
		if c != 1 {
			if bad++; bad <= 5 {
				t.Errorf("customer c%07d: %d FINAL revisions, want 1", i, c)
			}
		}
	}
	if bad > 0 {
		t.Fatalf("%d of %d aggregates do not have exactly one FINAL", bad, n)
	}
}

// produceScale writes n events of n customers (one aggregate each) in
// month into partition 0 of topic.
func produceScale(t *testing.T, brokers []string, topic string, n int, month int64) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.ProducerLinger(5*time.Millisecond), kgo.MaxBufferedRecords(100_000))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var firstErr error
	for i := 0; i < n; i++ {
		c := fmt.Sprintf("c%07d", i)
		e := &schemas.DedupedEvent{EventID: "e", CustomerID: c, Meter: "m", Quantity: 1,
			EventTime: month + int64(i%1000)*1000, IngestTime: month + int64(i%1000)*1000 + 500}
		cl.Produce(ctx, &kgo.Record{Topic: topic, Partition: 0, Key: schemas.CustomerKey(c), Value: schemas.MustEncode(e)},
			func(_ *kgo.Record, err error) {
				if err != nil && firstErr == nil {
					firstErr = err
				}
			})
	}
	if err := cl.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if firstErr != nil {
		t.Fatal(firstErr)
	}
}

// readCommittedEach calls fn for every committed data record of topic,
// read_committed, up to the high watermarks read at the start: as
// topics.ReadCommitted, without holding the records.
func readCommittedEach(t *testing.T, brokers []string, topic string, fn func(*kgo.Record)) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	acl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer acl.Close()
	ends, err := kadm.NewClient(acl).ListEndOffsets(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	want := map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) {
		if o.Offset > 0 {
			want[o.Partition] = o.Offset
		}
	})
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.KeepControlRecords())
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for len(want) > 0 {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("reading %s: %v (partitions left: %v)", topic, err, want)
		}
		fs.EachError(func(_ string, p int32, err error) { t.Fatalf("fetch %s/%d: %v", topic, p, err) })
		fs.EachRecord(func(r *kgo.Record) {
			end, ok := want[r.Partition]
			if !ok || r.Offset >= end {
				delete(want, r.Partition)
				return
			}
			if !r.Attrs.IsControl() {
				fn(r)
			}
			if r.Offset+1 >= end {
				delete(want, r.Partition)
			}
		})
	}
}

// transactionCounts returns meterline_stream_transactions_total by outcome.
func transactionCounts(reg *prometheus.Registry) map[string]float64 {
	out := map[string]float64{}
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() != "meterline_stream_transactions_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "outcome" {
					out[l.GetValue()] += m.GetCounter().GetValue()
				}
			}
		}
	}
	return out
}

func histCount(reg *prometheus.Registry, name string) float64 {
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() == name {
			v := 0.0
			for _, m := range mf.GetMetric() {
				v += float64(m.GetHistogram().GetSampleCount())
			}
			return v
		}
	}
	return 0
}

func histSum(reg *prometheus.Registry, name string) float64 {
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() == name {
			v := 0.0
			for _, m := range mf.GetMetric() {
				v += m.GetHistogram().GetSampleSum()
			}
			return v
		}
	}
	return 0
}
