package cli

import (
	"context"
	"fmt"
	"os"
	"time"

	"go.uber.org/zap"

	"github.com/meterline/meterline/internal/service"
	"github.com/meterline/meterline/sink"
)

// SinkCmd is `meterline sink`.
type SinkCmd struct {
	Group              string        `help:"Consumer group of the sink." default:"meterline-sink"`
	InstanceID         string        `help:"Instance ID, stable across restarts and unique in the group; the transactional ID is <group>-<instance-id>. Default: the host name."`
	Database           string        `help:"ClickHouse database holding the tables." default:"meterline"`
	Migrate            bool          `help:"Apply pending ClickHouse migrations before starting (as meterline migrate)."`
	MaxBatchRecords    int           `help:"Most Kafka records in one INSERT batch (one INSERT per table)." default:"10000"`
	MaxBatchWait       time.Duration `help:"Longest a record waits for its INSERT." default:"1s"`
	CommitInterval     time.Duration `help:"Longest a record waits for its offset commit (one transaction after the window's INSERTs)." default:"1s"`
	InsertBlockRows    int           `help:"Send each INSERT as blocks of at most this many rows; 0: one block." default:"0"`
	InsertTimeout      time.Duration `help:"Deadline of one INSERT attempt; shorter than the rebalance timeout." default:"20s"`
	SessionTimeout     time.Duration `help:"Consumer group session timeout." default:"10s"`
	RebalanceTimeout   time.Duration `help:"Consumer group rebalance timeout." default:"60s"`
	TransactionTimeout time.Duration `help:"Broker-side timeout that aborts a dead instance's open transaction." default:"10s"`
	MetricsAddr        string        `help:"Address of the HTTP server for /metrics, /healthz and /readyz." default:":9466"`
	Validate           bool          `help:"Check the configuration and exit."`
}

func (c *SinkCmd) config(g *Globals, log *zap.Logger) (sink.Config, error) {
	id := c.InstanceID
	if id == "" {
		h, err := os.Hostname()
		if err != nil {
			return sink.Config{}, fmt.Errorf("--instance-id not set and no host name: %w", err)
		}
		id = h
	}
	cfg := sink.Config{
		Brokers: g.Brokers, Group: c.Group, InstanceID: id, Topics: g.Topic,
		ClickHouse: g.ClickHouse, Database: c.Database,
		MaxBatchRecords: c.MaxBatchRecords, MaxBatchWait: c.MaxBatchWait, CommitInterval: c.CommitInterval, InsertBlockRows: c.InsertBlockRows,
		InsertTimeout: c.InsertTimeout, SessionTimeout: c.SessionTimeout, RebalanceTimeout: c.RebalanceTimeout,
		TransactionTimeout: c.TransactionTimeout, Logger: log,
	}
	cfg.EnsureDefaults()
	return cfg, cfg.Validate()
}

// Run runs the sink.
func (c *SinkCmd) Run(ctx context.Context, g *Globals, stdio IO, log *zap.Logger) error {
	reg := service.NewRegistry()
	cfg, err := c.config(g, log)
	if err != nil {
		return &ExitError{Code: 2, Err: err}
	}
	cfg.Registerer = reg
	if c.Validate {
		fmt.Fprintln(stdio.Stdout, "configuration ok")
		return nil
	}
	if c.Migrate {
		if err := migrate(ctx, g.ClickHouse, c.Database, stdio, log); err != nil {
			return err
		}
	}
	w, err := sink.New(cfg)
	if err != nil {
		return err
	}
	return runStage(ctx, c.MetricsAddr, reg, log, w.Ready, w.Run)
}

// MigrateCmd is `meterline migrate`.
type MigrateCmd struct {
	Database string `help:"ClickHouse database to create (if missing) and migrate." default:"meterline"`
}

// Run applies the pending migrations.
func (c *MigrateCmd) Run(ctx context.Context, g *Globals, stdio IO, log *zap.Logger) error {
	return migrate(ctx, g.ClickHouse, c.Database, stdio, log)
}

func migrate(ctx context.Context, addr, db string, stdio IO, log *zap.Logger) error {
	conn, err := sink.Dial(ctx, addr, db, true)
	if err != nil {
		return err
	}
	defer conn.Close()
	res, err := sink.Migrate(ctx, conn)
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
	fmt.Fprintf(stdio.Stdout, "database %s on %s: %d applied now, %d in total\n", db, addr, applied, len(res))
	return nil
}
