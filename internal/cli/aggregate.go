package cli

import (
	"context"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/meterline/meterline/aggregator"
	"github.com/meterline/meterline/internal/service"
)

// AggregateCmd is `meterline aggregate`.
type AggregateCmd struct {
	StageFlags       `embed:""`
	Group            string        `help:"Consumer group of the aggregator." default:"${aggregate_group}"`
	Meters           string        `help:"YAML file declaring meters (name, aggregation, property, group_by, unit, description). Without it every meter is a SUM." type:"existingfile" placeholder:"FILE"`
	StrictMeters     bool          `help:"Reject events of undeclared meters (reason unknown_meter) instead of counting them as SUM."`
	Period           string        `help:"Billing period: month, day or hour (UTC, calendar-aligned)." default:"${aggregate_period}" enum:"month,day,hour"`
	Grace            time.Duration `help:"How long after its end a period stays open; it is final once the watermark passes end + grace." default:"${aggregate_grace}"`
	Window           time.Duration `help:"Dedup window W: a period's working state is kept until end + W. Must be at least dedup's --window: the aggregator stops on a watermark record that states a longer one." default:"${dedup_window}"`
	FinalChunk       int           `help:"Aggregates per transaction when a period's FINAL revisions go out (and when its state expires): a month end is spread over several transactions so that none outlasts --transaction-timeout." default:"${aggregate_final_chunk}"`
	Entitlements     bool          `help:"Decide caps and credits (DESIGN §12): read usage.entitlements with usage.deduped, reject events over a cap (over_limit) or without credit (no_credit), write usage.balances."`
	EntitlementsTick time.Duration `help:"How often a tick is appended to each owned usage.entitlements partition: an event waits until its entitlements partition has been read past its arrival. Negative: no ticks." default:"${aggregate_entitlements_tick}"`
}

func (c *AggregateCmd) config(g *Globals, log *zap.Logger, reg prometheus.Registerer) (aggregator.Config, error) {
	sc, err := c.streamConfig(g, c.Group, "aggregate", log, reg)
	if err != nil {
		return aggregator.Config{}, err
	}
	cfg := aggregator.Config{Stream: sc, Topics: g.Topic, StrictMeters: c.StrictMeters,
		Period: aggregator.Period(c.Period), Grace: c.Grace, Window: c.Window, FinalChunk: c.FinalChunk,
		Entitlements: c.Entitlements, EntitlementsTick: c.EntitlementsTick}
	if c.Meters != "" {
		cat, err := aggregator.LoadMeters(c.Meters)
		if err != nil {
			return cfg, err
		}
		cfg.Meters = cat
	}
	cfg.EnsureDefaults()
	return cfg, cfg.Validate()
}

// Run runs the aggregator.
func (c *AggregateCmd) Run(ctx context.Context, g *Globals, stdio IO, log *zap.Logger) error {
	reg := service.NewRegistry()
	cfg, err := c.config(g, log, reg)
	if err != nil {
		return &ExitError{Code: 2, Err: err}
	}
	if c.Validate {
		fmt.Fprintf(stdio.Stdout, "configuration ok (%d meters declared)\n", cfg.Meters.Len())
		return nil
	}
	if _, err := g.connectKafka(ctx); err != nil {
		return err
	}
	st, err := aggregator.New(ctx, cfg)
	if err != nil {
		return err
	}
	inputs := []string{g.Topic.DedupedTopic()}
	if cfg.Entitlements {
		inputs = append(inputs, g.Topic.EntitlementsTopic())
	}
	return runStage(ctx, g, c.MetricsAddr, reg, log, []lagGroup{{cfg.Stream.Group, inputs}},
		st.Ready, st.Run, st.Status)
}
