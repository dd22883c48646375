package stream

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/meterline/meterline/internal/clock"
	"github.com/meterline/meterline/internal/session"
)

// Config configures a Runtime. Zero fields take the defaults documented on
// them (EnsureDefaults); Validate reports every problem at once.
type Config struct {
	// Stage names the stage in logs and metrics: "dedup", "aggregate".
	Stage string
	// Config is the stage instance's consumer group and transactional
	// producer (session.Config): Kafka (the connection; Kafka.Brokers is
	// required), Group (required), InstanceID (required; the transactional
	// ID is "<Group>-<InstanceID>"), the session, rebalance and transaction
	// timeouts, RestartBackoff and ClientOptions, with their defaults.
	// Every client of the runtime (the transactional session, restore
	// readers) connects with its Kafka.
	session.Config
	// InputTopic is consumed (read_committed). Required.
	InputTopic string
	// CopartitionedTopics are more input topics, co-partitioned with
	// InputTopic: each has as many partitions as InputTopic and is keyed
	// alike, and partition p of every one of them belongs to the instance
	// that owns partition p of InputTopic (CopartitionBalancer, the
	// group balancer of every runtime). Their records reach the same
	// Partition, in the same transactions; a Process call carries the
	// records of one topic (kgo.Record.Topic says which), in offset order,
	// and within one poll the co-partitioned topics' records come before
	// InputTopic's. Each topic's next input offset is kept in the state and
	// checked against the group's committed offset on every restore
	// (docs/design.md, Exactly-once, 6). Default: none.
	CopartitionedTopics []string
	// OutputTopics are the topics the processor emits to: their series of
	// meterline_stream_records_out_total, like those of the input topics'
	// records in, are exported at 0 from the start (a series born at its
	// first increment hides it from rate()). Optional: a topic not listed
	// gets its series at its first record.
	OutputTopics []string
	// ChangelogTopic holds every state change; it must have exactly as many
	// partitions as InputTopic. Required.
	ChangelogTopic string
	// ChangelogMustKeep is how long ChangelogTopic must keep a record when
	// its cleanup.policy deletes records (docs/operations.md, Topics): the
	// runtime re-reads the topic's cleanup.policy and retention.ms every
	// ChangelogCheckInterval and before each restore (changelogkeeps.go),
	// exports meterline_stream_changelog_unsafe and logs each change, and
	// refuses to restore from a changelog that deletes records sooner, as
	// the stage refuses to start (topics.CheckChangelogKeeps).
	// KeepForever: every record for ever (cleanup.policy compact). Zero:
	// not checked (the default).
	ChangelogMustKeep time.Duration
	// ChangelogCheckInterval is how often ChangelogMustKeep is checked
	// while the stage runs. Default: DefaultChangelogCheckInterval.
	ChangelogCheckInterval time.Duration
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
	// MaxDecompressBatchBytes bounds what one fetched batch of the input
	// may decompress to (kgo.MaxDecompressBatchBytes), with what its
	// records take decoded (decompress.go): a batch past it is
	// bad input, handed to the partition's BatchRejecter and skipped
	// (docs/design.md, Bad input). The batches decompressed between two
	// polls share a budget of as much (decompress.go), and a fetch takes
	// at most a 25th of it, what uncompressed batches take decoded
	// (fetchMaxBytes). Default:
	// DefaultMaxDecompressBatchBytes.
	MaxDecompressBatchBytes int
	// VerifyInputGaps has the runtime check every run of offsets of
	// InputTopic that the Kafka client skipped (gaps.go): a batch whose
	// records' offset deltas are not their own makes the client drop the
	// records after it, and is rejected (BatchRejecter) and skipped so
	// that they are read. For an input that untrusted producers write;
	// each gap costs a fetch of its batches (a transactional producer
	// leaves one per transaction).
	VerifyInputGaps bool

	// StandbyReplicas is how many instances besides its owner keep each
	// partition's state warm by tailing its changelog (docs/operations.md,
	// Standby replicas; standby.go); the group's leader assigns them.
	// Default: 0 (DefaultStandbyReplicas).
	StandbyReplicas int
	// StandbyMaxWarmups bounds the copies one assignment has instances
	// make at once, group-wide, beyond the standbys in place (deferred
	// partitions and warm-up copies; StandbyOptions.MaxWarmups); the
	// group's leader applies its own. Default: DefaultMaxWarmups.
	StandbyMaxWarmups int
	// StateCleanupDelay is how long the state of a partition this
	// instance neither owns nor keeps as a standby stays in its store
	// before the runtime deletes it (docs/operations.md, State of
	// partitions held elsewhere; cleanup.go); a copy a restore would
	// replay in full anyway (beyond the restore horizon) goes at once.
	// Negative: never. Default: DefaultStateCleanupDelay.
	StateCleanupDelay time.Duration

	// Clock drives the commit and punctuate timers and dates checkpoints
	// for the restore horizon (docs/design.md, Exactly-once, 4), never
	// billing decisions. Default: the system clock.
	Clock clock.Clock
	// Logger is the structured logger. Default: no logging.
	Logger *zap.Logger
	// Registerer receives the runtime's metrics. Default: a private
	// registry (metrics are not exported).
	Registerer prometheus.Registerer
}

// The defaults of Config (EnsureDefaults), which the CLI's stage flags show
// too.
const (
	DefaultCommitInterval  = 100 * time.Millisecond
	DefaultMaxBatchRecords = 10_000
	DefaultStandbyReplicas = 0
	// DefaultStateCleanupDelay is Kafka Streams' state.cleanup.delay.ms
	// default.
	DefaultStateCleanupDelay = 10 * time.Minute
	// DefaultMaxDecompressBatchBytes is far above any batch a producer
	// writes (records of at most 16 KiB, batches of about 1 MiB
	// compressed) and at the largest zstd window the reference decoder
	// accepts by default (2^27 bytes, compression level 22): the zstd
	// decoder refuses a frame whose window is over the bound with an error
	// of its own, which would stop the stage instead.
	DefaultMaxDecompressBatchBytes = 128 << 20
)

// KeepForever is Config.ChangelogMustKeep of a changelog that must keep
// every record for ever.
const KeepForever time.Duration = -1

// DefaultChangelogCheckInterval is Config.ChangelogCheckInterval's
// default: one DescribeConfigs per instance every 5 minutes.
const DefaultChangelogCheckInterval = 5 * time.Minute

// EnsureDefaults fills zero fields with their defaults.
func (c *Config) EnsureDefaults() {
	c.Config.EnsureDefaults()
	if c.FS == nil {
		c.FS = vfs.Default
	}
	if c.CommitInterval == 0 {
		c.CommitInterval = DefaultCommitInterval
	}
	if c.StandbyMaxWarmups == 0 {
		c.StandbyMaxWarmups = DefaultMaxWarmups
	}
	if c.MaxBatchRecords == 0 {
		c.MaxBatchRecords = DefaultMaxBatchRecords
	}
	if c.StateCleanupDelay == 0 {
		c.StateCleanupDelay = DefaultStateCleanupDelay
	}
	if c.MaxDecompressBatchBytes == 0 {
		c.MaxDecompressBatchBytes = DefaultMaxDecompressBatchBytes
	}
	if c.ChangelogCheckInterval == 0 {
		c.ChangelogCheckInterval = DefaultChangelogCheckInterval
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
	if err := c.Config.Validate(); err != nil {
		errs = append(errs, err)
	}
	req("input-topic", c.InputTopic)
	seen := map[string]bool{c.InputTopic: true, c.ChangelogTopic: true}
	for i, t := range c.CopartitionedTopics {
		if t == "" || seen[t] {
			errs = append(errs, fmt.Errorf("stream: copartitioned-topics[%d]: %q is empty or names the input, the changelog or another co-partitioned topic", i, t))
		}
		seen[t] = true
	}
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
	pos("changelog-check-interval", c.ChangelogCheckInterval)
	if c.ChangelogMustKeep < 0 && c.ChangelogMustKeep != KeepForever {
		errs = append(errs, fmt.Errorf("stream: changelog-must-keep must be positive, KeepForever or zero (got %s)", c.ChangelogMustKeep))
	}
	if c.PunctuateInterval < 0 {
		errs = append(errs, fmt.Errorf("stream: punctuate-interval must not be negative (got %s)", c.PunctuateInterval))
	}
	if c.StandbyReplicas < 0 {
		errs = append(errs, fmt.Errorf("stream: standby-replicas must not be negative (got %d)", c.StandbyReplicas))
	}
	if c.StandbyMaxWarmups < 0 {
		errs = append(errs, fmt.Errorf("stream: standby-max-warmups must not be negative (got %d)", c.StandbyMaxWarmups))
	}
	if c.MaxBatchRecords <= 0 {
		errs = append(errs, fmt.Errorf("stream: max-batch-records must be positive (got %d)", c.MaxBatchRecords))
	}
	if c.MaxDecompressBatchBytes <= 0 || c.MaxDecompressBatchBytes > math.MaxInt32 {
		errs = append(errs, fmt.Errorf("stream: max-decompress-batch-bytes must be positive and at most %d (got %d)", math.MaxInt32, c.MaxDecompressBatchBytes))
	}
	if c.TransactionTimeout < c.CommitInterval {
		errs = append(errs, fmt.Errorf("stream: transaction-timeout %s is shorter than commit-interval %s", c.TransactionTimeout, c.CommitInterval))
	}
	return errors.Join(errs...)
}
