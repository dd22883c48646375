package sink

import (
	"errors"
	"fmt"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/meterline/meterline/internal/session"
	"github.com/meterline/meterline/internal/topics"
)

// Defaults of the sink's session (session.Config has the others).
const (
	DefaultGroup            = "meterline-sink"
	DefaultRebalanceTimeout = 60 * time.Second
)

// Defaults of the sink's own fields (EnsureDefaults), which the CLI's sink
// flags show too.
const (
	DefaultDatabase          = "meterline"
	DefaultMaxBatchRecords   = 50_000
	DefaultMaxBatchBytes     = 64 << 20
	DefaultMaxBatchWait      = time.Second
	DefaultCommitInterval    = time.Second
	DefaultInsertTimeout     = 20 * time.Second
	DefaultUnknownErrorLimit = 5 * time.Minute
)

// Config configures a Writer. Zero fields take the defaults documented on
// them (EnsureDefaults); Validate reports every problem at once.
type Config struct {
	// Config is the instance's consumer group and transactional producer
	// (session.Config): Kafka (the connection; Kafka.Brokers is required),
	// Group (default: "meterline-sink"), InstanceID (required; the
	// transactional ID is "<Group>-<InstanceID>"), the session, rebalance
	// (default here: 60s) and transaction timeouts, RestartBackoff and
	// ClientOptions, with their defaults.
	session.Config
	// Topics names the six input topics (usage.deduped, usage.aggregates,
	// usage.adjustments, usage.duplicates, usage.rejected, usage.balances);
	// refused rows are parked in the rejected topic, and records of the
	// rejected topic that cannot be rows of usage_rejected go to the
	// usage_quarantine table. Default: topics.DefaultNames().
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
	// 50,000. Every INSERT costs the server a part per table it writes
	// (the ledger table and each analyst table its views fill), with
	// buffers per column, whatever its rows: at 10,000 rows per INSERT
	// that fixed cost is most of what the analyst views cost
	// (docs/benchmarks.md, "The analyst views"). MaxBatchWait and
	// CommitInterval bound how long a record waits, whatever this is.
	MaxBatchRecords int
	// MaxBatchBytes caps the bytes of the Kafka records (key, value and
	// headers) of one INSERT batch: a batch closes before the record that
	// would take it past this, or at MaxBatchRecords, whichever comes
	// first (a record larger than this is a batch of its own). The sink
	// holds at most three batches (one being written, one queued, one
	// being filled) and the records of one poll, each batch as decoded
	// rows and, while written, as the INSERT's columns; the Kafka client
	// fetches at most a 16th of this at a time (fetchOptions), so records
	// fetched ahead stay under one batch. Default: 64 MiB.
	MaxBatchBytes int64
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
	// flight, and for an attempt that failed without the server's answer
	// to end on the server, for at most InsertTimeout more, the whole
	// ending a tenth of RebalanceTimeout before it (settle.go). Default:
	// 20s.
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
	// sink backs off and retries, and /readyz says why, until a retry has
	// a row of the table accepted (of any partition of the batch: the
	// refusals of that retry are then parked). Refused rows found
	// before the cap is reached are parked (at most one per partition per
	// commit window: a row is parked before any higher offset of its
	// partition is inserted, so the rows after it cannot be tried first;
	// docs/design.md, The ClickHouse ledger, "Refused blocks").
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
	// offsets. The spell ends when an INSERT succeeds or the resume
	// lookup finds all of its rows in the table. Default: 5m.
	UnknownErrorLimit time.Duration
	// PingInterval is how often ClickHouse is pinged for /readyz.
	// Default: 2s.
	PingInterval time.Duration

	// Logger is the structured logger. Default: no logging.
	Logger *zap.Logger
	// Registerer receives the metrics. Default: a private registry.
	Registerer prometheus.Registerer

	// testHook, when set (tests only), is called on the sink's ClickHouse
	// INSERTs and Kafka commits, synchronously, in the order they happen.
	testHook func(hookEvent)
}

// EnsureDefaults fills zero fields with their defaults.
func (c *Config) EnsureDefaults() {
	if c.ClickHouseServer.Addr == "" {
		c.ClickHouseServer.Addr = c.ClickHouse
	}
	if c.ClickHouse == "" {
		c.ClickHouse = c.ClickHouseServer.Addr
	}
	if c.Group == "" {
		c.Group = DefaultGroup
	}
	if c.RebalanceTimeout == 0 {
		c.RebalanceTimeout = DefaultRebalanceTimeout
	}
	c.Config.EnsureDefaults()
	if c.Topics == (topics.Names{}) {
		c.Topics = topics.DefaultNames()
	}
	if c.Database == "" {
		c.Database = DefaultDatabase
	}
	if c.MaxBatchRecords == 0 {
		c.MaxBatchRecords = DefaultMaxBatchRecords
	}
	if c.MaxBatchBytes == 0 {
		c.MaxBatchBytes = DefaultMaxBatchBytes
	}
	if c.MaxBatchWait == 0 {
		c.MaxBatchWait = DefaultMaxBatchWait
	}
	if c.CommitInterval == 0 {
		c.CommitInterval = DefaultCommitInterval
	}
	if c.InsertTimeout == 0 {
		c.InsertTimeout = DefaultInsertTimeout
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
		c.UnknownErrorLimit = DefaultUnknownErrorLimit
	}
	if c.PingInterval == 0 {
		c.PingInterval = 2 * time.Second
	}
	if c.Logger == nil {
		c.Logger = zap.NewNop()
	}
	if c.Registerer == nil {
		c.Registerer = prometheus.NewRegistry()
	}
}

// Validate reports every invalid field at once, each named as its flag is
// (--insert-timeout: "sink: insert-timeout: ..."; the session's as
// session.Config names them).
func (c *Config) Validate() error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("sink: %s: %s", field, fmt.Sprintf(format, args...)))
	}
	if err := c.Config.Validate(); err != nil {
		errs = append(errs, err)
	}
	if c.Conn == nil {
		if err := c.ClickHouseServer.Validate(); err != nil {
			errs = append(errs, err)
		}
	}
	if c.ClickHouse != c.ClickHouseServer.Addr {
		bad("clickhouse", "%q differs from the server's address %q: set one", c.ClickHouse, c.ClickHouseServer.Addr)
	}
	if !databaseName.MatchString(c.Database) {
		bad("database", "%q: want letters, digits and underscores", c.Database)
	}
	for _, n := range []struct{ flag, v string }{
		{"topic-deduped", c.Topics.DedupedTopic()}, {"topic-aggregates", c.Topics.AggregatesTopic()},
		{"topic-adjustments", c.Topics.AdjustmentsTopic()}, {"topic-duplicates", c.Topics.DuplicatesTopic()},
		{"topic-rejected", c.Topics.RejectedTopic()}, {"topic-balances", c.Topics.BalancesTopic()},
	} {
		if n.v == c.Topics.Prefix {
			bad(n.flag, "empty topic name")
		}
	}
	if c.MaxBatchRecords < 1 {
		bad("max-batch-records", "%d: must be at least 1", c.MaxBatchRecords)
	}
	if c.MaxBatchBytes < 1 {
		bad("max-batch-bytes", "%d: must be at least 1", c.MaxBatchBytes)
	}
	if c.MaxBatchWait <= 0 {
		bad("max-batch-wait", "%s: must be positive", c.MaxBatchWait)
	}
	if c.CommitInterval <= 0 {
		bad("commit-interval", "%s: must be positive", c.CommitInterval)
	}
	if c.InsertBlockRows < 0 {
		bad("insert-block-rows", "%d: must not be negative", c.InsertBlockRows)
	}
	if c.InsertTimeout <= 0 || c.InsertTimeout >= c.RebalanceTimeout {
		bad("insert-timeout", "%s: must be positive and shorter than rebalance-timeout (%s): a revoke waits for the INSERT in flight", c.InsertTimeout, c.RebalanceTimeout)
	}
	if c.QueryTimeout <= 0 {
		bad("query-timeout", "%s: must be positive", c.QueryTimeout)
	}
	if c.BackoffMin <= 0 || c.BackoffMax < c.BackoffMin {
		bad("backoff-min", "%s (backoff-max %s): want 0 < backoff-min ≤ backoff-max", c.BackoffMin, c.BackoffMax)
	}
	if c.MaxRefusedInARow < 1 {
		bad("max-refused-in-a-row", "%d: must be at least 1", c.MaxRefusedInARow)
	}
	if c.UnknownErrorLimit < 0 {
		bad("unknown-error-limit", "%s: must not be negative", c.UnknownErrorLimit)
	}
	return errors.Join(errs...)
}
