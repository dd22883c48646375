package cli

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/meterline/meterline/internal/service"
	"github.com/meterline/meterline/internal/session"
	"github.com/meterline/meterline/internal/topics"
	"github.com/meterline/meterline/sink"
)

// SinkFlags are the sink's own flags: `meterline sink` takes them as they
// are, `meterline run` with the prefix sink- (--sink-database, ...).
type SinkFlags struct {
	Group             string        `help:"Consumer group of the sink." default:"${sink_group}"`
	Database          string        `help:"ClickHouse database holding the tables." default:"${sink_database}"`
	Migrate           bool          `help:"Apply pending ClickHouse migrations before starting (as meterline migrate)."`
	MaxBatchRecords   int           `help:"Most Kafka records in one INSERT batch (one INSERT per table)." default:"${sink_max_batch_records}"`
	MaxBatchBytes     int64         `help:"Most bytes of Kafka records (key, value, headers) in one INSERT batch; a batch closes at this or --${flag_prefix}max-batch-records, whichever comes first." default:"${sink_max_batch_bytes}"`
	MaxBatchWait      time.Duration `help:"Longest a record waits for its INSERT." default:"${sink_max_batch_wait}"`
	CommitInterval    time.Duration `help:"Longest a record waits for its offset commit (one transaction after the window's INSERTs)." default:"${sink_commit_interval}"`
	InsertBlockRows   int           `help:"Send each INSERT as blocks of at most this many rows; 0: one block." default:"0"`
	InsertTimeout     time.Duration `help:"Deadline of one INSERT attempt; shorter than the rebalance timeout." default:"${sink_insert_timeout}"`
	UnknownErrorLimit time.Duration `help:"How long INSERTs failing with a ClickHouse error code the sink knows neither as a refusal of rows nor as transient are retried (nothing parked, nothing committed) before the sink stops with an error." default:"${sink_unknown_error_limit}"`
}

// config builds the sink's configuration; the Kafka session settings come
// from the caller (the sink's own flags, or run's shared stage flags).
func (f *SinkFlags) config(g *Globals, instanceID string, sessionTimeout, rebalance, txn time.Duration, log *zap.Logger, reg prometheus.Registerer) (sink.Config, error) {
	id, err := resolveInstanceID(instanceID)
	if err != nil {
		return sink.Config{}, err
	}
	kc, err := g.kafka()
	if err != nil {
		return sink.Config{}, err
	}
	srv, err := g.clickHouse()
	if err != nil {
		return sink.Config{}, err
	}
	cfg := sink.Config{
		Config: session.Config{Kafka: kc, Group: f.Group, InstanceID: id,
			SessionTimeout: sessionTimeout, RebalanceTimeout: rebalance, TransactionTimeout: txn},
		Topics: g.Topic, ClickHouseServer: srv, Database: f.Database,
		MaxBatchRecords: f.MaxBatchRecords, MaxBatchBytes: f.MaxBatchBytes, MaxBatchWait: f.MaxBatchWait, CommitInterval: f.CommitInterval, InsertBlockRows: f.InsertBlockRows,
		InsertTimeout: f.InsertTimeout, UnknownErrorLimit: f.UnknownErrorLimit, Logger: log, Registerer: reg,
	}
	cfg.EnsureDefaults()
	return cfg, cfg.Validate()
}

// SinkCmd is `meterline sink`: it runs the sink unless a subcommand is
// named.
type SinkCmd struct {
	Run           SinkRunCmd           `cmd:"" default:"withargs" help:"Run the sink (what meterline sink does without a subcommand)."`
	AcceptOffsets SinkAcceptOffsetsCmd `cmd:"" name:"accept-offsets" help:"Skip records on purpose: record the group's committed offsets that are ahead of the database as its progress, with an audit row each in sink_offset_skips, so the sink starts. Refuses while the group has members."`
}

// SinkRunCmd is `meterline sink [run]`.
type SinkRunCmd struct {
	SinkFlags          `embed:""`
	InstanceID         string        `help:"Instance ID, stable across restarts and unique in the group; the transactional ID is <group>-<instance-id>. Letters, digits, ., _ and - only (up to 249). Default: the host name."`
	SessionTimeout     time.Duration `help:"Consumer group session timeout." default:"${session_timeout}"`
	RebalanceTimeout   time.Duration `help:"Consumer group rebalance timeout." default:"${sink_rebalance_timeout}"`
	TransactionTimeout time.Duration `help:"Broker-side timeout that aborts a dead instance's open transaction." default:"${session_transaction_timeout}"`
	MetricsAddr        string        `help:"Address of the HTTP server: the status page at / (and /status.json), /metrics, /healthz and /readyz. Loopback by default; :9466 serves every interface." default:"127.0.0.1:9466"`
	MetricsHostsFlags  `embed:""`
	Validate           bool `help:"Check the configuration and exit."`
}

// Run runs the sink.
func (c *SinkRunCmd) Run(ctx context.Context, g *Globals, stdio IO, log *zap.Logger) (err error) {
	reg := service.NewRegistry()
	cfg, err := c.config(g, c.InstanceID, c.SessionTimeout, c.RebalanceTimeout, c.TransactionTimeout, log, reg)
	if err != nil {
		return &ExitError{Code: 2, Err: err}
	}
	if c.Validate {
		fmt.Fprintln(stdio.Stdout, "configuration ok")
		return nil
	}
	defer cleanStopAtStart(ctx, log, &err)
	if _, err := g.connectKafka(ctx); err != nil {
		return err
	}
	if err := checkClickHouse(ctx, cfg.ClickHouseServer); err != nil {
		return err
	}
	if c.Migrate {
		if err := migrate(ctx, g, cfg.ClickHouseServer, c.Database, cfg.Group, 0, stdio, log); err != nil {
			return err
		}
	}
	w, err := sink.New(cfg)
	if err != nil {
		return err
	}
	return runStage(ctx, g, metricsServer{c.MetricsAddr, c.MetricsAllowedHosts}, reg, log, []lagGroup{{"sink", cfg.Group, sinkInputs(g.Topic)}}, w.Ready, w.Run, sinkStatus(cfg, g.Topic))
}

// sinkStatus reports the sink's group, instance ID and input topics on the
// status page; its partition count, records and lag come from the metrics.
func sinkStatus(cfg sink.Config, n topics.Names) func() service.StageStatus {
	st := service.StageStatus{Stage: "sink", Group: cfg.Group, Instance: cfg.InstanceID, Input: strings.Join(sinkInputs(n), ", ")}
	return func() service.StageStatus { return st }
}

// sinkInputs are the topics the sink consumes (package sink).
func sinkInputs(n topics.Names) []string {
	return []string{n.DedupedTopic(), n.AggregatesTopic(), n.AdjustmentsTopic(), n.DuplicatesTopic(), n.RejectedTopic(), n.BalancesTopic()}
}

// MigrateCmd is `meterline migrate`.
type MigrateCmd struct {
	Database string        `help:"ClickHouse database to create (if missing) and migrate." default:"${sink_database}"`
	Group    string        `help:"Consumer group of the sink: a database that has migrations applied is migrated only while this group has no members (read from Kafka, --brokers)." default:"${sink_group}"`
	LockWait time.Duration `help:"Longest wait for the migrate lock while another migration run holds it on the database; then exit 1." default:"10m"`
}

// Run applies the pending migrations.
func (c *MigrateCmd) Run(ctx context.Context, g *Globals, stdio IO, log *zap.Logger) error {
	srv, err := g.clickHouse()
	if err != nil {
		return err
	}
	return migrate(ctx, g, srv, c.Database, c.Group, c.LockWait, stdio, log)
}

// migrate applies the pending migrations of db while no member of the
// sink's group runs, under the migrate lock, waiting up to lockWait (0:
// sink.DefaultMigrateLockWait) while another run holds it
// (sink.MigrateWith); Kafka is asked only when a migration is pending.
func migrate(ctx context.Context, g *Globals, srv sink.Server, db, group string, lockWait time.Duration, stdio IO, log *zap.Logger) error {
	conn, err := srv.Dial(ctx, db, true)
	if err != nil {
		return err
	}
	defer conn.Close()
	members := func(ctx context.Context) ([]string, error) {
		adm, closeAdm, err := adminClient(ctx, g)
		if err != nil {
			return nil, err
		}
		defer closeAdm()
		return sink.GroupMembers(adm, g.principal(), group)(ctx)
	}
	res, err := sink.MigrateWith(ctx, conn, sink.MigrateOptions{SinkMembers: members, LockWait: lockWait, Database: db, Log: log})
	applied := 0
	for _, r := range res {
		state := "already applied"
		if r.Applied {
			state = "applied"
			applied++
			log.Info("migration applied", zap.String("database", db), zap.String("migration", r.Migration.Name))
		}
		fmt.Fprintf(stdio.Stdout, "%s: %s\n", r.Migration.Name, state)
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(stdio.Stdout, "database %s on %s: %d applied now, %d in total\n", db, srv.Addr, applied, len(res))
	if err := sink.CheckRebuilds(ctx, conn); errors.Is(err, sink.ErrRebuildUnfinished) {
		// Not an error of migrate: the next step is the backfill.
		fmt.Fprintf(stdio.Stdout, "derived tables need a backfill before a sink may start: %v\n", err)
	} else if err != nil {
		return err
	}
	return nil
}

// SinkAcceptOffsetsCmd is `meterline sink accept-offsets`.
type SinkAcceptOffsetsCmd struct {
	Group     string        `help:"Consumer group of the sink." default:"${sink_group}"`
	Database  string        `help:"ClickHouse database holding the tables." default:"${sink_database}"`
	Topic     string        `help:"Accept only this topic's offsets (one the sink consumes). Default: every topic's."`
	Partition []int32       `help:"Accept only these partitions of --topic, comma-separated; each must have a committed offset. Default: every partition ahead."`
	By        string        `help:"Who accepts, recorded in sink_offset_skips. Default: user@host of this process."`
	Timeout   time.Duration `help:"Deadline of each query." default:"30s"`
}

// Run records the group's committed offsets that are ahead of the database
// as its progress.
func (c *SinkAcceptOffsetsCmd) Run(ctx context.Context, g *Globals, stdio IO, log *zap.Logger) error {
	if len(c.Partition) > 0 && c.Topic == "" {
		return &ExitError{Code: 2, Err: errors.New("sink accept-offsets: --partition needs --topic")}
	}
	conn, err := g.dialDatabase(ctx, c.Database)
	if err != nil {
		return err
	}
	defer conn.Close()
	adm, closeAdm, err := adminClient(ctx, g)
	if err != nil {
		return err
	}
	defer closeAdm()
	acc, err := sink.AcceptOffsets(ctx, sink.AcceptOffsetsConfig{Conn: conn, Database: c.Database, Group: c.Group, Admin: adm, Principal: g.principal(),
		Topics: sinkInputs(g.Topic), Topic: c.Topic, Partitions: c.Partition, By: c.By, Logger: log, QueryTimeout: c.Timeout})
	if err != nil {
		return err
	}
	if len(acc) == 0 {
		fmt.Fprintf(stdio.Stdout, "no committed offset of group %s is ahead of database %s: nothing accepted\n", c.Group, c.Database)
		return nil
	}
	for _, a := range acc {
		fmt.Fprintf(stdio.Stdout, "%s partition %d: accepted committed offset %d; records %d..%d are in no table (recorded in %s)\n",
			a.Topic, a.Partition, a.To, a.From, a.To-1, sink.SkipsTable)
	}
	return nil
}
