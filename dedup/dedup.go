// Package dedup drops duplicate copies of usage events, exactly once
// (DESIGN §2, §3, §8).
//
// It reads usage.events in order per partition and, for each record:
//
//   - rejects bad input to usage.rejected with a stable reason code;
//   - re-routes a misrouted event to its canonical partition;
//   - rejects an event outside the window (too_old, in_future), judged by
//     the record's broker arrival time;
//   - forwards the first copy of an identity to usage.deduped and every
//     later copy to usage.duplicates, flagged conflict when its payload
//     differs;
//   - advances the partition watermark (largest arrival seen) and, on each
//     tick record, forwards it to every usage.deduped partition.
//
// The store runs on internal/stream, so every decision, its outputs and the
// consumed offset commit together.
package dedup

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/meterline/meterline/internal/service"
	"github.com/meterline/meterline/internal/stream"
	"github.com/meterline/meterline/internal/topics"
)

// Config configures the dedup stage.
type Config struct {
	// Stream configures the runtime. Its Stage, InputTopic and
	// ChangelogTopic are set from Topics by New.
	Stream stream.Config
	// Topics names the topics.
	Topics topics.Names
	// Window is W: an event is accepted only if arrival − W < event_time,
	// and a key is kept W + Skew after its first arrival. Default: 35 days.
	Window time.Duration
	// Skew is S: an event is accepted only if event_time ≤ arrival + S.
	// Default: 1 hour.
	Skew time.Duration
	// TickInterval is how often a tick record is appended to each owned
	// usage.events partition. Default: 5s.
	TickInterval time.Duration
	// Bucket is the granularity of expiry: keys are grouped by the bucket
	// of their first arrival and a whole bucket is dropped once all its keys
	// are past W + S, so a key lives at most one bucket longer than
	// required. Default: 24h.
	Bucket time.Duration
}

// EnsureDefaults fills zero fields with their defaults.
func (c *Config) EnsureDefaults() {
	if c.Window == 0 {
		c.Window = 35 * 24 * time.Hour
	}
	if c.Skew == 0 {
		c.Skew = time.Hour
	}
	if c.TickInterval == 0 {
		c.TickInterval = 5 * time.Second
	}
	if c.Bucket == 0 {
		c.Bucket = 24 * time.Hour
	}
	if c.Topics == (topics.Names{}) {
		c.Topics = topics.DefaultNames()
	}
	c.Stream.Stage = "dedup"
	c.Stream.InputTopic = c.Topics.EventsTopic()
	c.Stream.ChangelogTopic = c.Topics.DedupChangelogTopic()
	c.Stream.PunctuateInterval = c.TickInterval
	if c.Stream.Group == "" {
		c.Stream.Group = "meterline-dedup"
	}
	c.Stream.EnsureDefaults()
}

// Validate reports every problem at once.
func (c *Config) Validate() error {
	var errs []error
	if c.Window <= 0 {
		errs = append(errs, fmt.Errorf("dedup: window must be positive (got %s)", c.Window))
	}
	if c.Skew < 0 {
		errs = append(errs, fmt.Errorf("dedup: skew must not be negative (got %s)", c.Skew))
	}
	if c.TickInterval <= 0 {
		errs = append(errs, fmt.Errorf("dedup: tick-interval must be positive (got %s)", c.TickInterval))
	}
	if c.Bucket < time.Second {
		errs = append(errs, fmt.Errorf("dedup: bucket must be at least 1s (got %s)", c.Bucket))
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
	p := &processor{
		cfg:    cfg,
		log:    cfg.Stream.Logger.With(zap.String("stage", "dedup"), zap.String("instance", cfg.Stream.InstanceID)),
		counts: counts,
		m:      newMetrics(cfg.Stream.Registerer),
		now:    cfg.Stream.Clock.Now,
	}
	p.setTopics()
	rt, err := stream.New(cfg.Stream, p)
	if err != nil {
		return nil, err
	}
	return &Stage{cfg: cfg, rt: rt, proc: p}, nil
}

// Run runs until ctx ends or a fatal error; see stream.Runtime.Run.
func (s *Stage) Run(ctx context.Context) error { return s.rt.Run(ctx) }

// Ready reports whether the stage is ready (stream.Runtime.Ready); it
// backs /readyz.
func (s *Stage) Ready() error { return s.rt.Ready() }

// Status describes the stage for the status page (stream.Runtime.Status).
func (s *Stage) Status() service.StageStatus { return s.rt.Status() }

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
	n, err := topics.PartitionCounts(ctx, cfg.Stream.Brokers, names...)
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

type metrics struct {
	accepted   *prometheus.CounterVec
	duplicates *prometheus.CounterVec
	rejected   *prometheus.CounterVec
	rerouted   prometheus.Counter
	watermark  *prometheus.GaugeVec
	wmDelay    *prometheus.GaugeVec
	keys       *prometheus.GaugeVec
	expired    prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	f := service.NewFactory(reg)
	return &metrics{
		accepted: f.NewCounterVec(prometheus.CounterOpts{Name: "meterline_dedup_accepted_total",
			Help: "First copies forwarded to usage.deduped, by source."}, []string{"source"}),
		duplicates: f.NewCounterVec(prometheus.CounterOpts{Name: "meterline_dedup_duplicates_total",
			Help: "Copies dropped to usage.duplicates, by source and conflict (payload differs)."}, []string{"source", "conflict"}),
		rejected: service.RejectedCounter(reg),
		rerouted: f.NewCounter(prometheus.CounterOpts{Name: "meterline_dedup_rerouted_total",
			Help: "Misrouted records re-produced to their canonical partition."}),
		watermark: f.NewGaugeVec(prometheus.GaugeOpts{Name: "meterline_dedup_watermark_seconds",
			Help: "Partition watermark (largest broker arrival time seen), Unix seconds."}, []string{"partition"}),
		wmDelay: f.NewGaugeVec(prometheus.GaugeOpts{Name: "meterline_dedup_watermark_delay_seconds",
			Help: "Wall time minus the partition watermark, updated every tick interval."}, []string{"partition"}),
		keys: f.NewGaugeVec(prometheus.GaugeOpts{Name: "meterline_dedup_state_keys",
			Help: "Identities held in the dedup store, per partition."}, []string{"partition"}),
		expired: f.NewCounter(prometheus.CounterOpts{Name: "meterline_dedup_expired_buckets_total",
			Help: "Arrival buckets dropped from the store after W + S."}),
	}
}
