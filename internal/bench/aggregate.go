package bench

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/aggregator"
	"github.com/meterline/meterline/internal/topics"
	"github.com/meterline/meterline/schemas"
)

// AggregateConfig configures Aggregate.
type AggregateConfig struct {
	// Customers is the number of distinct customers.
	Customers int
	// Events pre-filled in usage.deduped.
	Events int
	// Skewed gives one customer half of the events: with usage.deduped
	// keyed by customer (DESIGN §12), half of the input is then in one
	// partition.
	Skewed bool
	StageConfig
}

// Validate reports every problem with the config.
func (c *AggregateConfig) Validate() error {
	var skew error
	if c.Skewed && c.Customers < 2 {
		skew = fmt.Errorf("bench: customers: a skewed input needs at least 2 customers (got %d)", c.Customers)
	}
	return errors.Join(positive("customers", c.Customers), positive("events", c.Events), skew, c.StageConfig.validate())
}

// event is event i of the input.
func (c *AggregateConfig) event(i int, now time.Time) *schemas.DedupedEvent {
	if c.Skewed {
		return skewedAggregateEvent(i, c.Customers, now)
	}
	return aggregateEvent(i, c.Customers, now)
}

// Aggregate measures the aggregator on pre-filled usage.deduped against
// two transactional passthroughs, (a) copying every record and (b) also
// writing one changelog record per event, each from the start of the same
// input with its own group and changelog. The last round's aggregator
// stays up for the latency phase: events sent at a steady rate, each for
// a customer of its own, timed from their send to their OPEN revision's
// visibility in usage.aggregates.
func Aggregate(ctx context.Context, env *Env, cfg AggregateConfig) (err error) {
	cat, err := aggregator.ParseMeters([]byte(aggregateMeters))
	if err != nil {
		return err
	}
	s, err := newStageBench(env, "aggregate", "benchagg", cfg.StageConfig, cfg.Validate)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, s.close()) }()
	b := &aggregateBench{stageBench: s, cfg: cfg, meters: cat, now: time.Now()}
	if err := s.left.createTopics(ctx, b.specs()...); err != nil {
		return err
	}
	env.say("pre-filling %s with %d events (%d customers × %d meters%s)", s.names.DedupedTopic(), cfg.Events, cfg.Customers, len(aggregateMeterNames),
		map[bool]string{true: ", skewed"}[cfg.Skewed])
	if b.input, err = b.prefill(ctx); err != nil {
		return err
	}
	rounds := Rounds{N: cfg.Rounds, Unit: "events", Progress: env.say}
	res, err := rounds.Run(ctx,
		aggregatePass{b, b.passA(), "(a) passthrough", nil},
		aggregatePass{b, b.passB(), "(b) passthrough + changelog record per event", aggregateState{}},
		aggregateRun{b})
	if err != nil {
		return err
	}

	env.say("latency: %d events/s for %s", cfg.LatencyRate, cfg.LatencyFor)
	lat, err := b.latency(ctx)
	if err2 := s.stopLive(); err2 != nil && !errors.Is(err2, context.Canceled) && err == nil {
		err = err2
	}
	if err != nil {
		return err
	}
	revisions := sumMetrics(b.liveReg, "meterline_aggregate_revisions_total")

	out := env.Out
	fmt.Fprintf(out, "input: %d records in usage.deduped (%d events, %d customers × %d meters, watermarks), %d partitions, commit interval %s; medians of %d rounds\n",
		b.input, cfg.Events, cfg.Customers, len(aggregateMeterNames), cfg.Partitions, cfg.CommitInterval, cfg.Rounds)
	if cfg.Skewed {
		fmt.Fprintf(out, "skewed: customer %s has half of the events; the busiest partition holds %d of %d events (%.0f%%)\n",
			skewedAggregateEvent(0, cfg.Customers, b.now).CustomerID, b.busiest, cfg.Events, 100*float64(b.busiest)/float64(cfg.Events))
	}
	printRates(out, res)
	fmt.Fprintf(out, "aggregate revisions emitted: %.0f\n", revisions)
	fmt.Fprintf(out, "latency produce → OPEN revision visible in usage.aggregates: p50 %s, p99 %s (%d events at %d/s)\n",
		lat.p50.Round(time.Millisecond), lat.p99.Round(time.Millisecond), lat.n, cfg.LatencyRate)
	return nil
}

type aggregateBench struct {
	*stageBench
	cfg    AggregateConfig
	meters *aggregator.Catalog
	now    time.Time // of the input's event times
	input  int       // records in the input, watermarks included
	// busiest is the number of events in the partition that holds the
	// most.
	busiest int
	// liveReg is the registry of the last round's aggregator, which
	// s.live runs.
	liveReg *prometheus.Registry
}

// passA and passB are the output topics of the baselines. Not "x" and
// "x-changelog": the changelog of one would be the output of the other
// (a compacted topic, which refuses the watermark records' null keys).
func (b *aggregateBench) passA() string { return b.names.Prefix + "bench-pass-a" }
func (b *aggregateBench) passB() string { return b.names.Prefix + "bench-pass-b" }

// passChangelog is the changelog of a baseline in round: every round has
// its own changelogs, as a stage with fresh state would otherwise first
// restore the previous round's.
func passChangelog(out string, round int) string { return fmt.Sprintf("%s-changelog-r%d", out, round) }

// roundNames are the topic names of the aggregator in round: its own
// changelog.
func (b *aggregateBench) roundNames(round int) topics.Names {
	n := b.names
	n.AggregateChangelog = fmt.Sprintf("%s-r%d", b.names.AggregateChangelog, round)
	return n
}

// specs are every topic of the benchmark, made before the first round.
func (b *aggregateBench) specs() []topics.Spec {
	specs := topics.Specs(b.names, b.layout)
	p := b.cfg.Partitions
	specs = append(specs,
		topics.Spec{Name: b.passA(), Partitions: p, Configs: map[string]string{"cleanup.policy": "delete"}},
		topics.Spec{Name: b.passB(), Partitions: p, Configs: map[string]string{"cleanup.policy": "delete"}},
	)
	var aggChangelog topics.Spec
	for _, s := range specs {
		if s.Name == b.names.AggregateChangelogTopic() {
			aggChangelog = s
		}
	}
	for r := range b.cfg.Rounds {
		specs = append(specs,
			topics.Spec{Name: passChangelog(b.passA(), r), Partitions: p, Configs: map[string]string{"cleanup.policy": "compact"}},
			topics.Spec{Name: passChangelog(b.passB(), r), Partitions: p, Configs: map[string]string{"cleanup.policy": "compact"}},
		)
		cl := aggChangelog
		cl.Name = b.roundNames(r).AggregateChangelogTopic()
		specs = append(specs, cl)
	}
	return specs
}

// prefill writes the events, and one watermark record per partition every
// aggregateWatermarkEvery events, and returns the number of records
// written.
func (b *aggregateBench) prefill(ctx context.Context) (int, error) {
	cl, err := b.env.client(kgo.RecordPartitioner(kgo.ManualPartitioner()),
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
	wm, err := aggregateWatermark(b.now)
	if err != nil {
		return 0, err
	}
	topic, records := b.names.DedupedTopic(), 0
	perPartition := make([]int, b.cfg.Partitions)
	for i := 0; i < b.cfg.Events; i++ {
		r, err := dedupedRecord(topic, b.cfg.Partitions, b.cfg.event(i, b.now))
		if err != nil {
			return 0, err
		}
		if perPartition[r.Partition]++; perPartition[r.Partition] > b.busiest {
			b.busiest = perPartition[r.Partition]
		}
		cl.Produce(ctx, r, cb)
		records++
		if i%aggregateWatermarkEvery == 0 {
			for p := int32(0); p < b.cfg.Partitions; p++ {
				cl.Produce(ctx, &kgo.Record{Topic: topic, Partition: p, Value: wm}, cb)
				records++
			}
		}
	}
	if err := cl.Flush(ctx); err != nil {
		return 0, err
	}
	if f := failed.Load(); f > 0 {
		return 0, fmt.Errorf("bench: pre-fill: %d sends failed, first: %v", f, firstErr.Load())
	}
	return records, nil
}

// aggregatePass is baseline (a) or (b), from the start of the input.
type aggregatePass struct {
	b     *aggregateBench
	out   string
	name  string
	state stateShape
}

func (p aggregatePass) Run(ctx context.Context, round int, _ bool) (Result, error) {
	cfg := p.b.streamConfig(fmt.Sprintf("%s-group-r%d", p.out, round), "b1")
	cfg.Stage = "bench"
	cfg.InputTopic = p.b.names.DedupedTopic()
	cfg.ChangelogTopic = passChangelog(p.out, round)
	return p.b.measurePass(ctx, p.name, cfg, p.out, p.state, p.b.input)
}

// aggregateRun is the aggregator from the start of the input; the last
// round's stays up.
type aggregateRun struct{ b *aggregateBench }

func (a aggregateRun) Run(ctx context.Context, round int, last bool) (Result, error) {
	b := a.b
	reg := prometheus.NewRegistry()
	cfg := aggregator.Config{Stream: b.streamConfig(fmt.Sprintf("%saggregate-r%d", b.names.Prefix, round), "a1"),
		Topics: b.roundNames(round), Meters: b.meters}
	cfg.Stream.Registerer = reg
	st, err := aggregator.New(ctx, cfg)
	if err != nil {
		return Result{}, err
	}
	processed := func() int64 { return int64(sumMetrics(reg, "meterline_stream_records_in_total")) }
	elapsed, err := b.measureStage(ctx, st.Run, processed, b.input, last, b.cfg.CPUProfile)
	if err != nil {
		return Result{}, err
	}
	res := Result{Name: "aggregate", Count: b.input, Elapsed: elapsed, Detail: "; " + txnStats(reg, elapsed)}
	if last {
		b.liveReg = reg
		return res, nil
	}
	return res, b.stopLive()
}

// latency measures the latency of the aggregator left up.
func (b *aggregateBench) latency(ctx context.Context) (latencies, error) {
	prod, err := b.env.client(kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.ProducerLinger(0))
	if err != nil {
		return latencies{}, err
	}
	defer prod.Close()
	return latencyPhase{env: b.env, watch: b.names.AggregatesTopic(), rate: b.cfg.LatencyRate, dur: b.cfg.LatencyFor,
		target: &aggregateLatency{b: b, prod: prod, run: time.Now().UnixNano()}, what: "aggregate"}.run(ctx)
}

// aggregateLatency sends events each for a customer of its own and finds
// their OPEN revisions in usage.aggregates.
type aggregateLatency struct {
	b    *aggregateBench
	prod *kgo.Client
	run  int64 // makes the customers unique to this phase
}

func (l *aggregateLatency) send(ctx context.Context, i int) (string, error) {
	e := aggregateEvent(i, 1, l.b.now)
	e.CustomerID = fmt.Sprintf("lat-%d-%d", l.run, i)
	e.EventID = fmt.Sprintf("lat-%d", i)
	r, err := dedupedRecord(l.b.names.DedupedTopic(), l.b.cfg.Partitions, e)
	if err != nil {
		return "", err
	}
	l.prod.Produce(ctx, r, nil)
	return e.CustomerID, nil
}

func (*aggregateLatency) seen(r *kgo.Record) string {
	var a schemas.Aggregate
	if schemas.DecodeInto(r.Value, &a) != nil {
		return ""
	}
	return a.CustomerID
}
