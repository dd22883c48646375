package cli

import (
	"context"
	"fmt"
	"io"
	"time"

	"go.uber.org/zap"

	"github.com/meterline/meterline/internal/bench"
	"github.com/meterline/meterline/producer"
)

// BenchCmd is `meterline bench`. Each subcommand maps its flags to a
// harness of package bench.
type BenchCmd struct {
	Produce   BenchProduceCmd   `cmd:"" help:"meterline produce against raw franz-go producing the same pre-encoded records."`
	Dedup     BenchDedupCmd     `cmd:"" help:"The dedup stage on pre-filled input against two transactional passthrough baselines."`
	Sink      BenchSinkCmd      `cmd:"" help:"meterline sink against a bare clickhouse-go batch loop writing the same rows."`
	Aggregate BenchAggregateCmd `cmd:"" help:"The aggregator on pre-filled usage.deduped against two transactional passthrough baselines."`
	Ingest    BenchIngestCmd    `cmd:"" help:"meterline ingest (batches of CloudEvents over keep-alive HTTP) against a minimal handler producing the same pre-encoded records; latency at half rate."`
}

// benchEnv is where the benchmarks run: the global connection flags
// (Kafka's credentials checked), progress on stderr and the result on
// stdout.
func benchEnv(ctx context.Context, g *Globals, stdio IO, log *zap.Logger) (*bench.Env, error) {
	kc, err := g.connectKafka(ctx)
	if err != nil {
		return nil, err
	}
	srv, err := g.clickHouse()
	if err != nil {
		return nil, err
	}
	return &bench.Env{Kafka: kc, ClickHouseServer: srv, Topics: g.Topic, Logger: log,
		Progress: stdio.Stderr, Out: stdio.Stdout}, nil
}

// runBench validates cfg (exit status 2 when it is wrong), connects and
// runs it.
func runBench(ctx context.Context, g *Globals, stdio IO, log *zap.Logger, validate func() error, run func(*bench.Env) error) error {
	if err := validate(); err != nil {
		return &ExitError{Code: 2, Err: err}
	}
	env, err := benchEnv(ctx, g, stdio, log)
	if err != nil {
		return err
	}
	return run(env)
}

// BenchProduceCmd is `meterline bench produce`.
type BenchProduceCmd struct {
	Events     int           `help:"Events per run." default:"1000000"`
	Partitions int32         `help:"Partitions of each benchmark topic." default:"16"`
	Rounds     int           `help:"Rounds; each runs the baseline and produce once, in alternating order. Medians are reported." default:"3"`
	Linger     time.Duration `help:"Producer linger, the same for both." default:"5ms"`
	Customers  int           `help:"Distinct customers in the generated events." default:"10000"`
	JSON       bool          `help:"Print the result as JSON too."`
}

// Run runs the benchmark.
func (c *BenchProduceCmd) Run(ctx context.Context, g *Globals, stdio IO, log *zap.Logger) error {
	cfg := bench.ProduceConfig{Events: c.Events, Partitions: c.Partitions, Rounds: c.Rounds, Linger: c.Linger,
		Customers: c.Customers, JSON: c.JSON, Path: producePath}
	return runBench(ctx, g, stdio, log, cfg.Validate, func(env *bench.Env) error { return bench.Produce(ctx, env, cfg) })
}

// producePath is the code path of `meterline produce`, measured by bench
// produce.
func producePath(ctx context.Context, in io.Reader, p *producer.Producer) (int, time.Duration, error) {
	sum := Produce(ctx, in, p, ProduceOptions{Errors: io.Discard})
	if sum.Bad > 0 || sum.Failed > 0 || sum.Err != nil {
		return 0, 0, fmt.Errorf("produce path: %s", sum)
	}
	return int(sum.Sent), sum.Elapsed, nil
}

// BenchStageFlags are the flags bench dedup and bench aggregate share.
type BenchStageFlags struct {
	Partitions     int32         `help:"Partitions of every benchmark topic." default:"16"`
	CommitInterval time.Duration `help:"Commit interval of every stage measured." default:"100ms"`
	LatencyRate    int           `help:"Events per second sent during the latency phase." default:"5000"`
	LatencyFor     time.Duration `help:"Length of the latency phase." default:"15s"`
	StateDir       string        `help:"Where the benchmark keeps Pebble state (removed afterwards)." default:"" type:"path"`
	Keep           bool          `help:"Keep the benchmark topics."`
}

func (f *BenchStageFlags) config(rounds int, cpuProfile string) bench.StageConfig {
	return bench.StageConfig{Partitions: f.Partitions, CommitInterval: f.CommitInterval, LatencyRate: f.LatencyRate,
		LatencyFor: f.LatencyFor, StateDir: f.StateDir, Keep: f.Keep, Rounds: rounds, CPUProfile: cpuProfile}
}

// BenchDedupCmd is `meterline bench dedup`.
type BenchDedupCmd struct {
	Events             int     `help:"Events pre-filled in usage.events, copies included." default:"2000000"`
	DuplicateRate      float64 `help:"Share of the events that are copies of earlier ones." default:"0.05"`
	BenchStageFlags    `embed:""`
	Rounds             int     `help:"Rounds; each measures (a), (b) and dedup once, in a rotating order. Medians are reported." default:"3"`
	CPUProfile         string  `help:"Write a CPU profile of the dedup phase to this file." hidden:"" type:"path"`
	ReplicationFactors []int16 `name:"replication-factors" help:"Run dedup once per replication factor in each round, its output and changelog topics created with it (min.insync.replicas 2 for 3, else 1), e.g. 3,1 on a cluster of three brokers. Default: one dedup with the cluster's default." placeholder:"RF,..."`
}

// Run runs the benchmark.
func (c *BenchDedupCmd) Run(ctx context.Context, g *Globals, stdio IO, log *zap.Logger) error {
	cfg := bench.DedupConfig{Events: c.Events, DuplicateRate: c.DuplicateRate, ReplicationFactors: c.ReplicationFactors,
		StageConfig: c.config(c.Rounds, c.CPUProfile)}
	return runBench(ctx, g, stdio, log, cfg.Validate, func(env *bench.Env) error { return bench.Dedup(ctx, env, cfg) })
}

// BenchAggregateCmd is `meterline bench aggregate`.
type BenchAggregateCmd struct {
	Customers       int `help:"Distinct customers." default:"10000"`
	Events          int `help:"Events pre-filled in usage.deduped." default:"2000000"`
	BenchStageFlags `embed:""`
	Rounds          int    `help:"Rounds; each measures (a), (b) and the aggregator once, in a rotating order. Medians are reported." default:"3"`
	CPUProfile      string `help:"Write a CPU profile of the last round's aggregate phase to this file." hidden:"" type:"path"`
}

// Run runs the benchmark.
func (c *BenchAggregateCmd) Run(ctx context.Context, g *Globals, stdio IO, log *zap.Logger) error {
	cfg := bench.AggregateConfig{Customers: c.Customers, Events: c.Events, StageConfig: c.config(c.Rounds, c.CPUProfile)}
	return runBench(ctx, g, stdio, log, cfg.Validate, func(env *bench.Env) error { return bench.Aggregate(ctx, env, cfg) })
}

// BenchSinkCmd is `meterline bench sink`: rows/s into ClickHouse through
// the sink (Kafka → decode → INSERT → transactional offset commit) against
// a bare clickhouse-go batch loop writing the same rows.
type BenchSinkCmd struct {
	Rows       int    `help:"usage.deduped records (rows) per run." default:"1000000"`
	Partitions int    `help:"Partitions of the benchmark topic." default:"16"`
	Rounds     int    `help:"Rounds; each runs the baseline and the sink once, in alternating order. Medians are reported." default:"3"`
	BatchRows  int    `help:"Rows per INSERT, the same for both (the sink's --max-batch-records)." default:"10000"`
	Customers  int    `help:"Distinct customers in the generated rows." default:"10000"`
	JSON       bool   `help:"Print the result as JSON too."`
	CPUProfile string `help:"Write a CPU profile of the last round's sink run to this file." hidden:"" type:"path"`
}

// Run runs the benchmark.
func (c *BenchSinkCmd) Run(ctx context.Context, g *Globals, stdio IO, log *zap.Logger) error {
	cfg := bench.SinkConfig{Rows: c.Rows, Partitions: c.Partitions, Rounds: c.Rounds, BatchRows: c.BatchRows,
		Customers: c.Customers, JSON: c.JSON, CPUProfile: c.CPUProfile}
	return runBench(ctx, g, stdio, log, cfg.Validate, func(env *bench.Env) error {
		if err := checkClickHouse(ctx, env.ClickHouseServer); err != nil {
			return err
		}
		return bench.Sink(ctx, env, cfg)
	})
}

// BenchIngestCmd is `meterline bench ingest`.
type BenchIngestCmd struct {
	Events      int           `help:"Events per run; a multiple of --batch." default:"320000"`
	Batch       int           `help:"CloudEvents per request." default:"100"`
	Connections int           `help:"Keep-alive client connections." default:"32"`
	Partitions  int32         `help:"Partitions of each benchmark topic." default:"16"`
	Rounds      int           `help:"Rounds; each runs the baseline and the ingest once, in alternating order. Medians are reported." default:"3"`
	LatencyFor  time.Duration `help:"Length of the latency phase, at half the ingest's median rate." default:"15s"`
	JSON        bool          `help:"Print the result as JSON too."`
}

// Run runs the benchmark.
func (c *BenchIngestCmd) Run(ctx context.Context, g *Globals, stdio IO, log *zap.Logger) error {
	cfg := bench.IngestConfig{Events: c.Events, Batch: c.Batch, Connections: c.Connections, Partitions: c.Partitions,
		Rounds: c.Rounds, LatencyFor: c.LatencyFor, JSON: c.JSON}
	return runBench(ctx, g, stdio, log, cfg.Validate, func(env *bench.Env) error { return bench.Ingest(ctx, env, cfg) })
}
