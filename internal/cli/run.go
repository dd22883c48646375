package cli

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/meterline/meterline/aggregator"
	"github.com/meterline/meterline/dedup"
	"github.com/meterline/meterline/ingest"
	"github.com/meterline/meterline/internal/service"
	"github.com/meterline/meterline/sink"
)

// RunCmd is `meterline run`: every stage in one process (dedup, the
// aggregator, unless --no-sink the ClickHouse sink, and with --ingest the
// HTTP ingest), each its own consumer-group member with its own
// transactional ID, behind one HTTP server.
//
// Flags that every stage of the process shares are given once, unprefixed:
// the connection (Globals), the process's identity, state directory root,
// group session and transaction timeouts and HTTP server (StageFlags), the
// dedup key ring (--dedup-keys-file) and the meters file that the
// aggregator and the HTTP ingest both read (--meters, --strict-meters).
// Each stage's own flags are those of its command with the stage's prefix:
// --dedup-window, --aggregate-period, --sink-database, --ingest-addr.
type RunCmd struct {
	StageFlags    `embed:""`
	DedupKeyFlags `embed:""`
	MetersFlags   `embed:""`
	Dedup         DedupFlags     `embed:"" prefix:"dedup-" group:"Dedup"`
	Aggregate     AggregateFlags `embed:"" prefix:"aggregate-" group:"Aggregator (its window and skew are --dedup-window and --dedup-skew)"`
	NoSink        bool           `help:"Leave the ClickHouse sink out: run dedup and the aggregator only."`
	Sink          SinkFlags      `embed:"" prefix:"sink-" set:"flag_prefix=sink-" group:"Sink (ClickHouse at --clickhouse)"`
	Ingest        bool           `help:"Also serve the HTTP ingest (--ingest-*; the meters file gives the CloudEvent types). Off by default."`
	IngestFlags   IngestFlags    `embed:"" prefix:"ingest-" set:"flag_prefix=ingest-" group:"HTTP ingest (with --ingest)"`
}

// stageConfigs builds the configurations of dedup and the aggregator; the
// aggregator's W, B and S are dedup's own.
func (c *RunCmd) stageConfigs(g *Globals, log *zap.Logger, reg prometheus.Registerer) (dedup.Config, aggregator.Config, error) {
	dcfg, err := c.Dedup.config(g, &c.StageFlags, &c.DedupKeyFlags, dedup.DefaultBucket, log, reg)
	if err != nil {
		return dcfg, aggregator.Config{}, err
	}
	acfg, err := c.Aggregate.config(g, &c.StageFlags, &c.MetersFlags, dcfg, log, reg)
	return dcfg, acfg, err
}

// distinctGroups refuses two stages of the process given one consumer
// group. Each stage is a member of its own group, with the transactional
// ID <group>-<instance-id>: in one group they would read different topics
// with one transactional ID, and the group's leader or the broker would
// stop the process with an error that names no flag.
func (c *RunCmd) distinctGroups() error {
	type stageGroup struct{ flag, group string }
	groups := []stageGroup{{"--dedup-group", c.Dedup.Group}, {"--aggregate-group", c.Aggregate.Group}}
	if !c.NoSink {
		groups = append(groups, stageGroup{"--sink-group", c.Sink.Group})
	}
	for i, a := range groups {
		for _, b := range groups[i+1:] {
			if a.group == b.group {
				return fmt.Errorf("%s and %s are both %q: each stage of meterline run needs a consumer group of its own", a.flag, b.flag, a.group)
			}
		}
	}
	return nil
}

// Run runs the stages until ctx ends or one of them fails.
//
// The aggregator keeps dedup's window, expiry bucket and skew
// (--dedup-window, --dedup-skew), which it must be at least. The sink shares the stage flags' instance ID and session,
// rebalance and transaction timeouts; its batching and commit interval are
// its own (--sink-*). As with `meterline sink`, an unreachable ClickHouse
// does not stop the process: the sink waits for it (dedup and the
// aggregator carry on) and /readyz says why it is not ready; a database
// without the migrations is an error unless --sink-migrate applies them at
// start.
func (c *RunCmd) Run(ctx context.Context, g *Globals, stdio IO, log *zap.Logger) (err error) {
	reg := service.NewRegistry()
	dcfg, acfg, err := c.stageConfigs(g, log, reg)
	if err == nil {
		err = c.distinctGroups()
	}
	if err != nil {
		return &ExitError{Code: 2, Err: err}
	}
	var scfg sink.Config
	if !c.NoSink {
		scfg, err = c.Sink.config(g, c.InstanceID, c.SessionTimeout, c.RebalanceTimeout, c.TransactionTimeout, log, reg)
		if err != nil {
			return &ExitError{Code: 2, Err: fmt.Errorf("--sink-* flags (or --no-sink): %w", err)}
		}
	}
	var icfg ingest.Config
	if c.Ingest {
		kc, err := g.kafka()
		if err != nil {
			return err
		}
		icfg = c.IngestFlags.config(kc, g, acfg.Meters, c.StrictMeters, dcfg.Window, log, reg)
		if err := errors.Join(c.IngestFlags.refuseZeroMaxAge(), icfg.Validate()); err != nil {
			return &ExitError{Code: 2, Err: fmt.Errorf("--ingest-* flags: %w", err)}
		}
	}
	if c.Validate {
		fmt.Fprintln(stdio.Stdout, "configuration ok")
		return nil
	}
	// Credentials first: a refused password stops the process before any
	// stage reads or writes.
	if ok, err := g.awaitKafka(ctx, log); !ok {
		return err
	}
	defer cleanStopAtStart(ctx, log, &err)
	if !c.NoSink {
		if err := checkClickHouse(ctx, scfg.ClickHouseServer); err != nil {
			return err
		}
	}
	if !c.NoSink && c.Sink.Migrate {
		if err := migrate(ctx, g, scfg.ClickHouseServer, c.Sink.Database, scfg.Group, 0, stdio, log); err != nil {
			return err
		}
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
		{"dedup", ds.Run, ds.Ready},
		{"aggregate", as.Run, as.Ready},
	}
	groups := []lagGroup{{"dedup", dcfg.Stream.Group, []string{g.Topic.EventsTopic()}}, {"aggregate", acfg.Stream.Group, append([]string{g.Topic.DedupedTopic()}, acfg.Stream.CopartitionedTopics...)}}
	status := []func() service.StageStatus{ds.Status, as.Status}
	if !c.NoSink {
		w, err := sink.New(scfg)
		if err != nil {
			return err
		}
		stages = append(stages, namedStage{"sink", w.Run, w.Ready})
		groups = append(groups, lagGroup{"sink", scfg.Group, sinkInputs(g.Topic)})
		status = append(status, sinkStatus(scfg, g.Topic))
	}
	setup := func(s *service.Server) { s.AddTable(as.EntitlementsTable) }
	if c.Ingest {
		srv, err := ingest.New(icfg)
		if err != nil {
			return err
		}
		stages = append(stages, namedStage{"ingest", srv.Run, srv.Ready})
		setup = func(s *service.Server) { s.AddTable(as.EntitlementsTable); s.AddTable(srv.Status) }
	}
	return runStageWith(ctx, g, metricsServer{c.MetricsAddr, c.MetricsAllowedHosts}, reg, log, groups, allReady(stages), func(ctx context.Context) error {
		return runAll(ctx, log, stages)
	}, setup, status...)
}

type namedStage struct {
	name  string
	run   func(context.Context) error
	ready service.Check
}

// allReady is ready when every stage is; otherwise its error names each
// stage that is not, with its reason.
func allReady(stages []namedStage) service.Check {
	return func() error {
		var errs []error
		for _, s := range stages {
			if err := s.ready(); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", s.name, err))
			}
		}
		return errors.Join(errs...)
	}
}

// errStoppedEarly is the error of a stage that returned, without an
// error, while the process was not stopping.
var errStoppedEarly = errors.New("stopped although the process was not told to stop")

// runAll runs every stage; the first to fail stops the others, and all
// errors are returned. A stage that returns before the process is told
// to stop has failed, whatever it returned: the others would otherwise
// run on without it.
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
			err := s.run(ctx)
			if ctx.Err() == nil && (err == nil || errors.Is(err, context.Canceled)) {
				err = errStoppedEarly
			}
			if err != nil && !errors.Is(err, context.Canceled) {
				log.Error("stage failed; stopping the others", zap.String("stage", s.name), zap.Error(err))
				mu.Lock()
				errs = append(errs, service.StageError(s.name, err))
				mu.Unlock()
				cancel()
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}
