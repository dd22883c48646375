package sink

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/user"
	"slices"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/twmb/franz-go/pkg/kadm"
	"go.uber.org/zap"
)

// SkipsTable is the audit table of offsets accepted on purpose (migration
// 009): one row per partition and acceptance, with the records skipped.
const SkipsTable = "sink_offset_skips"

// AcceptOffsetsConfig configures AcceptOffsets.
type AcceptOffsetsConfig struct {
	// Conn is a connection whose calls AcceptOffsets bounds with its own
	// deadlines. Required.
	Conn driver.Conn
	// Database holds the sink's tables. Required.
	Database string
	// Group is the sink's consumer group. Required.
	Group string
	// Principal names the principal Admin authenticates as
	// (kafka.Config.Principal), for an error when the brokers refuse it
	// Describe on the group. Default: "".
	Principal string
	// Admin reads the group's members and committed offsets and the
	// partitions' log start offsets. Required.
	Admin *kadm.Client
	// Topics are the topics the sink consumes. Required.
	Topics []string
	// Topic limits the acceptance to one of Topics. Default: all of them.
	Topic string
	// Partitions limits the acceptance to these partitions of Topic; each
	// must have a committed offset. Default: every partition.
	Partitions []int32
	// By names who accepted, in the audit rows. Default: user@host of the
	// process.
	By string
	// Logger logs each accepted partition. Default: none.
	Logger *zap.Logger
	// Now dates the audit and progress rows. Default: time.Now.
	Now func() time.Time
	// QueryTimeout bounds each query and INSERT. Default: 30s.
	QueryTimeout time.Duration
}

// AcceptedOffset is one partition whose committed offset AcceptOffsets
// recorded as the database's progress: records From..To-1 are in no table.
type AcceptedOffset struct {
	Topic     string
	Partition int32
	// From is the progress recorded before (by another group, when
	// RecordedBy is set), or, without any (HadProgress false), the
	// partition's log start offset.
	From, To    int64
	HadProgress bool
	RecordedBy  string
}

// AcceptOffsets records the group's committed offsets of the partitions
// that are ahead of the database (those the sink would stop on with
// ErrOffsetsAhead) as their progress, so that the sink starts and skips
// the records in between: a forward reset made on purpose. It writes one
// row per partition to SkipsTable first, then the progress rows, and logs
// each; a partition not ahead is left alone. It refuses, with an error
// wrapping ErrSinkRunning, while the group has members, checked before it
// reads the offsets and again before it writes. Before that, it refuses,
// with CheckMigrations' error, a database with a migration pending or
// changed.
func AcceptOffsets(ctx context.Context, cfg AcceptOffsetsConfig) ([]AcceptedOffset, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if cfg.QueryTimeout == 0 {
		cfg.QueryTimeout = 30 * time.Second
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if cfg.By == "" {
		cfg.By = whoami()
	}
	// Progress is the sink's of this build, which starts only on a
	// database with every migration applied.
	if err := checkMigrationsIn(ctx, cfg.Conn, cfg.Database+"."+MigrationsTable); err != nil {
		return nil, err
	}
	if err := noMembers(ctx, cfg.Admin, cfg.Principal, cfg.Group); err != nil {
		return nil, err
	}
	committed, err := cfg.committed(ctx)
	if err != nil {
		return nil, err
	}
	rec, err := readProgress(ctx, cfg.Conn, cfg.Database, cfg.Group, cfg.QueryTimeout)
	if err != nil {
		return nil, err
	}
	var missing []tp
	for k, c := range committed {
		if rec.needsStart(k, c) {
			missing = append(missing, k)
		}
	}
	starts, err := logStarts(ctx, cfg.Admin, missing, cfg.QueryTimeout)
	if err != nil {
		return nil, err
	}
	var out []AcceptedOffset
	progress := map[tp]int64{}
	for _, k := range sortedParts(committed) {
		v, b := rec.classify(k, committed[k], starts[k])
		if v != verdictBad {
			continue
		}
		a := AcceptedOffset{Topic: k.topic, Partition: k.p, From: b.progress, To: b.committed, HadProgress: b.progress >= 0, RecordedBy: b.by}
		if !a.HadProgress {
			a.From = b.logStart
		}
		out = append(out, a)
		progress[k] = b.committed
	}
	if len(out) == 0 {
		return nil, nil
	}
	// Again, just before writing: a sink started meanwhile would compare
	// its offsets with progress this writes.
	if err := noMembers(ctx, cfg.Admin, cfg.Principal, cfg.Group); err != nil {
		return nil, err
	}
	now := cfg.Now()
	// The audit rows first: a skip is never recorded as progress without
	// its audit row (a failure after them leaves the sink stopping as
	// before, and running the command again adds a second row).
	if err := cfg.insertSkips(ctx, out, now); err != nil {
		return nil, err
	}
	ictx, cancel := context.WithTimeout(ctx, cfg.QueryTimeout)
	defer cancel()
	if err := insertProgress(ictx, cfg.Conn, cfg.Database, cfg.Group, progress, committedParts(progress), now); err != nil {
		return nil, err
	}
	for _, a := range out {
		cfg.Logger.Warn("committed offset accepted on purpose: records in between are in no table",
			zap.String("group", cfg.Group), zap.String("database", cfg.Database),
			zap.String("topic", a.Topic), zap.Int32("partition", a.Partition),
			zap.Int64("from_offset", a.From), zap.Int64("to_offset", a.To), zap.Int64("records_skipped", a.To-a.From),
			zap.Bool("had_progress", a.HadProgress), zap.String("progress_recorded_by", a.RecordedBy), zap.String("by", cfg.By))
	}
	return out, nil
}

func (cfg *AcceptOffsetsConfig) validate() error {
	var errs []error
	if cfg.Conn == nil {
		errs = append(errs, errors.New("Conn: required"))
	}
	if cfg.Database == "" {
		errs = append(errs, errors.New("Database: required"))
	}
	if cfg.Group == "" {
		errs = append(errs, errors.New("Group: required"))
	}
	if cfg.Admin == nil {
		errs = append(errs, errors.New("Admin: required"))
	}
	if len(cfg.Topics) == 0 {
		errs = append(errs, errors.New("Topics: required"))
	}
	if cfg.Topic != "" && !slices.Contains(cfg.Topics, cfg.Topic) {
		errs = append(errs, fmt.Errorf("Topic: %s is none of the sink's topics (%s)", cfg.Topic, strings.Join(cfg.Topics, ", ")))
	}
	if len(cfg.Partitions) > 0 && cfg.Topic == "" {
		errs = append(errs, errors.New("Partitions: need Topic"))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("sink: accept offsets: %w", err)
	}
	return nil
}

// noMembers returns an error wrapping ErrSinkRunning while group has
// members.
func noMembers(ctx context.Context, adm *kadm.Client, principal, group string) error {
	members, err := GroupMembers(adm, principal, group)(ctx)
	if err != nil {
		return fmt.Errorf("sink: accept offsets: cannot tell whether a sink of group %s is running: %w", group, err)
	}
	if len(members) > 0 {
		return fmt.Errorf("sink: accept offsets: group %s has members (%s); stop every sink of the group first: %w",
			group, strings.Join(members, ", "), ErrSinkRunning)
	}
	return nil
}

// committed returns the group's committed offsets of the partitions the
// config names.
func (cfg *AcceptOffsetsConfig) committed(ctx context.Context) (map[tp]int64, error) {
	fctx, cancel := context.WithTimeout(ctx, cfg.QueryTimeout)
	defer cancel()
	resp, err := cfg.Admin.FetchOffsets(fctx, cfg.Group)
	if err == nil {
		err = resp.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("sink: accept offsets: committed offsets of group %s: %w", cfg.Group, err)
	}
	out := map[tp]int64{}
	resp.Each(func(o kadm.OffsetResponse) {
		if o.At >= 0 && (cfg.Topic == "" && slices.Contains(cfg.Topics, o.Topic) || o.Topic == cfg.Topic) {
			out[tp{o.Topic, o.Partition}] = o.At
		}
	})
	if len(cfg.Partitions) == 0 {
		return out, nil
	}
	named := map[tp]int64{}
	for _, p := range cfg.Partitions {
		k := tp{cfg.Topic, p}
		c, ok := out[k]
		if !ok {
			return nil, fmt.Errorf("sink: accept offsets: group %s has no committed offset for %s partition %d: nothing to accept", cfg.Group, k.topic, k.p)
		}
		named[k] = c
	}
	return named, nil
}

func (cfg *AcceptOffsetsConfig) insertSkips(ctx context.Context, acc []AcceptedOffset, now time.Time) error {
	ictx, cancel := context.WithTimeout(ctx, cfg.QueryTimeout)
	defer cancel()
	b, err := cfg.Conn.PrepareBatch(ictx, "INSERT INTO "+cfg.Database+"."+SkipsTable+
		" (consumer_group, kafka_topic, kafka_partition, from_offset, to_offset, had_progress, progress_group, accepted_at, accepted_by)")
	if err != nil {
		return fmt.Errorf("sink: accept offsets: record in %s: %w", SkipsTable, err)
	}
	for _, a := range acc {
		var had uint8
		if a.HadProgress {
			had = 1
		}
		if err := b.Append(cfg.Group, a.Topic, a.Partition, uint64(a.From), uint64(a.To), had, a.RecordedBy, now.UTC(), cfg.By); err != nil {
			_ = b.Abort()
			return fmt.Errorf("sink: accept offsets: record in %s: %w", SkipsTable, err)
		}
	}
	if err := b.Send(); err != nil {
		return fmt.Errorf("sink: accept offsets: record in %s: %w", SkipsTable, err)
	}
	return nil
}

// whoami is user@host of the process, as far as it can tell.
func whoami() string {
	name := "unknown"
	if u, err := user.Current(); err == nil {
		name = u.Username
	}
	host, err := os.Hostname()
	if err != nil {
		host = "unknown"
	}
	return name + "@" + host
}

// committedParts marks every partition of progress as read from a
// committed offset: accept-offsets records a committed offset.
func committedParts(progress map[tp]int64) map[tp]bool {
	out := make(map[tp]bool, len(progress))
	for k := range progress {
		out[k] = true
	}
	return out
}
