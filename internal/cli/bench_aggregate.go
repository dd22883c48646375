package cli

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime/pprof"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/meterline/meterline/aggregator"
	"github.com/meterline/meterline/internal/kafka"
	"github.com/meterline/meterline/internal/stream"
	"github.com/meterline/meterline/internal/topics"
	"github.com/meterline/meterline/schemas"
)

// BenchAggregateCmd is `meterline bench aggregate`.
type BenchAggregateCmd struct {
	Customers      int           `help:"Distinct customers." default:"10000"`
	Events         int           `help:"Events pre-filled in usage.deduped." default:"2000000"`
	Partitions     int32         `help:"Partitions of every benchmark topic." default:"16"`
	CommitInterval time.Duration `help:"Commit interval of every stage measured." default:"100ms"`
	LatencyRate    int           `help:"Events per second sent during the latency phase." default:"5000"`
	LatencyFor     time.Duration `help:"Length of the latency phase." default:"15s"`
	StateDir       string        `help:"Where the benchmark keeps Pebble state (removed afterwards)." default:"" type:"path"`
	Keep           bool          `help:"Keep the benchmark topics."`
	Rounds         int           `help:"Rounds; each measures (a), (b) and the aggregator once, in a rotating order. Medians are reported." default:"3"`
	CPUProfile     string        `help:"Write a CPU profile of the last round's aggregate phase to this file." hidden:"" type:"path"`
}

// benchMeters are the five meters of the benchmark: every aggregation.
const benchMeters = `meters:
  - {name: api_calls, aggregation: SUM, group_by: [region]}
  - {name: tokens, aggregation: SUM}
  - {name: storage_bytes, aggregation: MAX}
  - {name: active_users, aggregation: UNIQUE_COUNT, property: user}
  - {name: seats, aggregation: LATEST}
`

var benchMeterNames = []string{"api_calls", "tokens", "storage_bytes", "active_users", "seats"}

// Run runs the benchmark.
func (c *BenchAggregateCmd) Run(ctx context.Context, g *Globals, stdio IO, log *zap.Logger) error {
	say := func(format string, args ...any) { fmt.Fprintf(stdio.Stderr, "bench: "+format+"\n", args...) }
	if c.Customers <= 0 || c.Events <= 0 || c.Partitions <= 0 {
		return &ExitError{Code: 2, Err: errors.New("--customers, --events and --partitions must be positive")}
	}
	dir := c.StateDir
	if dir == "" {
		d, err := os.MkdirTemp("", "meterline-bench-aggregate-")
		if err != nil {
			return err
		}
		dir = d
	}
	defer os.RemoveAll(dir)
	cat, err := aggregator.ParseMeters([]byte(benchMeters))
	if err != nil {
		return err
	}

	names := g.Topic
	names.Prefix = fmt.Sprintf("%sbenchagg%d.", g.Topic.Prefix, time.Now().Unix())
	layout := topics.DefaultLayout()
	layout.Partitions = c.Partitions
	adm, closeAdm, err := adminClient(ctx, g)
	if err != nil {
		return err
	}
	defer closeAdm()
	kc, err := g.kafka()
	if err != nil {
		return err
	}
	rounds := max(c.Rounds, 1)
	specs := topics.Specs(names, layout)
	// Not "x" and "x-changelog": the changelog of one would be the output
	// of the other (a compacted topic, which refuses the watermark
	// records' null keys). Every round has its own changelogs: a stage
	// with fresh state would otherwise first restore the previous round's.
	passA, passB := names.Prefix+"bench-pass-a", names.Prefix+"bench-pass-b"
	specs = append(specs,
		topics.Spec{Name: passA, Partitions: c.Partitions, Configs: map[string]string{"cleanup.policy": "delete"}},
		topics.Spec{Name: passB, Partitions: c.Partitions, Configs: map[string]string{"cleanup.policy": "delete"}},
	)
	var aggChangelog topics.Spec
	for _, s := range specs {
		if s.Name == names.AggregateChangelogTopic() {
			aggChangelog = s
		}
	}
	roundNames := func(r int) topics.Names {
		n := names
		n.AggregateChangelog = fmt.Sprintf("%s-r%d", names.AggregateChangelog, r)
		return n
	}
	for r := range rounds {
		specs = append(specs,
			topics.Spec{Name: fmt.Sprintf("%s-changelog-r%d", passA, r), Partitions: c.Partitions, Configs: map[string]string{"cleanup.policy": "compact"}},
			topics.Spec{Name: fmt.Sprintf("%s-changelog-r%d", passB, r), Partitions: c.Partitions, Configs: map[string]string{"cleanup.policy": "compact"}},
		)
		cl := aggChangelog
		cl.Name = roundNames(r).AggregateChangelogTopic()
		specs = append(specs, cl)
	}
	if _, err := topics.Create(ctx, adm, specs, -1); err != nil {
		return err
	}
	if !c.Keep {
		defer func() {
			var ns []string
			for _, s := range specs {
				ns = append(ns, s.Name)
			}
			_, _ = adm.DeleteTopics(context.Background(), ns...)
		}()
	}

	now := time.Now()
	say("pre-filling %s with %d events (%d customers × %d meters)", names.DedupedTopic(), c.Events, c.Customers, len(benchMeterNames))
	input, err := prefillDeduped(ctx, kc, names.DedupedTopic(), c.Partitions, c.Events, c.Customers, now)
	if err != nil {
		return err
	}
	quiet := log.WithOptions(zap.IncreaseLevel(zap.WarnLevel))
	base := func(group, instance string) stream.Config {
		return stream.Config{Kafka: kc, Group: group, InstanceID: instance,
			StateDir: filepath.Join(dir, group+"-"+instance), CommitInterval: c.CommitInterval, Logger: quiet,
			Registerer: prometheus.NewRegistry()}
	}

	// runPass measures baseline (a) or (b) from the start of the input.
	runPass := func(r int, name, out string, changelog bool) (dedupBenchResult, error) {
		cfg := base(fmt.Sprintf("%s-group-r%d", out, r), "b1")
		cfg.Stage = "bench"
		cfg.InputTopic = names.DedupedTopic()
		cfg.ChangelogTopic = fmt.Sprintf("%s-changelog-r%d", out, r)
		proc := &aggPassthrough{out: out, changelog: changelog}
		res, err := runUntil(ctx, cfg, proc, func() int64 { return proc.n.Load() }, int64(input))
		if err != nil {
			return res, fmt.Errorf("%s: %w", name, err)
		}
		res.name = name
		say("round %d: %s: %.0f events/s; %s", r+1, name, res.rate(), txnStats(cfg.Registerer.(prometheus.Gatherer), res.elapsed))
		return res, nil
	}
	// runAgg measures the aggregator from the start of the input. In the
	// last round it keeps running for the latency phase.
	var (
		reg     *prometheus.Registry
		stopAgg = func() error { return nil }
	)
	runAgg := func(r int, last bool) (dedupBenchResult, error) {
		reg = prometheus.NewRegistry()
		acfg := aggregator.Config{Stream: base(fmt.Sprintf("%saggregate-r%d", names.Prefix, r), "a1"), Topics: roundNames(r), Meters: cat}
		acfg.Stream.Registerer = reg
		st, err := aggregator.New(ctx, acfg)
		if err != nil {
			return dedupBenchResult{}, err
		}
		actx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		stop := func() error {
			cancel()
			return <-done
		}
		if last && c.CPUProfile != "" {
			f, err := os.Create(c.CPUProfile)
			if err != nil {
				cancel()
				return dedupBenchResult{}, err
			}
			defer f.Close()
			if err := pprof.StartCPUProfile(f); err != nil {
				cancel()
				return dedupBenchResult{}, err
			}
			defer pprof.StopCPUProfile()
		}
		start := time.Now()
		go func() { done <- st.Run(actx) }()
		processed := func() int64 { return int64(sumCounter(reg, "meterline_stream_records_in_total")) }
		if err := waitCount(ctx, processed, int64(input), done); err != nil {
			cancel()
			return dedupBenchResult{}, err
		}
		res := dedupBenchResult{name: "aggregate", events: input, elapsed: time.Since(start)}
		say("round %d: aggregate: %.0f events/s; %s", r+1, res.rate(), txnStats(reg, res.elapsed))
		if last {
			stopAgg = stop
			return res, nil
		}
		return res, stop()
	}
	defer func() { _ = stopAgg() }()

	// Each round measures (a), (b) and the aggregator in a rotating order,
	// so that no stage always runs first (cold broker caches) or last.
	var resA, resB, resAgg []dedupBenchResult
	for r := range rounds {
		for k := range 3 {
			var err error
			var res dedupBenchResult
			switch (r + k) % 3 {
			case 0:
				res, err = runPass(r, "(a) passthrough", passA, false)
				resA = append(resA, res)
			case 1:
				res, err = runPass(r, "(b) passthrough + changelog record per event", passB, true)
				resB = append(resB, res)
			case 2:
				res, err = runAgg(r, r == rounds-1)
				resAgg = append(resAgg, res)
			}
			if err != nil {
				return err
			}
		}
	}
	results := []dedupBenchResult{medianResult(resA), medianResult(resB)}
	ares := medianResult(resAgg)

	say("latency: %d events/s for %s", c.LatencyRate, c.LatencyFor)
	lat, err := measureAggLatency(ctx, kc, names, c.Partitions, c.LatencyRate, c.LatencyFor, now)
	if err2 := stopAgg(); err2 != nil && !errors.Is(err2, context.Canceled) && err == nil {
		err = err2
	}
	stopAgg = func() error { return nil }
	if err != nil {
		return err
	}
	revisions := sumCounter(reg, "meterline_aggregate_revisions_total")

	out := stdio.Stdout
	fmt.Fprintf(out, "input: %d records in usage.deduped (%d events, %d customers × %d meters, watermarks), %d partitions, commit interval %s; medians of %d rounds\n",
		input, c.Events, c.Customers, len(benchMeterNames), c.Partitions, c.CommitInterval, rounds)
	for _, r := range results {
		fmt.Fprintf(out, "%-46s %9.0f events/s\n", r.name, r.rate())
	}
	fmt.Fprintf(out, "%-46s %9.0f events/s  (%.2f of (b), %.2f of (a))\n", "aggregate", ares.rate(),
		ares.rate()/results[1].rate(), ares.rate()/results[0].rate())
	fmt.Fprintf(out, "aggregate revisions emitted: %.0f\n", revisions)
	fmt.Fprintf(out, "latency produce → OPEN revision visible in usage.aggregates: p50 %s, p99 %s (%d events at %d/s)\n",
		lat.p50.Round(time.Millisecond), lat.p99.Round(time.Millisecond), lat.n, c.LatencyRate)
	return nil
}

// aggPassthrough is a baseline stage for the aggregator: it copies every
// input record to out in the same kind of transaction, and with changelog
// also writes one changelog-sized state record per event (a 40-byte key, a
// 20-byte value: an aggregate's key — prefix, period, framed customer,
// meter and group — and its varint state).
type aggPassthrough struct {
	out       string
	changelog bool
	n         atomic.Int64
}

func (p *aggPassthrough) Open(int32, *stream.PartitionState) (stream.Partition, error) {
	return &aggPassthroughPart{p: p}, nil
}

type aggPassthroughPart struct{ p *aggPassthrough }

func (pp *aggPassthroughPart) Process(tx *stream.Tx, recs []*kgo.Record) error {
	var k [40]byte
	var v [20]byte
	for _, r := range recs {
		tx.Emit(&kgo.Record{Topic: pp.p.out, Partition: r.Partition, Key: r.Key, Value: r.Value})
		if pp.p.changelog {
			k[0] = 'a'
			binary.BigEndian.PutUint64(k[1:], uint64(r.Offset)) // one key per event
			copy(k[9:], r.Key)
			tx.Put(k[:], v[:])
		}
	}
	pp.p.n.Add(int64(len(recs)))
	return nil
}

func (pp *aggPassthroughPart) Punctuate(*stream.Tx) error { return nil }
func (pp *aggPassthroughPart) Close()                     {}

func benchDedupedEvent(i, customers int, now time.Time) *schemas.DedupedEvent {
	cust := i % customers
	meter := (i / customers) % len(benchMeterNames)
	return &schemas.DedupedEvent{
		EventID:    fmt.Sprintf("bench-%d", i),
		CustomerID: fmt.Sprintf("cust-%05d", cust),
		Meter:      benchMeterNames[meter],
		Quantity:   int64(1 + i%100),
		EventTime:  now.Add(-30 * time.Minute).Add(time.Duration(i%1_000_000) * time.Millisecond).UnixMilli(),
		IngestTime: now.UnixMilli(),
		Source:     "bench",
		Properties: []schemas.Property{{Name: "region", Value: []string{"eu-west-1", "us-east-1"}[i%2]},
			{Name: "user", Value: fmt.Sprintf("user-%d", i%50)}},
	}
}

// dedupedRecord places an event as dedup does: keyed and partitioned by
// customer and meter.
func dedupedRecord(topic string, partitions int32, e *schemas.DedupedEvent) *kgo.Record {
	key := schemas.AppendFramed(nil, e.CustomerID, e.Meter)
	return &kgo.Record{Topic: topic, Partition: schemas.Partition(key, partitions), Key: key, Value: schemas.MustEncode(e)}
}

// prefillDeduped writes n events, and one watermark record per partition
// every 100,000 events (as dedup's ticks would, with a watermark that
// finalizes nothing), and returns the number of records written.
func prefillDeduped(ctx context.Context, kc kafka.Config, topic string, partitions int32, n, customers int, now time.Time) (int, error) {
	cl, err := kafka.NewClient(kc, kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.ProducerLinger(5*time.Millisecond), kgo.MaxBufferedRecords(100_000))
	if err != nil {
		return 0, err
	}
	defer cl.Close()
	var failed atomic.Int64
	var firstErr atomic.Value
	cb := func(_ *kgo.Record, err error) {
		if err != nil && failed.Add(1) == 1 {
			firstErr.Store(err)
		}
	}
	records := 0
	for i := 0; i < n; i++ {
		cl.Produce(ctx, dedupedRecord(topic, partitions, benchDedupedEvent(i, customers, now)), cb)
		records++
		if i%100_000 == 0 {
			wm := schemas.MustEncode(&schemas.Watermark{SourcePartition: 0, SourcePartitions: 1, Watermark: now.UnixMilli() - int64(time.Hour/time.Millisecond)})
			for p := int32(0); p < partitions; p++ {
				cl.Produce(ctx, &kgo.Record{Topic: topic, Partition: p, Value: wm}, cb)
				records++
			}
		}
	}
	if err := cl.Flush(ctx); err != nil {
		return 0, err
	}
	if f := failed.Load(); f > 0 {
		return 0, fmt.Errorf("pre-fill: %d sends failed, first: %v", f, firstErr.Load())
	}
	return records, nil
}

// measureAggLatency produces events at a steady rate into usage.deduped
// while the aggregator runs, each for a customer of its own, and times each
// from its send to the OPEN revision of its aggregate becoming visible
// (read_committed) in usage.aggregates.
func measureAggLatency(ctx context.Context, kc kafka.Config, names topics.Names, partitions int32, rate int, dur time.Duration, now time.Time) (latencies, error) {
	cl, err := kafka.NewClient(kc, kgo.ConsumeTopics(names.AggregatesTopic()),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtEnd()), kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.FetchMaxWait(50*time.Millisecond))
	if err != nil {
		return latencies{}, err
	}
	defer cl.Close()
	pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	cl.PollFetches(pctx) // positioned before sending
	cancel()
	prod, err := kafka.NewClient(kc, kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.ProducerLinger(0))
	if err != nil {
		return latencies{}, err
	}
	defer prod.Close()
	sent := map[string]time.Time{}
	var lats []time.Duration
	total := int(float64(rate) * dur.Seconds())
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	per := max(rate/100, 1)
	run := time.Now().UnixNano()
	i, seen := 0, 0
	deadline := time.Now().Add(dur + 30*time.Second)
	for seen < total && time.Now().Before(deadline) {
		if i < total {
			<-tick.C
			for j := 0; j < per && i < total; j++ {
				e := benchDedupedEvent(i, 1, now)
				e.CustomerID = fmt.Sprintf("lat-%d-%d", run, i)
				e.EventID = fmt.Sprintf("lat-%d", i)
				sent[e.CustomerID] = time.Now()
				prod.Produce(ctx, dedupedRecord(names.DedupedTopic(), partitions, e), nil)
				i++
			}
		}
		fctx, cancel := context.WithTimeout(ctx, time.Millisecond)
		fs := cl.PollFetches(fctx)
		cancel()
		at := time.Now()
		fs.EachRecord(func(r *kgo.Record) {
			var a schemas.Aggregate
			if schemas.DecodeInto(r.Value, &a) != nil {
				return
			}
			if t0, ok := sent[a.CustomerID]; ok {
				lats = append(lats, at.Sub(t0))
				delete(sent, a.CustomerID)
				seen++
			}
		})
	}
	return quantiles(lats, "aggregate")
}
