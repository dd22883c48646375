package stream

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/meterline/meterline/internal/clock"
	"github.com/meterline/meterline/internal/kafka"
)

// Config configures a Runtime. Zero fields take the defaults documented on
// them (EnsureDefaults); Validate reports every problem at once.
type Config struct {
	// Stage names the stage in logs and metrics: "dedup", "aggregate".
	Stage string
	// Kafka is the connection to the cluster: seed brokers, SASL and TLS.
	// Every client of the runtime (the transactional session, restore
	// readers) connects with it. Kafka.Brokers is required, or Brokers.
	Kafka kafka.Config
	// Brokers is shorthand for Kafka.Brokers, for a cluster without SASL
	// or TLS; EnsureDefaults copies it there. Setting both is an error.
	Brokers []string
	// Group is the consumer group. Required.
	Group string
	// InstanceID names this instance; the transactional ID is
	// "<Group>-<InstanceID>". It must be stable across restarts of the same
	// instance, so a restart fences its own zombie at once, and unique in
	// the group. Required.
	InstanceID string
	// InputTopic is consumed (read_committed). Required.
	InputTopic string
	// ChangelogTopic holds every state change; it must have exactly as many
	// partitions as InputTopic. Required.
	ChangelogTopic string
	// StateDir is where Pebble keeps the local state. Required unless FS is
	// an in-memory filesystem.
	StateDir string
	// FS is Pebble's filesystem. Default: the OS filesystem. Tests use
	// vfs.NewMem().
	FS vfs.FS

	// CommitInterval is the longest a transaction stays open while input
	// keeps arriving. Default: DefaultCommitInterval.
	CommitInterval time.Duration
	// MaxBatchRecords caps the input records of one transaction. Default:
	// DefaultMaxBatchRecords.
	MaxBatchRecords int
	// PunctuateInterval is how often Partition.Punctuate runs (dedup's tick
	// interval). Zero disables it. Default: 0.
	PunctuateInterval time.Duration
	// SessionTimeout is the group session timeout. Default: 10s.
	SessionTimeout time.Duration
	// RebalanceTimeout bounds a rebalance. Default: 30s.
	RebalanceTimeout time.Duration
	// TransactionTimeout is the broker-side timeout after which an open
	// transaction of a dead instance is aborted. Default: 10s.
	TransactionTimeout time.Duration
	// RestartBackoff is the pause before a session is rebuilt after a
	// failed commit. Default: 1s.
	RestartBackoff time.Duration

	// Clock drives the commit and punctuate timers and dates checkpoints
	// for the restore horizon (DESIGN §6.8), never billing decisions.
	// Default: the system clock.
	Clock clock.Clock
	// Logger is the structured logger. Default: no logging.
	Logger *zap.Logger
	// Registerer receives the runtime's metrics. Default: a private
	// registry (metrics are not exported).
	Registerer prometheus.Registerer
	// ClientOptions are appended to the Kafka client options (tests).
	ClientOptions []kgo.Opt
}

// The defaults of Config (EnsureDefaults), which the CLI's stage flags show
// too.
const (
	DefaultCommitInterval  = 100 * time.Millisecond
	DefaultMaxBatchRecords = 10_000
)

// EnsureDefaults fills zero fields with their defaults.
func (c *Config) EnsureDefaults() {
	if len(c.Kafka.Brokers) == 0 {
		c.Kafka.Brokers = c.Brokers
	}
	if len(c.Brokers) == 0 {
		c.Brokers = c.Kafka.Brokers
	}
	if c.FS == nil {
		c.FS = vfs.Default
	}
	if c.CommitInterval == 0 {
		c.CommitInterval = DefaultCommitInterval
	}
	if c.MaxBatchRecords == 0 {
		c.MaxBatchRecords = DefaultMaxBatchRecords
	}
	if c.SessionTimeout == 0 {
		c.SessionTimeout = 10 * time.Second
	}
	if c.RebalanceTimeout == 0 {
		c.RebalanceTimeout = 30 * time.Second
	}
	if c.TransactionTimeout == 0 {
		c.TransactionTimeout = 10 * time.Second
	}
	if c.RestartBackoff == 0 {
		c.RestartBackoff = time.Second
	}
	if c.Clock == nil {
		c.Clock = clock.Real{}
	}
	if c.Logger == nil {
		c.Logger = zap.NewNop()
	}
	if c.Registerer == nil {
		c.Registerer = prometheus.NewRegistry()
	}
	if c.Stage == "" {
		c.Stage = "stream"
	}
}

// Validate returns every problem with the config, joined, each with its
// field name.
func (c *Config) Validate() error {
	var errs []error
	req := func(field, v string) {
		if v == "" {
			errs = append(errs, fmt.Errorf("stream: %s is required", field))
		}
	}
	if err := c.Kafka.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("stream: %w", err))
	}
	if !slices.Equal(c.Brokers, c.Kafka.Brokers) {
		errs = append(errs, fmt.Errorf("stream: brokers %q and kafka brokers %q: set one", c.Brokers, c.Kafka.Brokers))
	}
	req("group", c.Group)
	req("instance-id", c.InstanceID)
	req("input-topic", c.InputTopic)
	req("changelog-topic", c.ChangelogTopic)
	if _, mem := c.FS.(*vfs.MemFS); !mem {
		req("state-dir", c.StateDir)
	}
	pos := func(field string, d time.Duration) {
		if d <= 0 {
			errs = append(errs, fmt.Errorf("stream: %s must be positive (got %s)", field, d))
		}
	}
	pos("commit-interval", c.CommitInterval)
	pos("session-timeout", c.SessionTimeout)
	pos("rebalance-timeout", c.RebalanceTimeout)
	pos("transaction-timeout", c.TransactionTimeout)
	if c.PunctuateInterval < 0 {
		errs = append(errs, fmt.Errorf("stream: punctuate-interval must not be negative (got %s)", c.PunctuateInterval))
	}
	if c.MaxBatchRecords <= 0 {
		errs = append(errs, fmt.Errorf("stream: max-batch-records must be positive (got %d)", c.MaxBatchRecords))
	}
	if c.TransactionTimeout < c.CommitInterval {
		errs = append(errs, fmt.Errorf("stream: transaction-timeout %s is shorter than commit-interval %s", c.TransactionTimeout, c.CommitInterval))
	}
	return errors.Join(errs...)
}

// TransactionalID is "<Group>-<InstanceID>" (DESIGN §1).
func (c *Config) TransactionalID() string { return c.Group + "-" + c.InstanceID }
