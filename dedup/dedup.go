// Package dedup drops duplicate copies of usage events, exactly once
// (docs/design.md, Dedup).
//
// It reads usage.events in order per partition and, for each record:
//
//   - rejects bad input to usage.rejected with a stable reason code,
//     bounded (a prefix of the raw bytes, their length and SHA-256);
//   - re-routes a misrouted event to its canonical partition, with signed
//     headers that keep its arrival (auth.go);
//   - rejects an event outside the window (too_old, in_future), judged by
//     the record's broker arrival time;
//   - forwards the first copy of an identity to usage.deduped and every
//     later copy to usage.duplicates, flagged conflict when its payload
//     differs;
//   - advances the partition watermark (largest broker timestamp seen) and,
//     on a tick record it signed, forwards it to every usage.deduped
//     partition, at most once per WatermarkEvery of broker time.
//
// The store runs on internal/stream, so every decision, its outputs and the
// consumed offset commit together.
//
// Files: dedup.go (Config, Stage), processor.go (the stream.Processor and
// its partitions: Open, Abort, Flush, Committed, Close), decide.go
// (Process and each record's decision: reject, forward, or drop as a
// duplicate), reroute.go (what dedup writes to usage.events and reads
// back: re-routed events and ticks, and the watermark ticks forward),
// state.go (state keys, identity values, lookup and expiry buckets),
// auth.go (the signed headers), keyuse.go (the key ring's last uses),
// skew.go (the S the keys were accepted under), bloom.go (the Bloom
// filter), standby.go (a partition's filters per bucket, kept warm on a
// standby).
package dedup

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"go.uber.org/zap"

	"github.com/meterline/meterline/internal/kafka"
	"github.com/meterline/meterline/internal/prom"
	"github.com/meterline/meterline/internal/service"
	"github.com/meterline/meterline/internal/stream"
	"github.com/meterline/meterline/internal/topics"
	"github.com/meterline/meterline/schemas"
)

// Config configures the dedup stage.
type Config struct {
	// Stream configures the runtime. Its Stage, InputTopic and
	// ChangelogTopic are set from Topics by New, and ChangelogMustKeep
	// to W + S + B.
	Stream stream.Config
	// Topics names the topics.
	Topics topics.Names
	// Window is W: an event is accepted only if arrival − W < event_time,
	// and a key is kept W + Skew after its first arrival. Default:
	// DefaultWindow.
	Window time.Duration
	// Skew is S: an event is accepted only if event_time ≤ arrival + S.
	// Zero is the default, DefaultSkew, as it is for Window and Bucket; S
	// cannot be 0, which would reject as in_future every event of a
	// producer whose clock runs ahead of the broker's (the CLI refuses a
	// flag set to 0). Default: DefaultSkew.
	Skew time.Duration
	// TickInterval is how often a tick record is appended to each owned
	// usage.events partition. Default: DefaultTickInterval.
	TickInterval time.Duration
	// Bucket is the granularity of expiry: keys are grouped by the bucket
	// of their first arrival and a whole bucket is dropped once all its keys
	// are past W + S, so a key lives at most one bucket longer than
	// required. The state records it: identity keys are stored under the
	// number of their arrival bucket, which means another time with another
	// bucket, so dedup refuses to run on a state recorded with another one
	// (ErrBucketChanged). Default: DefaultBucket.
	Bucket time.Duration
	// Keys authenticate the headers dedup writes on re-routed records and
	// ticks (docs/design.md, Event identity and keys): HMAC-SHA256 under
	// Keys[0]; any of Keys verifies. Every dedup instance of a deployment
	// must hold the same keys. A retired key stays for the retention of the
	// events topic, so that a record it signed keeps its arrival: the state
	// records the broker time each key last signed at, and dedup refuses to
	// run (ErrKeyStillNeeded) without a key whose last use is within that
	// retention. Required: LoadKeys reads them from a file or from
	// METERLINE_DEDUP_KEYS, GenerateKey makes one.
	Keys []Key
	// ForgetKeys are key IDs removed from Keys on purpose while records
	// they signed may remain in the events topic (a leaked secret):
	// dedup then runs without them, and those records are ordinary
	// producer records (their arrival is their broker timestamp). None
	// may be in Keys. Default: none.
	ForgetKeys []string
	// Sources are the event sources that get their own label on dedup's
	// per-source metrics (meterline_dedup_accepted_total,
	// meterline_dedup_duplicates_total); every other source is counted as
	// "other", so producers cannot create unbounded label sets
	// (docs/operations.md, Dedup keys). At most MaxSources; "other"
	// itself is refused. Default: none (all "other").
	Sources []string
	// MaxRecordBytes bounds every record dedup derives from one input (a
	// rejection, a duplicate, a re-route), key, value and headers: it is
	// checked before the record is emitted, and an input whose derived
	// record would exceed it is rejected as oversized instead
	// (docs/design.md, Bad input). At least schemas.MaxRejectedBytes.
	// Default: DefaultMaxRecordBytes.
	MaxRecordBytes int
	// WatermarkEvery is the least broker time between two ticks that
	// forward the watermark; ticks closer together forward nothing, so a
	// flood of ticks cannot fan out one watermark record per usage.deduped
	// partition each. Default: TickInterval / 2.
	WatermarkEvery time.Duration
	// AllowCreateTime lets dedup start on an events topic whose
	// message.timestamp.type is not LogAppendTime. Dedup takes a record's
	// timestamp as its arrival (docs/design.md, Time); with CreateTime that
	// is the producer's clock, so every producer could place its events
	// outside the window and move the watermarks. New reads the topic's
	// setting once and refuses it (*topics.TimestampTypeError) unless this
	// is set; then it logs a warning. Without it, a CreateTime record after
	// a LogAppendTime one in a partition (the setting changed while dedup
	// ran) stops the stage with that error too. For tests and replays that
	// choose arrival times, never for production. Default: false.
	AllowCreateTime bool
}

// MaxSources bounds Config.Sources.
const MaxSources = 1000

// The defaults of Config (EnsureDefaults), which the CLI's flags show too.
const (
	// DefaultGroup is the consumer group, Stream.Group.
	DefaultGroup = "meterline-dedup"
	// DefaultWindow is W, 35 days. The aggregator keeps a final period's
	// working state for as long (aggregator.Config.Window), and the topics
	// that must hold W keep it (topics.Layout).
	DefaultWindow = 35 * 24 * time.Hour
	// DefaultSkew is S.
	DefaultSkew = time.Hour
	// DefaultTickInterval is the tick interval.
	DefaultTickInterval = 5 * time.Second
	// DefaultBucket is the expiry granularity.
	DefaultBucket = 24 * time.Hour
	// DefaultMaxRecordBytes is under kgo's default batch limit (1,000,012)
	// and Kafka's default message.max.bytes (1,048,588), with room for the
	// batch framing.
	DefaultMaxRecordBytes = 990_000
)

// EnsureDefaults fills zero fields with their defaults.
func (c *Config) EnsureDefaults() {
	if c.Window == 0 {
		c.Window = DefaultWindow
	}
	if c.Skew == 0 {
		c.Skew = DefaultSkew
	}
	if c.TickInterval == 0 {
		c.TickInterval = DefaultTickInterval
	}
	if c.Bucket == 0 {
		c.Bucket = DefaultBucket
	}
	if c.MaxRecordBytes == 0 {
		c.MaxRecordBytes = DefaultMaxRecordBytes
	}
	if c.WatermarkEvery == 0 {
		c.WatermarkEvery = c.TickInterval / 2
	}
	if c.Topics == (topics.Names{}) {
		c.Topics = topics.DefaultNames()
	}
	c.Stream.Stage = "dedup"
	c.Stream.InputTopic = c.Topics.EventsTopic()
	c.Stream.ChangelogTopic = c.Topics.DedupChangelogTopic()
	// Re-routed records go back to the events topic.
	c.Stream.OutputTopics = []string{c.Topics.DedupedTopic(), c.Topics.DuplicatesTopic(), c.Topics.RejectedTopic(), c.Topics.EventsTopic()}
	c.Stream.PunctuateInterval = c.TickInterval
	// Producers write usage.events: a batch they write that the Kafka
	// client reads at offsets not its own would make it skip others'
	// records (internal/stream/gaps.go).
	c.Stream.VerifyInputGaps = true
	if c.Stream.Group == "" {
		c.Stream.Group = DefaultGroup
	}
	c.Stream.EnsureDefaults()
}

// MaxLiveBuckets bounds the arrival buckets a partition keeps keys in,
// those a key's lifetime W + S spans and the one it starts in
// (Config.Validate).
const MaxLiveBuckets = 1000

// liveBuckets returns how many buckets of b keys living life span.
func liveBuckets(life, b time.Duration) int64 {
	return int64((life+b-1)/b) + 1
}

// Validate reports every problem at once.
func (c *Config) Validate() error {
	var errs []error
	if c.Window <= 0 {
		errs = append(errs, fmt.Errorf("dedup: window must be positive (got %s)", c.Window))
	}
	if c.Skew <= 0 {
		errs = append(errs, fmt.Errorf("dedup: skew must be positive (got %s)", c.Skew))
	}
	if c.TickInterval <= 0 {
		errs = append(errs, fmt.Errorf("dedup: tick-interval must be positive (got %s)", c.TickInterval))
	}
	if c.Bucket < time.Second {
		errs = append(errs, fmt.Errorf("dedup: bucket must be at least 1s (got %s)", c.Bucket))
	} else if c.Window > 0 && c.Skew > 0 {
		// Each live bucket holds a Bloom filter of at least bloomFirstCap
		// keys, and every lookup tests each one.
		if n := liveBuckets(c.Window+c.Skew, c.Bucket); n > MaxLiveBuckets {
			// The shortest bucket, in whole seconds, that spans W + S in
			// MaxLiveBuckets − 1 buckets.
			per := (MaxLiveBuckets - 1) * time.Second
			least := (c.Window + c.Skew + per - 1) / per * time.Second
			errs = append(errs, fmt.Errorf("dedup: bucket %s is too short for window %s and skew %s: a partition would keep %d buckets of keys, at most %d "+
				"(each holds a Bloom filter of at least %d KB in memory, and every event is looked up in each); use a bucket of at least %s",
				c.Bucket, c.Window, c.Skew, n, MaxLiveBuckets, bloomFirstCap*bloomBitsPerKey/8/1024, least))
		}
	}
	if err := validateKeys(c.Keys); err != nil {
		errs = append(errs, err)
	}
	for _, id := range c.ForgetKeys {
		switch {
		case !validKeyID(id):
			errs = append(errs, fmt.Errorf("dedup: forget-ids: a key ID (%d bytes) must be 1 to %d bytes of [A-Za-z0-9._-]", len(id), maxKeyIDBytes))
		case slices.ContainsFunc(c.Keys, func(k Key) bool { return k.ID == id }):
			errs = append(errs, fmt.Errorf("dedup: forget-ids: %q is in the key ring; forget only a key removed from it", id))
		}
	}
	if len(c.Sources) > MaxSources {
		errs = append(errs, fmt.Errorf("dedup: sources: %d listed, at most %d", len(c.Sources), MaxSources))
	}
	for _, s := range c.Sources {
		if s == "" || len(s) > schemas.MaxSourceBytes || !utf8.ValidString(s) {
			errs = append(errs, fmt.Errorf("dedup: sources: %q must be 1 to %d bytes of UTF-8", s, schemas.MaxSourceBytes))
		} else if s == OtherSource {
			errs = append(errs, fmt.Errorf("dedup: sources: %q is reserved: it is the source label of every source not listed", s))
		}
	}
	if c.MaxRecordBytes < schemas.MaxRejectedBytes {
		errs = append(errs, fmt.Errorf("dedup: max-record-bytes must be at least %d, the most a bounded rejection takes (got %d)",
			schemas.MaxRejectedBytes, c.MaxRecordBytes))
	}
	if c.WatermarkEvery < 0 {
		errs = append(errs, fmt.Errorf("dedup: watermark-every must not be negative (got %s)", c.WatermarkEvery))
	}
	return errors.Join(append(errs, c.Stream.Validate())...)
}

// Stage is a dedup instance.
type Stage struct {
	cfg  Config
	rt   *stream.Runtime
	proc *processor
}

// New prepares a dedup instance. It reads the partition counts of its
// topics from the brokers: placement of every output is computed from them.
func New(ctx context.Context, cfg Config) (*Stage, error) {
	cfg.EnsureDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	counts, err := partitionCounts(ctx, cfg)
	if err != nil {
		return nil, err
	}
	log := cfg.Stream.Logger.With(zap.String("stage", "dedup"), zap.String("instance", cfg.Stream.InstanceID))
	if err := topics.CheckArrivalTimestamps(ctx, cfg.Stream.Kafka, "dedup", cfg.AllowCreateTime, log, cfg.Topics.EventsTopic()); err != nil {
		return nil, err
	}
	// Dedup must read every copy of an identity, the first above all.
	if err := topics.CheckEventLog(ctx, cfg.Stream.Kafka, "dedup", log, cfg.Topics.EventsTopic()); err != nil {
		return nil, err
	}
	// A key lives up to W + S + B after its first arrival (docs/operations.md,
	// Topics); a restore reads it from the changelog.
	if err := topics.CheckChangelogKeeps(ctx, cfg.Stream.Kafka, "dedup", log, cfg.Topics.DedupChangelogTopic(), cfg.Window+cfg.Skew+cfg.Bucket); err != nil {
		return nil, err
	}
	// And so while it runs, and before each restore (stream.Config).
	cfg.Stream.ChangelogMustKeep = cfg.Window + cfg.Skew + cfg.Bucket
	p, err := newProcessor(cfg, counts, log)
	if err != nil {
		return nil, err
	}
	p.endOffset = func(part int32) (int64, error) { return endOffset(cfg, part) }
	p.eventsRetention = func() (time.Duration, error) { return eventsRetention(cfg) }
	rt, err := stream.New(cfg.Stream, p)
	if err != nil {
		return nil, err
	}
	return &Stage{cfg: cfg, rt: rt, proc: p}, nil
}

// newProcessor builds the processor of a stage whose topics have the
// partition counts counts, from cfg with its defaults. The questions it
// asks the brokers later (endOffset, eventsRetention) are the caller's to
// set.
func newProcessor(cfg Config, counts partitionCountsT, log *zap.Logger) (*processor, error) {
	tick, err := schemas.Encode(&schemas.Tick{InstanceID: cfg.Stream.InstanceID})
	if err != nil {
		return nil, fmt.Errorf("dedup: encode tick: %w", err)
	}
	p := &processor{
		cfg:        cfg,
		log:        log,
		counts:     counts,
		m:          newMetrics(cfg.Stream.Registerer),
		now:        cfg.Stream.Clock.Now,
		keys:       newKeyring(cfg.Keys),
		forget:     make(map[string]bool, len(cfg.ForgetKeys)),
		signUseKey: keyUseKey(cfg.Keys[0].ID),
		sources:    make(map[string]string, len(cfg.Sources)),
		tickValue:  tick,
	}
	for _, s := range cfg.Sources {
		p.sources[s] = s
	}
	// Every source label at 0 from the start, as the rejections: a
	// source's first copies must count in rate() (MeterlineDuplicateSpike).
	for _, s := range append(slices.Clone(cfg.Sources), OtherSource) {
		p.m.accepted.WithLabelValues(s)
		p.m.duplicates.WithLabelValues(s, "false")
		p.m.duplicates.WithLabelValues(s, "true")
	}
	for _, id := range cfg.ForgetKeys {
		p.forget[id] = true
	}
	p.setTopics()
	return p, nil
}

// Run runs until ctx ends or a fatal error; see stream.Runtime.Run.
func (s *Stage) Run(ctx context.Context) error { return s.rt.Run(ctx) }

// Ready reports whether the stage is ready (stream.Runtime.Ready); it
// backs /readyz.
func (s *Stage) Ready() error { return s.rt.Ready() }

// Status describes the stage for the status page, as the runtime reports
// it (service.Stage).
func (s *Stage) Status() service.StageStatus { return service.StageStatusOf(s.rt) }

// The runtime reports its standby replicas to the status page.
var _ service.StandbyStage = (*stream.Runtime)(nil)

// CrashAt makes the stage crash in-process at a fault point
// (stream.Runtime.CrashAt; the demo's crash).
func (s *Stage) CrashAt(point string) { s.rt.CrashAt(point) }

type partitionCountsT struct {
	events, deduped, duplicates, rejected int32
}

func partitionCounts(ctx context.Context, cfg Config) (partitionCountsT, error) {
	names := []string{cfg.Topics.EventsTopic(), cfg.Topics.DedupedTopic(), cfg.Topics.DuplicatesTopic(),
		cfg.Topics.RejectedTopic(), cfg.Topics.DedupChangelogTopic()}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	n, err := topics.PartitionCounts(ctx, cfg.Stream.Kafka, names...)
	if err != nil {
		return partitionCountsT{}, fmt.Errorf("dedup: %w", err)
	}
	c := partitionCountsT{
		events:     n[cfg.Topics.EventsTopic()],
		deduped:    n[cfg.Topics.DedupedTopic()],
		duplicates: n[cfg.Topics.DuplicatesTopic()],
		rejected:   n[cfg.Topics.RejectedTopic()],
	}
	if cl := n[cfg.Topics.DedupChangelogTopic()]; cl != c.events {
		return partitionCountsT{}, fmt.Errorf("dedup: changelog %s has %d partitions, %s has %d; they must be equal",
			cfg.Topics.DedupChangelogTopic(), cl, cfg.Topics.EventsTopic(), c.events)
	}
	return c, nil
}

// withAdmin calls fn with an admin client of its own, for at most 30s:
// Open's rare questions to the brokers. The client is seeded with the
// brokers the cluster lists (kafka.NewListedClient).
func withAdmin(cfg Config, fn func(context.Context, *kadm.Client) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl, err := kafka.NewListedClient(ctx, cfg.Stream.Kafka, cfg.Stream.ClientOptions...)
	if err != nil {
		return err
	}
	defer cl.Close()
	return fn(ctx, kadm.NewClient(cl))
}

// endOffset reads the end offset of partition p of the events topic.
func endOffset(cfg Config, p int32) (int64, error) {
	var ends kadm.ListedOffsets
	err := withAdmin(cfg, func(ctx context.Context, adm *kadm.Client) (err error) {
		ends, err = adm.ListEndOffsets(ctx, cfg.Topics.EventsTopic())
		return err
	})
	if err != nil {
		return 0, err
	}
	o, ok := ends.Lookup(cfg.Topics.EventsTopic(), p)
	if !ok {
		return 0, fmt.Errorf("no end offset listed for partition %d", p)
	}
	if o.Err != nil {
		return 0, o.Err
	}
	return o.Offset, nil
}

// eventsRetention reads the events topic's retention.ms; negative:
// infinite.
func eventsRetention(cfg Config) (time.Duration, error) {
	var v string
	err := withAdmin(cfg, func(ctx context.Context, adm *kadm.Client) (err error) {
		v, err = topics.ConfigValue(ctx, adm, cfg.Topics.EventsTopic(), "retention.ms")
		return err
	})
	if err != nil {
		return 0, err
	}
	ms, err := strconv.ParseInt(v, 10, 64)
	switch {
	case err != nil:
		return 0, fmt.Errorf("retention.ms %q is not a number of ms", v)
	case ms < 0 || ms > math.MaxInt64/int64(time.Millisecond):
		return -1, nil // infinite, or longer than a Duration holds
	}
	return time.Duration(ms) * time.Millisecond, nil
}

type metrics struct {
	accepted       *prometheus.CounterVec
	duplicates     *prometheus.CounterVec
	rejected       *prometheus.CounterVec
	rerouted       prometheus.Counter
	forged         prometheus.Counter
	unauthTicks    prometheus.Counter
	throttledTicks prometheus.Counter
	watermark      *prometheus.GaugeVec
	wmDelay        *prometheus.GaugeVec
	keys           *prometheus.GaugeVec
	expired        prometheus.Counter
	filterLoad     prometheus.Observer
}

func newMetrics(reg prometheus.Registerer) *metrics {
	f := prom.NewFactory(reg)
	return &metrics{
		accepted: f.NewCounterVec(prometheus.CounterOpts{Name: "meterline_dedup_accepted_total",
			Help: "First copies forwarded to usage.deduped, by source (the configured sources, or other)."}, []string{"source"}),
		duplicates: f.NewCounterVec(prometheus.CounterOpts{Name: "meterline_dedup_duplicates_total",
			Help: "Copies dropped to usage.duplicates, by source (the configured sources, or other) and conflict (payload differs)."}, []string{"source", "conflict"}),
		rejected: prom.RejectedCounter(reg, "dedup", schemas.ReasonUndecodable, schemas.ReasonUnknownSchema,
			schemas.ReasonInvalid, schemas.ReasonOversized, schemas.ReasonTooOld, schemas.ReasonInFuture),
		rerouted: f.NewCounter(prometheus.CounterOpts{Name: "meterline_dedup_rerouted_total",
			Help: "Misrouted records re-produced to their canonical partition."}),
		forged: f.NewCounter(prometheus.CounterOpts{Name: "meterline_dedup_forged_headers_total",
			Help: "Records carrying dedup's re-route or signature headers that failed the check; each was handled as an ordinary producer record."}),
		unauthTicks: f.NewCounter(prometheus.CounterOpts{Name: "meterline_dedup_unauthenticated_ticks_total",
			Help: "Tick records without a valid dedup signature; they forward no watermark."}),
		throttledTicks: f.NewCounter(prometheus.CounterOpts{Name: "meterline_dedup_ticks_throttled_total",
			Help: "Signed ticks that forwarded no watermark because one was forwarded less than WatermarkEvery of broker time before."}),
		watermark: f.NewGaugeVec(prometheus.GaugeOpts{Name: "meterline_dedup_watermark_seconds",
			Help: "Partition watermark (largest broker arrival time seen), Unix seconds."}, []string{"partition"}),
		wmDelay: f.NewGaugeVec(prometheus.GaugeOpts{Name: "meterline_dedup_watermark_delay_seconds",
			Help: "Wall time minus the partition watermark, updated every tick interval."}, []string{"partition"}),
		keys: f.NewGaugeVec(prometheus.GaugeOpts{Name: "meterline_dedup_state_keys",
			Help: "Identities held in the dedup store, per partition."}, []string{"partition"}),
		expired: f.NewCounter(prometheus.CounterOpts{Name: "meterline_dedup_expired_buckets_total",
			Help: "Arrival buckets dropped from the store after W + S."}),
		filterLoad: f.NewHistogram(prometheus.HistogramOpts{Name: "meterline_dedup_filter_load_seconds",
			Help:    "Time a partition's open spent building its Bloom filters from every identity key of its state (the partition's input waits meanwhile); not observed for a partition opened with warm filters (a promoted standby's, or kept through a rebalance that gave the partition back).",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 18)}),
	}
}
