package cli

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/meterline/meterline/aggregator"
	"github.com/meterline/meterline/dedup"
	"github.com/meterline/meterline/internal/service"
)

// RunCmd is `meterline run`: every stage in one process, each its own
// consumer-group member with its own transactional ID, behind one HTTP
// server.
type RunCmd struct {
	StageFlags     `embed:""`
	DedupGroup     string        `help:"Consumer group of the dedup stage." default:"meterline-dedup"`
	AggregateGroup string        `help:"Consumer group of the aggregator." default:"meterline-aggregate"`
	Window         time.Duration `help:"Dedup window W." default:"840h"`
	Skew           time.Duration `help:"Allowed skew S after arrival." default:"1h"`
	TickInterval   time.Duration `help:"Dedup tick interval." default:"5s"`
	Meters         string        `help:"Meters YAML file for the aggregator." type:"existingfile" placeholder:"FILE"`
	StrictMeters   bool          `help:"Reject events of undeclared meters."`
	Period         string        `help:"Billing period: month, day or hour." default:"month" enum:"month,day,hour"`
	Grace          time.Duration `help:"Finalization grace after a period's end." default:"48h"`
}

// Run runs the stages until ctx ends or one of them fails.
func (c *RunCmd) Run(ctx context.Context, g *Globals, stdio IO, log *zap.Logger) error {
	reg := service.NewRegistry()
	dc := DedupCmd{StageFlags: c.StageFlags, Group: c.DedupGroup, Window: c.Window, Skew: c.Skew, TickInterval: c.TickInterval, Bucket: 24 * time.Hour}
	dcfg, err := dc.config(g, log, reg)
	if err != nil {
		return &ExitError{Code: 2, Err: err}
	}
	ac := AggregateCmd{StageFlags: c.StageFlags, Group: c.AggregateGroup, Meters: c.Meters, StrictMeters: c.StrictMeters,
		Period: c.Period, Grace: c.Grace, Window: c.Window}
	acfg, err := ac.config(g, log, reg)
	if err != nil {
		return &ExitError{Code: 2, Err: err}
	}
	if c.Validate {
		fmt.Fprintln(stdio.Stdout, "configuration ok")
		return nil
	}
	ds, err := dedup.New(ctx, dcfg)
	if err != nil {
		return err
	}
	as, err := aggregator.New(ctx, acfg)
	if err != nil {
		return err
	}
	stages := []namedStage{
		{"dedup", ds.Run, ds.Runtime().Ready},
		{"aggregate", as.Run, as.Runtime().Ready},
	}
	return runStage(ctx, c.MetricsAddr, reg, log, allReady(stages), func(ctx context.Context) error {
		return runAll(ctx, log, stages)
	})
}

type namedStage struct {
	name  string
	run   func(context.Context) error
	ready service.Check
}

func allReady(stages []namedStage) service.Check {
	return func() error {
		for _, s := range stages {
			if err := s.ready(); err != nil {
				return fmt.Errorf("%s: %w", s.name, err)
			}
		}
		return nil
	}
}

// runAll runs every stage; the first to fail stops the others, and all
// errors are returned.
func runAll(ctx context.Context, log *zap.Logger, stages []namedStage) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	for _, s := range stages {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := s.run(ctx); err != nil && !errors.Is(err, context.Canceled) {
				log.Error("stage failed; stopping the others", zap.String("stage", s.name), zap.Error(err))
				mu.Lock()
				errs = append(errs, fmt.Errorf("%s: %w", s.name, err))
				mu.Unlock()
				cancel()
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}
