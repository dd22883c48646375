package cli

import (
	"context"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/meterline/meterline/aggregator"
	"github.com/meterline/meterline/dedup"
	"github.com/meterline/meterline/internal/service"
)

// AggregateCmd is `meterline aggregate`.
type AggregateCmd struct {
	StageFlags     `embed:""`
	AggregateFlags `embed:""`
	MetersFlags    `embed:""`
	Window         time.Duration `help:"Dedup window W: a period's working state is kept until end + W + B (--bucket). Must be at least dedup's --window: the aggregator stops on a watermark record that states a longer one." default:"${dedup_window}"`
	Bucket         time.Duration `help:"Dedup's expiry bucket B: a period's working state is kept until end + W + B. Must be at least dedup's --bucket: the aggregator stops on a watermark record that states a longer one." default:"${dedup_bucket}" hidden:""`
	Skew           time.Duration `help:"Dedup's skew S: with --entitlements, their history is kept W + B + S behind the watermark. Must be at least dedup's --skew: the aggregator stops on a watermark record that states a longer one." default:"${dedup_skew}"`
}

// AggregateFlags are the aggregator's own flags: `meterline aggregate`
// takes them as they are, `meterline run` with the prefix aggregate-
// (--aggregate-period, --aggregate-group, ...). Dedup's window, expiry
// bucket and skew are not among them: `meterline run` gives the aggregator
// dedup's.
type AggregateFlags struct {
	Group             string        `help:"Consumer group of the aggregator." default:"${aggregate_group}"`
	Period            string        `help:"Billing period: month, day or hour (UTC, calendar-aligned)." default:"${aggregate_period}" enum:"month,day,hour"`
	Grace             time.Duration `help:"How long after its end a period stays open; it is final once the watermark passes end + grace (at least 1ms)." default:"${aggregate_grace}"`
	MaxBatchRecords   int           `help:"Most input records in one transaction (one ends sooner at --commit-interval): what a transaction writes grows with the aggregates and customers it changed, so larger ones cost less per event." default:"${aggregate_max_batch_records}"`
	FinalChunk        int           `help:"Aggregates per transaction when a period's FINAL revisions go out (and when its state expires): a month end is spread over several transactions so that none outlasts --transaction-timeout." default:"${aggregate_final_chunk}"`
	Entitlements      bool          `help:"Decide caps and credits (docs/entitlements.md): read usage.entitlements with usage.deduped, reject events over a cap (over_limit) or without credit (no_credit), write usage.balances."`
	EntitlementsTick  time.Duration `help:"How often a tick is appended to each owned usage.entitlements partition while it is needed (records waiting for their decision, balances pending, input arriving): an event waits until its entitlements partition has been read past its arrival. Negative: no ticks." default:"${aggregate_entitlements_tick}"`
	EntitlementsOrder string        `help:"With entitlements on, the order events are decided in (docs/entitlements.md, Decision order): input, as they come in usage.deduped, which follows their arrival only while dedup keeps up; arrival, once the watermark has passed their arrival, in order of arrival, whatever dedup's lag (decisions then wait up to dedup's tick interval, meterline dedup --tick-interval, 5s by default)." default:"${aggregate_entitlements_order}" enum:"arrival,input"`
	BalanceInterval   time.Duration `help:"How often, in broker time, the balances of the customers that changed go to usage.balances: a customer gets at most one balance per interval (a period start's aside), as of its latest change. 0: one per transaction that changed it." default:"${aggregate_balance_interval}" zero:""`
}

// MetersFlags name the meters file, which the aggregator and the HTTP
// ingest read (in `meterline run`, one file for both).
type MetersFlags struct {
	Meters       string `help:"Meters YAML file: each meter's aggregation, property, group_by, unit and description, and the CloudEvent types that feed it (event_type, value_property). Without it the aggregator counts every meter as a SUM and the HTTP ingest accepts no CloudEvent." type:"existingfile" placeholder:"FILE"`
	StrictMeters bool   `help:"Reject events of meters the meters file does not declare (reason unknown_meter): the aggregator instead of counting them as SUM, the HTTP ingest on /v1/events."`
}

// load reads the meters file, or returns nil for none.
func (f *MetersFlags) load() (*aggregator.Catalog, error) {
	if f.Meters == "" {
		return nil, nil
	}
	return aggregator.LoadMeters(f.Meters)
}

// config builds the aggregator's configuration from its own flags, the
// stage flags sf, the meters flags m and dedup's time parameters (the
// Window, Bucket and Skew of d; its other fields are not read).
func (f *AggregateFlags) config(g *Globals, sf *StageFlags, m *MetersFlags, d dedup.Config, log *zap.Logger, reg prometheus.Registerer) (aggregator.Config, error) {
	sc, err := sf.streamConfig(g, f.Group, "aggregate", f.MaxBatchRecords, log, reg)
	if err != nil {
		return aggregator.Config{}, err
	}
	cfg := aggregator.Config{Stream: sc, Topics: g.Topic, StrictMeters: m.StrictMeters,
		Period: aggregator.Period(f.Period), Grace: f.Grace, FinalChunk: f.FinalChunk,
		Window: d.Window, Bucket: d.Bucket, Skew: d.Skew,
		Entitlements: f.Entitlements, EntitlementsTick: f.EntitlementsTick, EntitlementsOrder: f.EntitlementsOrder, BalanceInterval: f.BalanceInterval,
		AllowCreateTime: sf.AllowCreateTime}
	if f.BalanceInterval <= 0 {
		cfg.BalanceInterval = aggregator.BalanceEveryTransaction
	}
	if cfg.Meters, err = m.load(); err != nil {
		return cfg, err
	}
	cfg.EnsureDefaults()
	return cfg, cfg.Validate()
}

func (c *AggregateCmd) config(g *Globals, log *zap.Logger, reg prometheus.Registerer) (aggregator.Config, error) {
	return c.AggregateFlags.config(g, &c.StageFlags, &c.MetersFlags, dedup.Config{Window: c.Window, Bucket: c.Bucket, Skew: c.Skew}, log, reg)
}

// Run runs the aggregator.
func (c *AggregateCmd) Run(ctx context.Context, g *Globals, stdio IO, log *zap.Logger) (err error) {
	reg := service.NewRegistry()
	cfg, err := c.config(g, log, reg)
	if err != nil {
		return &ExitError{Code: 2, Err: err}
	}
	if c.Validate {
		fmt.Fprintf(stdio.Stdout, "configuration ok (%d meters declared)\n", cfg.Meters.Len())
		return nil
	}
	if ok, err := g.awaitKafka(ctx, log); !ok {
		return err
	}
	defer cleanStopAtStart(ctx, log, &err)
	st, err := aggregator.New(ctx, cfg)
	if err != nil {
		return err
	}
	return runStageWith(ctx, g, metricsServer{c.MetricsAddr, c.MetricsAllowedHosts}, reg, log, []lagGroup{{"aggregate", cfg.Stream.Group, append([]string{g.Topic.DedupedTopic()}, cfg.Stream.CopartitionedTopics...)}},
		st.Ready, st.Run, func(s *service.Server) { s.AddTable(st.EntitlementsTable) }, st.Status)
}
