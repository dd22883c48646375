package bench

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/aggregator"
	"github.com/meterline/meterline/internal/benchinput"
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
	// keyed by customer (docs/design.md, Topics), half of the input is then
	// in one partition.
	Skewed bool
	// EntitlementsTick is the entitlements tick of the aggregator with
	// entitlements (aggregator.Config.EntitlementsTick). Default:
	// aggregator.DefaultEntitlementsTick.
	EntitlementsTick time.Duration
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

// Aggregate measures the aggregator on pre-filled usage.deduped, without
// and with entitlements (docs/entitlements.md, Plans and caps: every
// customer on the default plan benchPlan, capped and paying with credits),
// against two transactional passthroughs, (a) copying every record and (b)
// also writing one changelog record per event, each from the start of the
// same input with its own group and changelog, in rotating order, all with
// the aggregator's transaction size (aggregator.DefaultMaxBatchRecords).
// After the rounds, each aggregator has a latency phase: events sent at a
// steady rate, each for a customer of its own and stamped with its send
// time as its arrival (as dedup stamps the broker time), timed from their
// send to their OPEN revision's visibility in usage.aggregates.
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
	b := &aggregateBench{stageBench: s, cfg: cfg, meters: cat}
	if err := s.left.createTopics(ctx, b.specs()...); err != nil {
		return err
	}
	// The plan is in effect for an event that arrived at or after its
	// broker time, and the rate card prices an event whose event_time
	// (and arrival) is at or after its broker time (entitlements.RateHistory:
	// a version's effective_from is raised to the card's broker time). The
	// input's arrivals (now) are therefore at least aggregateEventSpread
	// after both, so that every event is priced, and the grant pays.
	env.say("writing the default plan %q and the rate card to %s", benchPlan.Plan, s.names.EntitlementsTopic())
	written, err := b.writeEnt(ctx, schemas.DefaultPlanKey, benchPlan)
	if err != nil {
		return err
	}
	if written, err = b.writeEnt(ctx, schemas.RateCardKey, benchRates); err != nil {
		return err
	}
	b.now = time.UnixMilli(written).Add(aggregateEventSpread + time.Millisecond)
	if now := time.Now(); now.After(b.now) {
		b.now = now
	}
	select { // no arrival after the broker's clock
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(time.Until(b.now)):
	}
	env.say("pre-filling %s with %d events (%d customers × %d meters%s)", s.names.DedupedTopic(), cfg.Events, cfg.Customers, len(aggregateMeterNames),
		map[bool]string{true: ", skewed"}[cfg.Skewed])
	if b.input, err = b.prefill(ctx); err != nil {
		return err
	}
	// As an aggregator with entitlements that ran before would have left
	// them: ticks after the input's arrivals, so that the input is not
	// held in the gate until the stage's own first tick.
	if _, err := b.writeEnt(ctx, schemas.TickKey, &schemas.Tick{InstanceID: "bench"}); err != nil {
		return err
	}
	rounds := Rounds{N: cfg.Rounds, Unit: "events", Progress: env.say}
	res, err := rounds.Run(ctx,
		aggregatePass{b, b.passA(), "(a) passthrough", nil},
		aggregatePass{b, b.passB(), "(b) passthrough + changelog record per event", aggregateState{}},
		aggregateRun{b, false},
		aggregateRun{b, true})
	if err != nil {
		return err
	}
	for _, ent := range []bool{false, true} {
		if err := b.latencyRun(ctx, ent); err != nil {
			return err
		}
	}

	out := env.Out
	fmt.Fprintf(out, "input: %d records in usage.deduped (%d events, %d customers × %d meters, watermarks), %d partitions, commit interval %s; medians of %d rounds\n",
		b.input, cfg.Events, cfg.Customers, len(aggregateMeterNames), cfg.Partitions, cfg.CommitInterval, cfg.Rounds)
	if cfg.Skewed {
		fmt.Fprintf(out, "skewed: customer %s has half of the events; the busiest partition holds %d of %d events (%.0f%%)\n",
			skewedAggregateEvent(0, cfg.Customers, b.now).CustomerID, b.busiest, cfg.Events, 100*float64(b.busiest)/float64(cfg.Events))
	}
	printRates(out, res)
	on, off := res.Median(3), res.Median(2)
	fmt.Fprintf(out, "%-46s %9.0f events/s  (%.2f of (b), %.2f of the aggregator without entitlements; per round %s)\n",
		res.Runs[3][0].Name, on, on/res.Median(1), on/off, roundRatios(res, 3, 2))
	if off, on := median(b.cpu[0]), median(b.cpu[1]); off > 0 && on > 0 {
		fmt.Fprintf(out, "%-46s without entitlements %.2f µs, with %.2f µs (medians; without ÷ with %.2f)\n",
			"CPU per event (this process):", off, on, off/on)
	}
	fmt.Fprintf(out, "%-46s without entitlements %d ms, with %d ms (medians; not in the rates above)\n",
		"start-up (start to first record handled):", res.MedianStartup(2).Milliseconds(), res.MedianStartup(3).Milliseconds())
	fmt.Fprintf(out, "entitlements: every customer on plan %q (caps api_calls %d, tokens %d a month; grant %d micro-credits; overdraft deny; rates api_calls %d per unit, tokens %d per %d units), tick %s; last round's decisions: %s; credits consumed %.0f micro-credits\n",
		benchPlan.Plan, benchPlan.Caps[0].Limit, benchPlan.Caps[1].Limit, benchPlan.Grants[0].Amount,
		benchRates.Versions[0].Rates[0].MicroCredits, benchRates.Versions[0].Rates[1].MicroCredits, benchRates.Versions[0].Rates[1].PerUnits,
		b.entTick(), b.decisions, b.credits)
	fmt.Fprintf(out, "aggregate revisions emitted (last round, the pre-filled input): without entitlements %.0f, with %.0f\n", b.revisions[0], b.revisions[1])
	for i, name := range []string{"without entitlements", "with entitlements"} {
		lat := b.lat[i]
		fmt.Fprintf(out, "latency produce → OPEN revision visible in usage.aggregates, %s: p50 %s, p99 %s (%d events at %d/s)\n",
			name, lat.p50.Round(time.Millisecond), lat.p99.Round(time.Millisecond), lat.n, cfg.LatencyRate)
	}
	return nil
}

// roundRatios are the ratios of contender i's rate to j's, round by round.
func roundRatios(res *Results, i, j int) string {
	var b strings.Builder
	for k := range res.Runs[i] {
		if k > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%.2f", res.Runs[i][k].Rate()/res.Runs[j][k].Rate())
	}
	return b.String()
}

// benchPlan and benchRates are the default plan and the rate card of the
// aggregator with entitlements (benchinput.Plan): every customer capped
// on its two SUM meters and paying from a grant, with no overdraft.
var benchPlan, benchRates = benchinput.Plan(), benchinput.Rates()

// writeEnt writes m under key to every partition of the entitlements
// topic, as `meterline entitlements set-default` and `set-rates` do, and
// returns a time at or after the records' broker time (in milliseconds).
// The topic stamps LogAppendTime, which the producer's records do not
// carry back, so it is the time the last acknowledgement came, plus
// entClockMargin for a broker whose clock runs ahead of this one.
func (b *aggregateBench) writeEnt(ctx context.Context, key string, m schemas.Message) (int64, error) {
	cl, err := b.env.client(kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		return 0, err
	}
	defer cl.Close()
	v, err := schemas.Encode(m)
	if err != nil {
		return 0, fmt.Errorf("bench: encode %s: %w", key, err)
	}
	recs := make([]*kgo.Record, b.cfg.Partitions)
	for p := range recs {
		recs[p] = &kgo.Record{Topic: b.names.EntitlementsTopic(), Partition: int32(p), Key: []byte(key), Value: v}
	}
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		return 0, err
	}
	written := time.Now().Add(entClockMargin).UnixMilli()
	for _, r := range recs {
		written = max(written, r.Timestamp.UnixMilli())
	}
	return written, nil
}

// entClockMargin is how far ahead of this machine's clock writeEnt allows
// the broker's clock to be.
const entClockMargin = 250 * time.Millisecond

// entTick is the entitlements tick of the aggregator with entitlements.
func (b *aggregateBench) entTick() time.Duration {
	if b.cfg.EntitlementsTick != 0 {
		return b.cfg.EntitlementsTick
	}
	return aggregator.DefaultEntitlementsTick
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
	// sent is the number of events the latency phases added to the input
	// (after the pre-filled records).
	sent int
	// lat is the latency phase after the rounds and revisions the last
	// round's revisions emitted (of the pre-filled input), without [0]
	// and with [1] entitlements; decisions the last round's decisions by
	// outcome.
	lat       [2]latencies
	revisions [2]float64
	decisions string
	// credits is the micro-credits the last round's aggregator with
	// entitlements drew.
	credits float64
	// cpu holds each round's CPU time of this process per event, in µs,
	// of the aggregator without [0] and with [1] entitlements, over the
	// pre-filled input (nothing else runs in the process meanwhile).
	cpu [2][]float64
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

// runNames are the topic names of the aggregator in round, with
// entitlements or not: its own changelog.
func (b *aggregateBench) runNames(round int, ent bool) topics.Names {
	n := b.roundNames(round)
	if ent {
		n.AggregateChangelog += "-ent"
	}
	return n
}

// specs are every topic of the benchmark, made before the first round.
func (b *aggregateBench) specs() []topics.Spec {
	specs := topics.Specs(b.names, b.layout)
	for i := range specs {
		if specs[i].Name == b.names.EventsTopic() {
			// Nothing is produced to usage.events here; its partition
			// count is the number of dedup sources the aggregator takes
			// from the cluster's metadata, and the input's watermarks
			// (aggregateWatermark) claim one source: with more, the
			// aggregator would ignore each of them, with a warning.
			specs[i].Partitions = 1
		}
	}
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
	// The aggregators' changelogs: one per round, and one for the
	// latency phases after them (latencyRun).
	for r := range b.cfg.Rounds + 1 {
		if r < b.cfg.Rounds {
			specs = append(specs,
				topics.Spec{Name: passChangelog(b.passA(), r), Partitions: p, Configs: map[string]string{"cleanup.policy": "compact"}},
				topics.Spec{Name: passChangelog(b.passB(), r), Partitions: p, Configs: map[string]string{"cleanup.policy": "compact"}},
			)
		}
		for _, ent := range []bool{false, true} {
			cl := aggChangelog
			cl.Name = b.runNames(r, ent).AggregateChangelogTopic()
			specs = append(specs, cl)
		}
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
	// Transactions of the aggregator's size (aggregator.Config's default).
	cfg.MaxBatchRecords = aggregator.DefaultMaxBatchRecords
	cfg.InputTopic = p.b.names.DedupedTopic()
	cfg.ChangelogTopic = passChangelog(p.out, round)
	return p.b.measurePass(ctx, p.name, cfg, p.out, p.state, p.b.input)
}

// aggregateRun is the aggregator, with entitlements or not, from the start
// of the input. Every run stops once it is measured: the latency phases
// come after every round (latencyRun), so that no run measures the events
// a latency phase added to the input.
type aggregateRun struct {
	b   *aggregateBench
	ent bool
}

// aggStage is an aggregator of the benchmark, not started.
type aggStage struct {
	st   *aggregator.Stage
	reg  *watchedRegistry
	name string
	// processed counts the records of usage.deduped handled: read, less
	// those waiting in the gate; not the records of usage.entitlements.
	processed func() int64
}

// newAgg builds the aggregator of round (its own group and changelog),
// with entitlements or not.
func (b *aggregateBench) newAgg(ctx context.Context, round int, ent bool) (*aggStage, error) {
	reg := newWatchedRegistry(metricRecordsIn, metricGated)
	group, name := fmt.Sprintf("%saggregate-r%d", b.names.Prefix, round), "aggregate"
	if ent {
		group, name = fmt.Sprintf("%saggregate-ent-r%d", b.names.Prefix, round), "aggregate with entitlements"
	}
	cfg := aggregator.Config{Stream: b.streamConfig(group, "a1"), Topics: b.runNames(round, ent), Meters: b.meters,
		Entitlements: ent, EntitlementsTick: b.cfg.EntitlementsTick}
	cfg.Stream.Registerer = reg
	st, err := aggregator.New(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if err := reg.check(); err != nil {
		return nil, err
	}
	return &aggStage{st: st, reg: reg, name: name, processed: func() int64 {
		w := reg.watched()
		return int64(metricWith(w, metricRecordsIn, "topic", b.names.DedupedTopic()) - sumMetrics(w, metricGated))
	}}, nil
}

func (a aggregateRun) Run(ctx context.Context, round int, last bool) (res Result, err error) {
	b := a.b
	ag, err := b.newAgg(ctx, round, a.ent)
	if err != nil {
		return Result{}, err
	}
	profile := b.cfg.CPUProfile
	if !a.ent && profile != "" {
		profile += ".without"
	}
	sp, err := b.measureStage(ctx, ag.st.Run, ag.processed, b.input, last, profile)
	defer func() {
		if err2 := b.stopLive(); err2 != nil && !errors.Is(err2, context.Canceled) && err == nil {
			err = err2
		}
	}()
	if err != nil {
		return Result{}, err
	}
	i := map[bool]int{false: 0, true: 1}[a.ent]
	us := sp.cpu.Seconds() * 1e6 / float64(sp.count)
	b.cpu[i] = append(b.cpu[i], us)
	res = Result{Name: ag.name, Count: sp.count, Elapsed: sp.elapsed, Startup: sp.startup,
		Detail: fmt.Sprintf("%s; %.2f µs CPU per event (this process); %s", sp.startupNote(), us, txnStats(ag.reg, sp.elapsed))}
	if !last {
		return res, nil
	}
	b.revisions[i] = sumMetrics(ag.reg, "meterline_aggregate_revisions_total")
	if a.ent {
		// Decisions are counted once the transaction after theirs begins:
		// the ticks of the balances still pending make it.
		decided := func() int64 { return int64(sumMetrics(ag.reg, "meterline_aggregate_entitlement_decisions_total")) }
		if err := b.waitFor(ctx, decided, int64(b.cfg.Events)); err != nil {
			return Result{}, fmt.Errorf("bench: decisions counted: %w", err)
		}
		b.decisions = decisionsOf(ag.reg)
		// Every event of the input is priced (benchRates) and the grant
		// pays: an aggregator that drew nothing measured caps alone.
		if b.credits = sumMetrics(ag.reg, "meterline_aggregate_credits_consumed_micro_total"); b.credits <= 0 {
			return Result{}, fmt.Errorf("bench: the aggregator with entitlements drew no credits (decisions: %s): the input is not priced by the rate card", b.decisions)
		}
	}
	return res, nil
}

// latencyRun runs the latency phase of the aggregator with entitlements
// or not, after every round: an aggregator of its own (round
// cfg.Rounds) reads the whole input, earlier latency phases' events
// included, untimed, then events are sent at a steady rate and timed to
// their OPEN revisions.
func (b *aggregateBench) latencyRun(ctx context.Context, ent bool) (err error) {
	ag, err := b.newAgg(ctx, b.cfg.Rounds, ent)
	if err != nil {
		return err
	}
	_, err = b.measureStage(ctx, ag.st.Run, ag.processed, b.input+b.sent, false, "")
	defer func() {
		if err2 := b.stopLive(); err2 != nil && !errors.Is(err2, context.Canceled) && err == nil {
			err = err2
		}
	}()
	if err != nil {
		return err
	}
	b.env.say("latency: %d events/s for %s, %s", b.cfg.LatencyRate, b.cfg.LatencyFor, ag.name)
	i := map[bool]int{false: 0, true: 1}[ent]
	if b.lat[i], err = b.latency(ctx); err != nil {
		return err
	}
	b.sent += int(float64(b.cfg.LatencyRate) * b.cfg.LatencyFor.Seconds())
	return nil
}

// waitFor waits until count reaches want.
func (b *aggregateBench) waitFor(ctx context.Context, count func() int64, want int64) error {
	deadline := time.Now().Add(5 * time.Minute)
	for count() < want {
		if time.Now().After(deadline) {
			return fmt.Errorf("bench: the aggregator read %d of %d records in 5m", count(), want)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return nil
}

// decisionsOf describes the decisions in reg by outcome.
func decisionsOf(reg prometheus.Gatherer) string {
	var parts []string
	for _, o := range []string{"accepted", schemas.ReasonOverLimit, schemas.ReasonNoCredit, schemas.ReasonInvalid} {
		parts = append(parts, fmt.Sprintf("%s %.0f", o, metricWith(reg, "meterline_aggregate_entitlement_decisions_total", "outcome", o)))
	}
	return strings.Join(parts, ", ")
}

// The metrics the benchmark polls while an aggregator runs (its records
// of usage.deduped handled: read, less those waiting in the gate).
const (
	metricRecordsIn = "meterline_stream_records_in_total"
	metricGated     = "meterline_aggregate_gated_records"
)

// metricWith sums the series of name in g whose label has value.
func metricWith(g prometheus.Gatherer, name, label, value string) float64 {
	mfs, _ := g.Gather()
	s := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					s += metricValue(m)
				}
			}
		}
	}
	return s
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
	// Its arrival, as dedup stamps it: the gate of an aggregator with
	// entitlements holds it until usage.entitlements is read up to it.
	e.IngestTime = time.Now().UnixMilli()
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
