// Package aggregator sums usage per customer, meter and billing period by
// event time, closes each period after a finalization cutoff, and books
// late events as adjustments (docs/design.md, Time).
//
// It reads usage.deduped (events and watermarks) and, in the same
// transaction as its state changes:
//
//   - emits one OPEN revision per aggregate changed by the transaction;
//   - once the partition watermark — the minimum over the latest watermark
//     of each usage.events partition (their number from the cluster's
//     metadata) — passes a period's end plus grace, decides the period
//     final, and then emits exactly one FINAL revision per aggregate of
//     that period, in chunks of at most FinalChunk per transaction
//     (finalize.go);
//   - turns an event whose arrival is after its period's end plus grace (or
//     whose period is already final) into an ADJUSTMENT booked into the
//     period that contains its arrival;
//   - rejects an event that would wrap a 64-bit sum or count (invalid).
//
// The invoice quantity of a period is its FINAL value plus the deltas of
// the adjustments booked into it.
//
// Files: aggregator.go (Config, Stage), meters.go (the meters file),
// processor.go (the stream.Processor and its partitions: the runtime's
// hooks and the cache of OPEN aggregates), events.go (events and
// watermarks), finalize.go (FINAL revisions, queued adjustments and expiry,
// in chunks), state.go (state keys and their encoding), output.go
// (revisions and rejects).
package aggregator

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/meterline/meterline/dedup"
	"github.com/meterline/meterline/entitlements"
	"github.com/meterline/meterline/internal/prom"
	"github.com/meterline/meterline/internal/service"
	"github.com/meterline/meterline/internal/stream"
	"github.com/meterline/meterline/internal/topics"
	"github.com/meterline/meterline/schemas"
)

// Config configures the aggregator.
type Config struct {
	// Stream configures the runtime; Stage, InputTopic and ChangelogTopic
	// are set from Topics, ChangelogMustKeep by New (stream.KeepForever),
	// and a zero MaxBatchRecords is DefaultMaxBatchRecords.
	Stream stream.Config
	// Topics names the topics.
	Topics topics.Names
	// Meters declares the meters; nil treats every meter as SUM.
	Meters *Catalog
	// StrictMeters rejects events of undeclared meters (unknown_meter)
	// instead of counting them as SUM.
	StrictMeters bool
	// Period is the billing period length. Default: DefaultPeriod.
	Period Period
	// Grace is how long after a period's end it stays open. Default:
	// DefaultGrace.
	Grace time.Duration
	// Window is the dedup window W: a period's working state is kept until
	// its end + W + Bucket + Skew, after which no event for it can arrive
	// and none can be booked into it. It must not be shorter than dedup's:
	// a watermark record that states a longer W stops the stage
	// (ErrWindowTooShort). Default: dedup's, dedup.DefaultWindow.
	Window time.Duration
	// Bucket is dedup's expiry bucket B (dedup.Config.Bucket). A re-routed
	// event keeps its original arrival (docs/design.md, Event identity and
	// keys, "Misrouted records"), so it can reach the aggregator after the
	// watermark passed its period's end + W; dedup accepts it as long as
	// the keys of its event_time − S may still be there, which it judges by
	// whole buckets: while its watermark is below event_time + W + B. A
	// final period's working state (what MAX, UNIQUE_COUNT and LATEST
	// adjustments are measured against) is therefore kept until its
	// end + W + B, and S more (Skew). It must not be shorter than dedup's:
	// a watermark record that states a longer B stops the stage
	// (ErrBucketTooShort). Default: dedup.DefaultBucket.
	Bucket time.Duration
	// Skew is dedup's skew S (dedup.Config.Skew): dedup accepts an event
	// whose event_time is up to S after its arrival, so a re-routed event
	// it accepts (event_time − S not before the keys it has expired, see
	// Bucket) can have arrived up to W + B + S before its watermark. With
	// Entitlements, the versions and rate cards that may decide or price
	// such an event are kept that long (pruneHorizon), and so is the state
	// of the period of its arrival, which its adjustment is booked into
	// (expiresAt). It must not be
	// shorter than dedup's: a watermark record that states a longer S
	// stops the stage (ErrSkewTooShort), with Entitlements or without, so
	// that turning them on later needs no other change. Default:
	// dedup.DefaultSkew.
	Skew time.Duration
	// FinalChunk is the most aggregates one transaction finalizes (emits
	// the FINAL revision of), books queued adjustments for, or expires, at
	// a period's end: that work scales with the state, not the input, and
	// is done in chunks over several transactions so that none outlasts the
	// transaction timeout (docs/design.md, Exactly-once, 7). Default:
	// DefaultFinalChunk.
	FinalChunk int
	// FinalChunkBytes bounds the same chunks in bytes: a chunk stops after
	// the key whose state (keys and values read, from the chunk's first)
	// reaches it, so that aggregates with large group values do not put
	// FinalChunk times an event's size in one transaction. What a chunk
	// writes is a few times that (a FINAL revision and two changelog
	// records per key). With Entitlements, a period start's, a
	// default-plan record's and the pending customers' chunks of balances
	// stop once their encoded bytes reach it (a plan of many caps and
	// grants makes balances of tens of kilobytes). Default:
	// DefaultFinalChunkBytes.
	FinalChunkBytes int
	// Entitlements turns on caps and credits (docs/entitlements.md, The
	// aggregator): the aggregator consumes Topics' entitlements topic with
	// the deduped topic (same partition count, partition p of both in the
	// same transactions), decides each event against the customer's
	// entitlements before it counts it, rejects it as over_limit or
	// no_credit otherwise, and emits balances to the balances topic
	// (entitlements.go). Default: off.
	Entitlements bool
	// EntitlementsTick is how often, with Entitlements, a tick is
	// appended to each owned partition of the entitlements topic while
	// the partition needs its read time to move (records wait in its
	// gate, or balances are pending): an
	// event waits until its entitlements partition has been read up to
	// its arrival, so this bounds the latency entitlements add. Negative:
	// no ticks (another process appends them, as tests do). Default:
	// DefaultEntitlementsTick.
	EntitlementsTick time.Duration
	// EntitlementsOrder is, with Entitlements, the order events are
	// decided in (docs/entitlements.md, Decision order):
	// EntitlementsOrderInput, each as it leaves the gate, in the order of
	// its partition of the deduped topic, which follows arrival only
	// while dedup keeps up; or EntitlementsOrderArrival, each once the
	// partition watermark has passed its arrival, in order of arrival
	// (then source partition and offset), whatever dedup's lag, at the
	// cost of waiting up to dedup's tick interval for the watermark.
	// Default: DefaultEntitlementsOrder.
	EntitlementsOrder string
	// EntitlementsMaxAhead bounds, with Entitlements, how far past its
	// own broker time in the deduped topic (its timestamp there, which
	// the broker stamps: the topic uses LogAppendTime, which New checks)
	// a record's time may be: an event's ingest_time is its arrival in the
	// events topic, before dedup wrote it, and a watermark is a broker
	// time dedup had read.
	// A record past it would hold the gate, and every record behind it,
	// until the entitlements partition is read that far: it is rejected
	// (invalid) when its turn comes instead. Default:
	// DefaultEntitlementsMaxAhead.
	EntitlementsMaxAhead time.Duration
	// BalanceInterval is, with Entitlements, how often in broker time the
	// balances of changed customers go out (docs/entitlements.md, The
	// aggregator, 4: a balance at most once per transaction that changed
	// the customer). A changed customer is pending, in the state, until the
	// partition's broker time (its watermark, or the time up to which its
	// entitlements partition has been read) is BalanceInterval past the
	// start of the last emission of the pending customers; then every
	// pending customer's balance goes out, in key order and in chunks of
	// FinalChunk, as of the later of the watermark and the latest broker
	// time of its changes. A customer thus gets one balance per emission,
	// emissions start at least BalanceInterval apart, and ticks keep the
	// broker time moving while customers are pending: a change reaches the
	// balances topic within about BalanceInterval plus EntitlementsTick and
	// a few commit intervals. A period start's balances (usage 0 of the new
	// period) go out as the period starts, whatever the interval, after the
	// FINAL revisions of the period that ended and in chunks of FinalChunk;
	// the pending customers wait for them (most are among them). Negative
	// (BalanceEveryTransaction): each transaction emits the balance of
	// every customer it changed. Default: DefaultBalanceInterval.
	BalanceInterval time.Duration
	// AllowCreateTime lets the aggregator start, with Entitlements, on an
	// entitlements or deduped topic whose message.timestamp.type is not
	// LogAppendTime. An entitlement is in effect from its broker timestamp
	// and an event is decided by the entitlements in effect at its arrival
	// (docs/entitlements.md, The ordering rule: broker time); with
	// CreateTime every writer of the topic would choose which entitlements
	// decide which events. A record's timestamp in the deduped topic bounds
	// its time (EntitlementsMaxAhead); with CreateTime it would be dedup's
	// clock, and a dedup host whose clock is behind would have every event
	// rejected. New reads both topics' setting once and refuses either
	// (*topics.TimestampTypeError) unless this is set; then it logs a
	// warning per topic. While it runs, a CreateTime record of a topic
	// after a LogAppendTime one of the same partition stops the stage
	// with that error naming the record (arrival.go), unless this is set.
	// For tests and replays that choose broker times, never for
	// production. Default: false.
	AllowCreateTime bool
}

// The defaults of Config (EnsureDefaults), which the CLI's flags show too.
const (
	// DefaultGroup is the consumer group, Stream.Group. Its members
	// balance with stream.CopartitionBalancer, an eager protocol that the
	// cooperative-sticky members of the earlier group
	// "meterline-aggregate" cannot join, hence the new name.
	DefaultGroup = "meterline-aggregate-v2"
	// DefaultPeriod is the billing period.
	DefaultPeriod = Month
	// DefaultGrace is how long a period stays open after its end.
	DefaultGrace = 48 * time.Hour
	// DefaultFinalChunk is about what a transaction of
	// stream.DefaultMaxBatchRecords input records carries.
	DefaultFinalChunk = 10_000
	// DefaultFinalChunkBytes bounds the state one chunk reads: 10,000
	// keys of a few hundred bytes, while keys with group values of
	// kilobytes (an event is up to schemas.MaxEventBytes) are cut at
	// 4 MiB. What a chunk writes is a few times that: a FINAL revision
	// and two changelog records per key.
	DefaultFinalChunkBytes = 4 << 20
	// DefaultMaxBatchRecords is the aggregator's Stream.MaxBatchRecords:
	// larger than the runtime's default, because what a transaction
	// writes grows with the keys it changed (an OPEN revision per
	// aggregate, with entitlements each customer's usage, grants and
	// pending balance), not with its events: 50,000 events of 5,000
	// customers a transaction measured 1.4 to 2.6 times the events per
	// second of 10,000 with entitlements and 1.5 to 1.7 times without
	// (docs/benchmarks.md). A transaction that meets its commit interval
	// first (CommitInterval) ends there: live input, far below this rate,
	// sees the same latency.
	DefaultMaxBatchRecords = 50_000
	// DefaultEntitlementsTick: an event waits for the next tick read back
	// (a commit interval and a fetch later), so that produce to OPEN
	// revision stays under a second at the 99th percentile.
	DefaultEntitlementsTick = 200 * time.Millisecond
	// DefaultEntitlementsOrder: the lower latency; EntitlementsOrderArrival
	// waits up to dedup's tick interval more (docs/entitlements.md,
	// Decision order).
	DefaultEntitlementsOrder = EntitlementsOrderInput
	// DefaultEntitlementsMaxAhead is dedup's default skew S: room for
	// the clocks of two brokers.
	DefaultEntitlementsMaxAhead = dedup.DefaultSkew
	// DefaultBalanceInterval: with 10,000 events of 5,000 customers in a
	// transaction, a balance per transaction that changed a customer is
	// about one balance per two events; once a second is a few records
	// per customer and second, and a cap reached shows in the balances
	// topic (the ingest's quota gate) a second or two later.
	DefaultBalanceInterval = time.Second
	// BalanceEveryTransaction is the BalanceInterval that emits, in each
	// transaction, the balance of every customer it changed.
	BalanceEveryTransaction time.Duration = -1
)

// EnsureDefaults fills zero fields with their defaults.
func (c *Config) EnsureDefaults() {
	if c.Period == "" {
		c.Period = DefaultPeriod
	}
	if c.Grace == 0 {
		c.Grace = DefaultGrace
	}
	if c.Window == 0 {
		c.Window = dedup.DefaultWindow
	}
	if c.Bucket == 0 {
		c.Bucket = dedup.DefaultBucket
	}
	if c.Skew == 0 {
		c.Skew = dedup.DefaultSkew
	}
	if c.FinalChunk == 0 {
		c.FinalChunk = DefaultFinalChunk
	}
	if c.FinalChunkBytes == 0 {
		c.FinalChunkBytes = DefaultFinalChunkBytes
	}
	if c.Topics == (topics.Names{}) {
		c.Topics = topics.DefaultNames()
	}
	c.Stream.Stage = "aggregate"
	if c.Stream.MaxBatchRecords == 0 {
		c.Stream.MaxBatchRecords = DefaultMaxBatchRecords
	}
	c.Stream.InputTopic = c.Topics.DedupedTopic()
	c.Stream.ChangelogTopic = c.Topics.AggregateChangelogTopic()
	if c.EntitlementsTick == 0 {
		c.EntitlementsTick = DefaultEntitlementsTick
	}
	if c.EntitlementsMaxAhead <= 0 {
		c.EntitlementsMaxAhead = DefaultEntitlementsMaxAhead
	}
	if c.EntitlementsOrder == "" {
		c.EntitlementsOrder = DefaultEntitlementsOrder
	}
	if c.BalanceInterval == 0 {
		c.BalanceInterval = DefaultBalanceInterval
	}
	// With entitlements, misrouted records of the entitlements topic (and
	// its ticks) are produced to it.
	c.Stream.OutputTopics = []string{c.Topics.AggregatesTopic(), c.Topics.AdjustmentsTopic(), c.Topics.RejectedTopic()}
	if c.Entitlements {
		c.Stream.OutputTopics = append(c.Stream.OutputTopics, c.Topics.EntitlementsTopic(), c.Topics.BalancesTopic())
		c.Stream.CopartitionedTopics = []string{c.Topics.EntitlementsTopic()}
		if c.EntitlementsTick > 0 {
			c.Stream.PunctuateInterval = c.EntitlementsTick
		}
	}
	if c.Stream.Group == "" {
		c.Stream.Group = DefaultGroup
	}
	c.Stream.EnsureDefaults()
}

// Validate reports every problem at once.
func (c *Config) Validate() error {
	var errs []error
	if err := c.Period.Validate(); err != nil {
		errs = append(errs, err)
	}
	if c.Grace < 0 {
		errs = append(errs, fmt.Errorf("aggregator: grace must not be negative (got %s)", c.Grace))
	}
	if c.Window <= 0 {
		errs = append(errs, fmt.Errorf("aggregator: window must be positive (got %s)", c.Window))
	}
	if c.Bucket < 0 {
		errs = append(errs, fmt.Errorf("aggregator: bucket must not be negative (got %s)", c.Bucket))
	}
	if c.Skew <= 0 {
		errs = append(errs, fmt.Errorf("aggregator: skew must be positive (got %s)", c.Skew))
	}
	if c.FinalChunk <= 0 {
		errs = append(errs, fmt.Errorf("aggregator: final-chunk must be positive (got %d)", c.FinalChunk))
	}
	if c.FinalChunkBytes <= 0 {
		errs = append(errs, fmt.Errorf("aggregator: final-chunk-bytes must be positive (got %d)", c.FinalChunkBytes))
	}
	if o := c.EntitlementsOrder; o != EntitlementsOrderInput && o != EntitlementsOrderArrival {
		errs = append(errs, fmt.Errorf("aggregator: entitlements-order must be %q or %q (got %q)", EntitlementsOrderArrival, EntitlementsOrderInput, o))
	}
	return errors.Join(append(errs, c.Stream.Validate())...)
}

// ErrWindowTooShort is returned (wrapped) by Run when a watermark record
// states a dedup window W longer than Config.Window: the aggregator would
// drop a period's working state while dedup still accepts events for it, so
// it stops rather than compute adjustments against missing state.
var ErrWindowTooShort = errors.New("aggregator: window shorter than dedup's")

// ErrBucketTooShort is returned (wrapped) by Run when a watermark record
// states a dedup expiry bucket B longer than Config.Bucket: the aggregator
// would drop a final period's working state while dedup still accepts a
// re-routed event for it, so it stops rather than compute adjustments
// against missing state.
var ErrBucketTooShort = errors.New("aggregator: expiry bucket shorter than dedup's")

// ErrSkewTooShort is returned (wrapped) by Run when a watermark record
// states a dedup skew S longer than Config.Skew: with Entitlements, the
// aggregator would prune the entitlements history that may decide and
// price a re-routed event dedup still accepts, so it stops rather than
// decide such an event against versions already gone.
var ErrSkewTooShort = errors.New("aggregator: skew shorter than dedup's")

// Stage is an aggregator instance.
type Stage struct {
	rt *stream.Runtime
	pr *processor
}

// ledgerConfig is the configuration of the aggregator's Ledger: its
// versions count within W + B + S of a record's broker time, the span
// the partitions prune to below their watermarks (pruneHorizon).
func (c *Config) ledgerConfig() entitlements.Config {
	return entitlements.Config{Prefix: []byte{pfxLedger}, Window: c.Window, Span: c.Window + c.Bucket + c.Skew, Period: c.Period.Bounds}
}

// New prepares an aggregator instance.
func New(ctx context.Context, cfg Config) (*Stage, error) {
	cfg.EnsureDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	counts, err := partitionCounts(ctx, cfg)
	if err != nil {
		return nil, err
	}
	log := cfg.Stream.Logger.With(zap.String("stage", "aggregate"), zap.String("instance", cfg.Stream.InstanceID))
	// Open aggregates, final periods and accounts live as long as their
	// keys: a restore must read every record the changelog holds.
	if err := topics.CheckChangelogKeeps(ctx, cfg.Stream.Kafka, "aggregator", log, cfg.Topics.AggregateChangelogTopic(), 0); err != nil {
		return nil, err
	}
	// And so while it runs, and before each restore (stream.Config).
	cfg.Stream.ChangelogMustKeep = stream.KeepForever
	// usage.deduped is keyed by customer: compaction would keep only a
	// customer's last event.
	if err := topics.CheckEventLog(ctx, cfg.Stream.Kafka, "aggregator", log, cfg.Topics.DedupedTopic()); err != nil {
		return nil, err
	}
	var ledger *entitlements.Ledger
	if cfg.Entitlements {
		if err := topics.CheckArrivalTimestamps(ctx, cfg.Stream.Kafka, "aggregator", cfg.AllowCreateTime, log,
			cfg.Topics.EntitlementsTopic(), cfg.Topics.DedupedTopic()); err != nil {
			return nil, err
		}
		if ledger, err = entitlements.New(cfg.ledgerConfig()); err != nil {
			return nil, fmt.Errorf("aggregator: %w", err)
		}
	}
	p := &processor{
		ledger:          ledger,
		cfg:             cfg,
		aggregatesTopic: cfg.Topics.AggregatesTopic(),
		log:             log,
		counts:          counts,
		m:               newMetrics(cfg.Stream.Registerer),
		now:             cfg.Stream.Clock.Now,
	}
	p.m.initSeries(cfg.Entitlements)
	rt, err := stream.New(cfg.Stream, p)
	if err != nil {
		return nil, err
	}
	return &Stage{rt: rt, pr: p}, nil
}

// Run runs until ctx ends or a fatal error.
func (s *Stage) Run(ctx context.Context) error { return s.rt.Run(ctx) }

// Ready reports whether the stage is ready (stream.Runtime.Ready); it
// backs /readyz.
func (s *Stage) Ready() error { return s.rt.Ready() }

// Status describes the stage for the status page, as the runtime reports
// it (service.Stage).
func (s *Stage) Status() service.StageStatus { return service.StageStatusOf(s.rt) }

// partitionCountsT holds partition counts read from the cluster's metadata
// at start. events, the partition count of usage.events, is the number of
// dedup source partitions whose watermarks the aggregator takes the minimum
// over (docs/design.md, Time): it never comes from a record.
type partitionCountsT struct{ events, deduped, aggregates, adjustments, rejected, entitlements, balances int32 }

func partitionCounts(ctx context.Context, cfg Config) (partitionCountsT, error) {
	names := []string{cfg.Topics.EventsTopic(), cfg.Topics.DedupedTopic(), cfg.Topics.AggregatesTopic(), cfg.Topics.AdjustmentsTopic(),
		cfg.Topics.RejectedTopic(), cfg.Topics.AggregateChangelogTopic()}
	if cfg.Entitlements {
		names = append(names, cfg.Topics.EntitlementsTopic(), cfg.Topics.BalancesTopic())
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	n, err := topics.PartitionCounts(ctx, cfg.Stream.Kafka, names...)
	if err != nil {
		return partitionCountsT{}, fmt.Errorf("aggregator: %w", err)
	}
	if a, b := n[cfg.Topics.AggregateChangelogTopic()], n[cfg.Topics.DedupedTopic()]; a != b {
		return partitionCountsT{}, fmt.Errorf("aggregator: changelog %s has %d partitions, %s has %d; they must be equal",
			cfg.Topics.AggregateChangelogTopic(), a, cfg.Topics.DedupedTopic(), b)
	}
	if a, b := n[cfg.Topics.EntitlementsTopic()], n[cfg.Topics.DedupedTopic()]; cfg.Entitlements && a != b {
		return partitionCountsT{}, fmt.Errorf("aggregator: %s has %d partitions, %s has %d; they must be co-partitioned (docs/entitlements.md, Topics)",
			cfg.Topics.EntitlementsTopic(), a, cfg.Topics.DedupedTopic(), b)
	}
	return partitionCountsT{events: n[cfg.Topics.EventsTopic()], deduped: n[cfg.Topics.DedupedTopic()], aggregates: n[cfg.Topics.AggregatesTopic()],
		adjustments: n[cfg.Topics.AdjustmentsTopic()], rejected: n[cfg.Topics.RejectedTopic()],
		entitlements: n[cfg.Topics.EntitlementsTopic()], balances: n[cfg.Topics.BalancesTopic()]}, nil
}

type metrics struct {
	emitted *prometheus.CounterVec
	// emitted's two series
	emittedOpen, emittedFinal prometheus.Counter
	finalDelay                prometheus.Observer
	watermark                 *prometheus.GaugeVec
	late                      *prometheus.CounterVec
	rejected                  *prometheus.CounterVec
	keys                      *prometheus.GaugeVec
	wmIgnored                 *prometheus.CounterVec
	chunks                    *prometheus.CounterVec
	finalizing                *prometheus.GaugeVec
	finalDue                  *prometheus.GaugeVec // due.go
	// entitlements (entitlements.go and the ent*.go beside it)
	decisions  *prometheus.CounterVec
	credits    *prometheus.CounterVec
	refunds    *prometheus.CounterVec
	refunded   *prometheus.CounterVec
	entRecords *prometheus.CounterVec
	gated      *prometheus.GaugeVec
	held       *prometheus.GaugeVec // entorder.go
	heldOldest *prometheus.GaugeVec
	readTo     *prometheus.GaugeVec
	balances   prometheus.Counter
	// pendingBalances: customers whose balance changed and has not gone
	// out yet (Config.BalanceInterval), per partition.
	pendingBalances *prometheus.GaugeVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	f := prom.NewFactory(reg)
	m := &metrics{
		emitted: f.NewCounterVec(prometheus.CounterOpts{Name: "meterline_aggregate_revisions_total",
			Help: "Aggregate revisions emitted (in transactions), by status OPEN or FINAL."}, []string{"status"}),
		finalDelay: f.NewHistogram(prometheus.HistogramOpts{Name: "meterline_aggregate_finalization_delay_seconds",
			Help:    "Wall time minus the period's end + grace when its FINAL revisions go out.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 20)}),
		watermark: f.NewGaugeVec(prometheus.GaugeOpts{Name: "meterline_aggregate_watermark_seconds",
			Help: "Aggregator partition watermark (minimum over dedup sources), Unix seconds; 0 while a source has forwarded none."}, []string{"partition"}),
		late: f.NewCounterVec(prometheus.CounterOpts{Name: "meterline_aggregate_late_events_total",
			Help: "Late events booked as adjustments, by aggregation."}, []string{"aggregation"}),
		rejected: prom.RejectedCounter(reg, "aggregator", schemas.ReasonUndecodable, schemas.ReasonUnknownSchema,
			schemas.ReasonInvalid, schemas.ReasonUnknownMeter, schemas.ReasonOverLimit, schemas.ReasonNoCredit),
		keys: f.NewGaugeVec(prometheus.GaugeOpts{Name: "meterline_aggregate_state_keys",
			Help: "Aggregates held in state, per partition: OPEN aggregates, and those of periods decided final until the period expires. Lines of adjustments only are not counted (they have no aggregate), nor the state beside the aggregates (UNIQUE_COUNT values, queued events)."}, []string{"partition"}),
		wmIgnored: f.NewCounterVec(prometheus.CounterOpts{Name: "meterline_aggregate_watermarks_ignored_total",
			Help: "Watermark records ignored because they disagree with the cluster's metadata, by reason: source_partitions (the count is not usage.events' partition count), source_partition (outside [0, that count))."}, []string{"reason"}),
		chunks: f.NewCounterVec(prometheus.CounterOpts{Name: "meterline_aggregate_chunks_total",
			Help: "Chunks of a period's end-of-period work, one per transaction, by work: final (FINAL revisions), book (queued adjustments), expire (state tombstones); with entitlements, at a period start, balances (customers' balances), prune (usage no event can reach); and after a default-plan record, default_plan (the balances of the customers with usage in the period)."}, []string{"work"}),
		finalizing: f.NewGaugeVec(prometheus.GaugeOpts{Name: "meterline_aggregate_finalizing_periods",
			Help: "Periods decided final whose FINAL revisions, or the adjustments queued behind them, are still going out in chunks, per partition."}, []string{"partition"}),
		finalDue: f.NewGaugeVec(prometheus.GaugeOpts{Name: "meterline_aggregate_final_due_seconds",
			Help: "End + grace of the oldest period of the partition whose FINAL revisions (or the adjustments queued behind them) have not all gone out, Unix seconds: when they were or are due. Absent while there is none. In the past by more than a moment: a FINAL is overdue."}, []string{"partition"}),
	}
	m.decisions = f.NewCounterVec(prometheus.CounterOpts{Name: "meterline_aggregate_entitlement_decisions_total",
		Help: "Events decided against their customer's entitlements, by outcome (accepted, over_limit, no_credit, invalid) and plan (the first 64 plan names, then other; none: no plan)."}, []string{"outcome", "plan"})
	m.credits = f.NewCounterVec(prometheus.CounterOpts{Name: "meterline_aggregate_credits_consumed_micro_total",
		Help: "Micro-credits charged for accepted events (drawn from grants or overdrawn), by plan."}, []string{"plan"})
	m.refunds = f.NewCounterVec(prometheus.CounterOpts{Name: "meterline_aggregate_entitlement_refunds_total",
		Help: "Accepted events whose booking behind their period's FINAL revisions refused them (a sum that would wrap, a meter no longer declared): their charge is taken back. Each was counted as accepted in meterline_aggregate_entitlement_decisions_total; by plan."}, []string{"plan"})
	m.refunded = f.NewCounterVec(prometheus.CounterOpts{Name: "meterline_aggregate_credits_refunded_micro_total",
		Help: "Micro-credits of the refunded charges (meterline_aggregate_entitlement_refunds_total), counted in meterline_aggregate_credits_consumed_micro_total when charged; consumed less refunded is what accepted events cost. By plan."}, []string{"plan"})
	m.entRecords = f.NewCounterVec(prometheus.CounterOpts{Name: "meterline_aggregate_entitlements_records_total",
		Help: "Records of the entitlements topic read, by result: applied, tick, rejected (to usage.rejected), rerouted (re-produced to the customer's partition), rerouted_repeat (a re-produced or restated record whose original is no later than the last record of its key applied: not applied), moved_mark (the delete written after a record moved, on its wrong partition: skipped); counted once their transaction committed."}, []string{"result"})
	m.gated = f.NewGaugeVec(prometheus.GaugeOpts{Name: "meterline_aggregate_gated_records",
		Help: "Records of the deduped topic waiting until the entitlements partition has been read up to their time, per partition."}, []string{"partition"})
	m.held = f.NewGaugeVec(prometheus.GaugeOpts{Name: "meterline_aggregate_held_events",
		Help: "With --entitlements-order arrival: events out of the gate waiting until the partition watermark passes their arrival, per partition."}, []string{"partition"})
	m.heldOldest = f.NewGaugeVec(prometheus.GaugeOpts{Name: "meterline_aggregate_held_oldest_arrival_seconds",
		Help: "With --entitlements-order arrival: arrival (Unix seconds) of the partition's oldest held event; absent while none is held. Far behind wall time: the partition watermark stands still (a dedup source stopped forwarding it)."}, []string{"partition"})
	m.readTo = f.NewGaugeVec(prometheus.GaugeOpts{Name: "meterline_aggregate_entitlements_read_to_seconds",
		Help: "Broker time (Unix seconds) up to which the partition's usage.entitlements partition has been read: events that arrived before it can be decided, later ones wait in the gate. Ticks move it forward while the partition has input, records waiting or balances pending; an idle partition's stands still."}, []string{"partition"})
	m.balances = f.NewCounter(prometheus.CounterOpts{Name: "meterline_aggregate_balances_total",
		Help: "Balance records emitted (in transactions)."})
	m.pendingBalances = f.NewGaugeVec(prometheus.GaugeOpts{Name: "meterline_aggregate_balances_pending",
		Help: "Customers whose balance changed and has not gone to the balances topic yet, per partition: they go out together once the partition's broker time is --balance-interval past the last time they did."}, []string{"partition"})
	m.emittedOpen = m.emitted.WithLabelValues(string(schemas.StatusOpen))
	m.emittedFinal = m.emitted.WithLabelValues(string(schemas.StatusFinal))
	return m
}

// Label values of the aggregator's counters, every one exported at 0 from
// the start (initSeries).
var (
	aggregations     = []Aggregation{Sum, Count, Max, UniqueCount, Latest}
	chunkWork        = []string{"final", "book", "expire"}
	entChunkWork     = []string{"balances", "default_plan", "prune"}
	ignoredWatermark = []string{"source_partitions", "source_partition"}
	entRecordResults = []string{"applied", "tick", "rejected", "rerouted", "rerouted_repeat", "moved_mark"}
)

// initSeries exports at 0, from the start, every series of the
// aggregator's counters whose labels are known then: aggregations, kinds
// of work, reasons and results, as the rejections (prom.RejectedCounter).
// A series born at its first increment hides that increment from rate()
// and increase(), and an alert on a ratio or on absent() misreads a
// series that is not there. Those of the entitlements only with them; the
// decisions and credits are labelled by plan, known only from the
// entitlements topic, and appear with their plan.
func (m *metrics) initSeries(entitlements bool) {
	for _, a := range aggregations {
		m.late.WithLabelValues(string(a))
	}
	work := chunkWork
	if entitlements {
		work = append(slices.Clone(work), entChunkWork...)
		for _, r := range entRecordResults {
			m.entRecords.WithLabelValues(r)
		}
	}
	for _, w := range work {
		m.chunks.WithLabelValues(w)
	}
	for _, r := range ignoredWatermark {
		m.wmIgnored.WithLabelValues(r)
	}
}
