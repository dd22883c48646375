package sink

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/meterline/meterline/internal/kafka"
	"github.com/meterline/meterline/internal/topics"
)

// Config configures a Writer. Zero fields take the defaults documented on
// them (EnsureDefaults); Validate reports every problem at once.
type Config struct {
	// Kafka is the connection to the cluster: seed brokers, SASL and TLS.
	// Kafka.Brokers is required, or Brokers.
	Kafka kafka.Config
	// Brokers is shorthand for Kafka.Brokers, for a cluster without SASL
	// or TLS; EnsureDefaults copies it there. Setting both is an error.
	Brokers []string
	// Group is the consumer group. Default: "meterline-sink".
	Group string
	// InstanceID names this instance; the transactional ID is
	// "<Group>-<InstanceID>". It must be stable across restarts, so that a
	// restart fences its own zombie at once, and unique in the group.
	// Required.
	InstanceID string
	// Topics names the six input topics (usage.deduped, usage.aggregates,
	// usage.adjustments, usage.duplicates, usage.rejected, usage.balances);
	// refused rows
	// are parked in the rejected topic, and records of the rejected topic
	// that cannot be rows of usage_rejected go to the usage_quarantine
	// table. Default: topics.DefaultNames().
	Topics topics.Names

	// ClickHouseServer is how to reach ClickHouse: address, user,
	// password, TLS. Its address (or ClickHouse) is required unless Conn
	// is set.
	ClickHouseServer Server
	// ClickHouse is shorthand for ClickHouseServer.Addr; EnsureDefaults
	// copies it there. Setting both is an error.
	ClickHouse string
	// Database holds the tables. Default: "meterline".
	Database string
	// Conn, when set, is used instead of dialling ClickHouse (tests,
	// benchmarks); its default database must be Database. Run does not
	// close it.
	Conn driver.Conn

	// MaxBatchRecords caps the Kafka records (rows, and watermarks, which
	// are not rows) of one INSERT batch: one INSERT per table. Default:
	// 10,000.
	MaxBatchRecords int
	// MaxBatchWait is the longest a polled record waits for its INSERT.
	// Default: 1s.
	MaxBatchWait time.Duration
	// CommitInterval is the longest a polled record waits for its offset
	// commit: one transaction commits the offsets of every batch inserted
	// since the last one, after those INSERTs succeeded. Default: 1s.
	CommitInterval time.Duration
	// InsertBlockRows, when positive, sends each INSERT as blocks of at most
	// this many rows (one INSERT query, several blocks, each written as its
	// own parts). Default: 0, one block per INSERT.
	InsertBlockRows int
	// InsertTimeout is the deadline of one INSERT attempt. It must be
	// shorter than RebalanceTimeout: a revoke waits for the attempt in
	// flight. Default: 20s.
	InsertTimeout time.Duration
	// QueryTimeout is the deadline of one resume lookup. Default: 10s.
	QueryTimeout time.Duration
	// BackoffMin and BackoffMax bound the exponential back-off while
	// ClickHouse is unavailable. Defaults: 200ms and 5s.
	BackoffMin, BackoffMax time.Duration
	// MaxRefusedInARow caps the rows of one table that ClickHouse may
	// refuse in a row, with no row of the table accepted in between,
	// before the table is treated as refusing everything (schema drift, a
	// broken MATERIALIZED column): past it nothing more is parked, the
	// sink backs off and retries, and /readyz says why. Refused rows found
	// before the cap is reached are parked (at most one per partition per
	// commit window: DESIGN §7 parks a row before any higher offset of its
	// partition is inserted, so the rows after it cannot be tried first).
	// Default: 100.
	MaxRefusedInARow int
	// UnknownErrorLimit bounds how long the sink retries a table whose
	// INSERTs ClickHouse fails with an exception code the sink knows
	// neither as a refusal of the rows nor as transient (a missing
	// dictionary behind a MATERIALIZED column, a code added by a newer
	// server). Until then it backs off as when ClickHouse is unavailable:
	// fetching paused, nothing committed, nothing parked, /readyz not
	// ready. Past it Run stops with ErrUnknownServerError rather than
	// park rows that may be fine; a restart resumes from the committed
	// offsets. The spell ends when an INSERT succeeds. Default: 5m.
	UnknownErrorLimit time.Duration
	// PingInterval is how often ClickHouse is pinged for /readyz.
	// Default: 2s.
	PingInterval time.Duration

	// SessionTimeout is the group session timeout. Default: 10s.
	SessionTimeout time.Duration
	// RebalanceTimeout bounds a rebalance. Default: 60s.
	RebalanceTimeout time.Duration
	// TransactionTimeout is the broker-side timeout after which an open
	// transaction of a dead instance is aborted. Default: 10s.
	TransactionTimeout time.Duration
	// RestartBackoff is the pause before a session is rebuilt after a
	// commit with an unknown outcome. Default: 1s.
	RestartBackoff time.Duration

	// Logger is the structured logger. Default: no logging.
	Logger *zap.Logger
	// Registerer receives the metrics. Default: a private registry.
	Registerer prometheus.Registerer
	// ClientOptions are appended to the Kafka client options (tests).
	ClientOptions []kgo.Opt

	// testHook, when set (tests only), is called on the sink's ClickHouse
	// INSERTs and Kafka commits, synchronously, in the order they happen.
	testHook func(hookEvent)
}

// EnsureDefaults fills zero fields with their defaults.
func (c *Config) EnsureDefaults() {
	if len(c.Kafka.Brokers) == 0 {
		c.Kafka.Brokers = c.Brokers
	}
	if len(c.Brokers) == 0 {
		c.Brokers = c.Kafka.Brokers
	}
	if c.ClickHouseServer.Addr == "" {
		c.ClickHouseServer.Addr = c.ClickHouse
	}
	if c.ClickHouse == "" {
		c.ClickHouse = c.ClickHouseServer.Addr
	}
	if c.Group == "" {
		c.Group = "meterline-sink"
	}
	if c.Topics == (topics.Names{}) {
		c.Topics = topics.DefaultNames()
	}
	if c.Database == "" {
		c.Database = "meterline"
	}
	if c.MaxBatchRecords == 0 {
		c.MaxBatchRecords = 10000
	}
	if c.MaxBatchWait == 0 {
		c.MaxBatchWait = time.Second
	}
	if c.CommitInterval == 0 {
		c.CommitInterval = time.Second
	}
	if c.InsertTimeout == 0 {
		c.InsertTimeout = 20 * time.Second
	}
	if c.QueryTimeout == 0 {
		c.QueryTimeout = 10 * time.Second
	}
	if c.BackoffMin == 0 {
		c.BackoffMin = 200 * time.Millisecond
	}
	if c.BackoffMax == 0 {
		c.BackoffMax = 5 * time.Second
	}
	if c.MaxRefusedInARow == 0 {
		c.MaxRefusedInARow = 100
	}
	if c.UnknownErrorLimit == 0 {
		c.UnknownErrorLimit = 5 * time.Minute
	}
	if c.PingInterval == 0 {
		c.PingInterval = 2 * time.Second
	}
	if c.SessionTimeout == 0 {
		c.SessionTimeout = 10 * time.Second
	}
	if c.RebalanceTimeout == 0 {
		c.RebalanceTimeout = 60 * time.Second
	}
	if c.TransactionTimeout == 0 {
		c.TransactionTimeout = 10 * time.Second
	}
	if c.RestartBackoff == 0 {
		c.RestartBackoff = time.Second
	}
	if c.Logger == nil {
		c.Logger = zap.NewNop()
	}
	if c.Registerer == nil {
		c.Registerer = prometheus.NewRegistry()
	}
}

// Validate reports every invalid field, each with its name.
func (c *Config) Validate() error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("sink config: %s: %s", field, fmt.Sprintf(format, args...)))
	}
	if err := c.Kafka.Validate(); err != nil {
		bad("Kafka", "%v", err)
	}
	if !slices.Equal(c.Brokers, c.Kafka.Brokers) {
		bad("Brokers", "%q differs from Kafka.Brokers %q: set one", c.Brokers, c.Kafka.Brokers)
	}
	if c.InstanceID == "" {
		bad("InstanceID", "required (stable across restarts, unique in the group)")
	}
	if c.Conn == nil {
		if err := c.ClickHouseServer.Validate(); err != nil {
			bad("ClickHouseServer", "%v", err)
		}
	}
	if c.ClickHouse != c.ClickHouseServer.Addr {
		bad("ClickHouse", "%q differs from ClickHouseServer.Addr %q: set one", c.ClickHouse, c.ClickHouseServer.Addr)
	}
	if !databaseName.MatchString(c.Database) {
		bad("Database", "%q: want letters, digits and underscores", c.Database)
	}
	for _, n := range []struct{ field, v string }{
		{"Topics.Deduped", c.Topics.DedupedTopic()}, {"Topics.Aggregates", c.Topics.AggregatesTopic()},
		{"Topics.Adjustments", c.Topics.AdjustmentsTopic()}, {"Topics.Duplicates", c.Topics.DuplicatesTopic()},
		{"Topics.Rejected", c.Topics.RejectedTopic()},
	} {
		if n.v == c.Topics.Prefix {
			bad(n.field, "empty topic name")
		}
	}
	if c.MaxBatchRecords < 1 {
		bad("MaxBatchRecords", "%d: must be at least 1", c.MaxBatchRecords)
	}
	if c.MaxBatchWait <= 0 {
		bad("MaxBatchWait", "%s: must be positive", c.MaxBatchWait)
	}
	if c.CommitInterval <= 0 {
		bad("CommitInterval", "%s: must be positive", c.CommitInterval)
	}
	if c.InsertBlockRows < 0 {
		bad("InsertBlockRows", "%d: must not be negative", c.InsertBlockRows)
	}
	if c.InsertTimeout <= 0 || c.InsertTimeout >= c.RebalanceTimeout {
		bad("InsertTimeout", "%s: must be positive and shorter than RebalanceTimeout (%s): a revoke waits for the INSERT in flight", c.InsertTimeout, c.RebalanceTimeout)
	}
	if c.QueryTimeout <= 0 {
		bad("QueryTimeout", "%s: must be positive", c.QueryTimeout)
	}
	if c.BackoffMin <= 0 || c.BackoffMax < c.BackoffMin {
		bad("BackoffMin/BackoffMax", "%s/%s: want 0 < min ≤ max", c.BackoffMin, c.BackoffMax)
	}
	if c.MaxRefusedInARow < 1 {
		bad("MaxRefusedInARow", "%d: must be at least 1", c.MaxRefusedInARow)
	}
	if c.UnknownErrorLimit < 0 {
		bad("UnknownErrorLimit", "%s: must not be negative", c.UnknownErrorLimit)
	}
	if c.SessionTimeout <= 0 || c.RebalanceTimeout <= 0 || c.TransactionTimeout <= 0 {
		bad("SessionTimeout/RebalanceTimeout/TransactionTimeout", "must be positive")
	}
	return errors.Join(errs...)
}

// TransactionalID is "<Group>-<InstanceID>" (DESIGN §1).
func (c *Config) TransactionalID() string { return c.Group + "-" + c.InstanceID }
