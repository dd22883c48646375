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
	Queries   BenchQueriesCmd   `cmd:"" help:"The analyst queries of docs/analysts.md on generated data (100 M events by default), the resume lookup, and the sink with and without the analyst views."`
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
	Customers       int           `help:"Distinct customers." default:"10000"`
	Events          int           `help:"Events pre-filled in usage.deduped." default:"2000000"`
	Skewed          bool          `help:"Give one customer half of the events (so half of the input is in one partition of usage.deduped, which is keyed by customer)."`
	EntTick         time.Duration `name:"entitlements-tick" help:"Entitlements tick of the aggregator with entitlements (aggregate --entitlements-tick)." default:"200ms"`
	BenchStageFlags `embed:""`
	Rounds          int    `help:"Rounds; each measures (a), (b) and the aggregator once, in a rotating order. Medians are reported." default:"3"`
	CPUProfile      string `help:"Write a CPU profile of the last round's aggregator with entitlements to this file, and of the one without to this file with .without appended." hidden:"" type:"path"`
}

// Run runs the benchmark.
func (c *BenchAggregateCmd) Run(ctx context.Context, g *Globals, stdio IO, log *zap.Logger) error {
	cfg := bench.AggregateConfig{Customers: c.Customers, Events: c.Events, Skewed: c.Skewed, EntitlementsTick: c.EntTick, StageConfig: c.config(c.Rounds, c.CPUProfile)}
	return runBench(ctx, g, stdio, log, cfg.Validate, func(env *bench.Env) error { return bench.Aggregate(ctx, env, cfg) })
}

// BenchSinkCmd is `meterline bench sink`: rows/s into ClickHouse through
// the sink (Kafka → decode → INSERT → transactional offset commit) against
// a bare clickhouse-go batch loop writing the same rows.
type BenchSinkCmd struct {
	Rows           int      `help:"usage.deduped records (rows) per run." default:"1000000"`
	Partitions     int      `help:"Partitions of the benchmark topic." default:"16"`
	Rounds         int      `help:"Rounds; each runs the baseline and the sink once, in alternating order. Medians are reported." default:"3"`
	BatchRows      int      `help:"Rows per INSERT, the same for both (meterline sink --max-batch-records)." default:"${sink_max_batch_records}"`
	Customers      int      `help:"Distinct customers in the generated rows." default:"10000"`
	JSON           bool     `help:"Print the result as JSON too."`
	CPUProfile     string   `help:"Write a CPU profile of the last round's sink run to this file." hidden:"" type:"path"`
	AgainstNoViews bool     `help:"Compare the sink with the analyst views against the sink into a database without them (alternating rounds), instead of against the bare batch loop."`
	Views          []string `help:"Keep only these analyst views (materialized view names, comma-separated) in the databases; 'none' for none. Default: all." sep:","`
}

// Run runs the benchmark.
func (c *BenchSinkCmd) Run(ctx context.Context, g *Globals, stdio IO, log *zap.Logger) error {
	cfg := bench.SinkConfig{Rows: c.Rows, Partitions: c.Partitions, Rounds: c.Rounds, BatchRows: c.BatchRows,
		Customers: c.Customers, JSON: c.JSON, CPUProfile: c.CPUProfile, AgainstNoViews: c.AgainstNoViews}
	if len(c.Views) > 0 {
		cfg.Views = []string{}
		for _, v := range c.Views {
			if v != "none" {
				cfg.Views = append(cfg.Views, v)
			}
		}
	}
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
	LatencyFor  time.Duration `help:"Length of the latency phase, at half the ingest's median rate, for the baseline and for the ingest each, in alternating segments." default:"15s"`
	LatencyRate float64       `help:"Rate of the latency phase in events per second; 0: half the ingest's median rate."`
	Linger      time.Duration `help:"Producer linger of the ingest and of the baseline." default:"${ingest_linger}"`
	JSON        bool          `help:"Print the result as JSON too."`
}

// Run runs the benchmark.
func (c *BenchIngestCmd) Run(ctx context.Context, g *Globals, stdio IO, log *zap.Logger) error {
	cfg := bench.IngestConfig{Events: c.Events, Batch: c.Batch, Connections: c.Connections, Partitions: c.Partitions,
		Rounds: c.Rounds, LatencyFor: c.LatencyFor, LatencyRate: c.LatencyRate, Linger: c.Linger, JSON: c.JSON}
	return runBench(ctx, g, stdio, log, cfg.Validate, func(env *bench.Env) error { return bench.Ingest(ctx, env, cfg) })
}

// BenchQueriesCmd is `meterline bench queries`.
type BenchQueriesCmd struct {
	Events     int64         `help:"usage_events rows to generate." default:"100000000"`
	Revisions  int64         `help:"usage_aggregates rows to generate (about)." default:"10000000"`
	Customers  int64         `help:"Customer index space; the volume per customer is skewed (a few hold most of it)." default:"20000"`
	Months     int           `help:"Months of event time, from January 2024." default:"3"`
	Partitions int64         `help:"Kafka partitions of the generated rows." default:"16"`
	Runs       int           `help:"Timed runs of each query, after one warm-up run; median and max are reported." default:"5"`
	SinkRows   int           `help:"Rows of the sink comparison with and without the analyst views; 0 skips it." default:"1000000" zero:""`
	SinkRounds int           `help:"Rounds of the sink comparison." default:"3"`
	Database   string        `help:"ClickHouse database for the generated data. Default: a new one, dropped at the end."`
	Keep       bool          `help:"Keep the database (for --reuse)."`
	Reuse      bool          `help:"Skip the generation when --database already holds --events events."`
	Settle     time.Duration `help:"Longest wait for background merges to stop before the queries." default:"30m"`
	JSON       bool          `help:"Print the result as JSON too."`
}

// Run runs the benchmark.
func (c *BenchQueriesCmd) Run(ctx context.Context, g *Globals, stdio IO, log *zap.Logger) error {
	cfg := bench.QueriesConfig{Events: c.Events, Revisions: c.Revisions, Customers: c.Customers, Months: c.Months,
		Partitions: c.Partitions, Runs: c.Runs, SinkRows: c.SinkRows, SinkRounds: c.SinkRounds, Database: c.Database,
		Keep: c.Keep, Reuse: c.Reuse, Settle: c.Settle, JSON: c.JSON}
	return runBench(ctx, g, stdio, log, cfg.Validate, func(env *bench.Env) error { return bench.Queries(ctx, env, cfg) })
}
