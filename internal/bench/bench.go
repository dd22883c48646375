// Package bench holds the harnesses of `meterline bench`. Each measures a
// meterline path against a baseline that does the least work the same
// result needs, on the same input, in rounds that alternate their order
// (Rounds), and prints the medians and their ratios:
//
//   - Produce: `meterline produce` against raw franz-go sending the same
//     pre-encoded records.
//   - Dedup and Aggregate: the stage on pre-filled input against two
//     transactional passthroughs, (a) without and (b) with one changelog
//     record per event.
//   - Sink: the sink against a bare clickhouse-go batch loop writing the
//     same rows.
//
// A benchmark leaves nothing behind: the topics, consumer groups, state
// directories and ClickHouse databases it makes are deleted when it
// returns, after an error or a cancelled context too (only the
// transactional IDs remain, until the broker expires them). The
// `--keep` flags of Dedup and Aggregate keep their topics.
package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/meterline/meterline/internal/kafka"
	"github.com/meterline/meterline/internal/session"
	"github.com/meterline/meterline/internal/stream"
	"github.com/meterline/meterline/internal/topics"
	"github.com/meterline/meterline/producer"
	"github.com/meterline/meterline/sink"
)

// Env is where a benchmark runs and reports.
type Env struct {
	// Kafka is the connection to the cluster (seed brokers, SASL, TLS)
	// of every client the benchmark makes, the measured stages' included.
	// Kafka.Brokers is required.
	Kafka kafka.Config
	// ClientOptions are added to every Kafka client the benchmark makes,
	// the measured stages' included (hooks). Default: none.
	ClientOptions []kgo.Opt
	// ClickHouseServer is how to reach ClickHouse: address, user,
	// password, TLS (Sink only).
	ClickHouseServer sink.Server
	// ClickHouse is shorthand for ClickHouseServer.Addr; EnsureDefaults
	// copies it.
	ClickHouse string

	// conn is Kafka's client options (seed brokers, SASL, TLS), then
	// ClientOptions; set by newLeftovers.
	conn []kgo.Opt
	// Topics are the topic names; each benchmark makes its own topics,
	// named with Topics.Prefix, a prefix of its own and the rest of Topics.
	Topics topics.Names
	// Logger receives the logs of the stages measured (at warn level and
	// above for Dedup and Aggregate). Default: none.
	Logger *zap.Logger
	// Progress receives a line per step, Out the result table. Default:
	// io.Discard.
	Progress, Out io.Writer
}

// EnsureDefaults fills nil fields with their defaults; every benchmark
// calls it.
func (e *Env) EnsureDefaults() {
	if e.ClickHouseServer.Addr == "" {
		e.ClickHouseServer.Addr = e.ClickHouse
	}
	e.ClickHouse = e.ClickHouseServer.Addr
	if e.Logger == nil {
		e.Logger = zap.NewNop()
	}
	if e.Progress == nil {
		e.Progress = io.Discard
	}
	if e.Out == nil {
		e.Out = io.Discard
	}
}

// say writes a progress line.
func (e *Env) say(format string, args ...any) {
	fmt.Fprintf(e.Progress, "bench: "+format+"\n", args...)
}

// client returns a Kafka client on the Env's connection, with opts.
func (e *Env) client(opts ...kgo.Opt) (*kgo.Client, error) {
	return kgo.NewClient(slices.Concat(e.conn, opts)...)
}

// producerOptions are the producer.Options of the Env, then opts.
func (e *Env) producerOptions(opts ...producer.Option) []producer.Option {
	return append([]producer.Option{producer.WithBrokers(e.Kafka.Brokers...), producer.WithClientOptions(e.conn...)}, opts...)
}

// streamConfig is the stream config of one measured stage: its state in
// dir, a registry of its own, and the Env's logger at warn level.
func (e *Env) streamConfig(dir, group, instance string, commitInterval time.Duration) stream.Config {
	return stream.Config{Config: session.Config{Kafka: e.Kafka, Group: group, InstanceID: instance, ClientOptions: e.ClientOptions},
		StateDir: filepath.Join(dir, group+"-"+instance), CommitInterval: commitInterval,
		Logger: e.Logger.WithOptions(zap.IncreaseLevel(zap.WarnLevel)), Registerer: prometheus.NewRegistry()}
}

// leftovers are what a benchmark made: topics, consumer groups,
// directories and ClickHouse databases. remove deletes them all with a
// context of its own, so that a benchmark stopped by an error or by
// Ctrl-C deletes them too; drop deletes some of them at once.
type leftovers struct {
	env    *Env
	adm    *kadm.Client
	closer func()
	// keepTopics leaves the topics (--keep).
	keepTopics bool
	made       things
}

// things are names of what a benchmark made.
type things struct {
	topics, groups, dirs, databases []string
}

// cleanupTimeout bounds each deletion.
const cleanupTimeout = time.Minute

// newLeftovers checks a benchmark's config with validate and returns its
// leftovers, empty.
func newLeftovers(env *Env, validate func() error) (*leftovers, error) {
	if err := validate(); err != nil {
		return nil, err
	}
	env.EnsureDefaults()
	conn, err := env.Kafka.Opts()
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	env.conn = append(conn, env.ClientOptions...)
	cl, err := env.client()
	if err != nil {
		return nil, fmt.Errorf("bench: kafka client: %w", err)
	}
	return &leftovers{env: env, adm: kadm.NewClient(cl), closer: cl.Close}, nil
}

// createTopics creates specs (topics.Create, which waits until the
// brokers' metadata shows them) and remembers them.
func (l *leftovers) createTopics(ctx context.Context, specs ...topics.Spec) error {
	for _, s := range specs {
		l.made.topics = append(l.made.topics, s.Name)
	}
	_, err := topics.Create(ctx, l.adm, specs, -1)
	return err
}

// createTopic creates one topic, without waiting for the brokers'
// metadata to show it, and remembers it.
func (l *leftovers) createTopic(ctx context.Context, name string, partitions int32, configs map[string]*string) error {
	l.made.topics = append(l.made.topics, name)
	resp, err := l.adm.CreateTopic(ctx, partitions, -1, configs, name)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		return fmt.Errorf("bench: create topic %s: %w", name, err)
	}
	return nil
}

// group, dir and database remember a consumer group, a directory and a
// ClickHouse database made by the benchmark.
func (l *leftovers) group(name string)    { l.made.groups = append(l.made.groups, name) }
func (l *leftovers) dir(path string)      { l.made.dirs = append(l.made.dirs, path) }
func (l *leftovers) database(name string) { l.made.databases = append(l.made.databases, name) }

// drop deletes these things now, and forgets those it deleted; remove
// tries the others again.
func (l *leftovers) drop(these things) {
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	forget := func(have, gone []string, err error) []string {
		if err != nil {
			return have
		}
		return slices.DeleteFunc(have, func(h string) bool { return slices.Contains(gone, h) })
	}
	l.made.groups = forget(l.made.groups, these.groups, l.deleteGroups(ctx, these.groups))
	l.made.topics = forget(l.made.topics, these.topics, l.deleteTopics(ctx, these.topics))
	l.made.dirs = forget(l.made.dirs, these.dirs, removeDirs(these.dirs))
	l.made.databases = forget(l.made.databases, these.databases, l.dropDatabases(ctx, these.databases))
}

// remove deletes everything remembered, groups before topics, and
// returns what it could not delete. Call it once every stage the
// benchmark started has stopped (a group with members is not deleted).
func (l *leftovers) remove() error {
	defer l.closer()
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	m := l.made
	l.made = things{}
	err := errors.Join(l.deleteGroups(ctx, m.groups), l.deleteTopics(ctx, m.topics), removeDirs(m.dirs),
		l.dropDatabases(ctx, m.databases))
	if err != nil {
		return fmt.Errorf("bench: left behind: %w", err)
	}
	return nil
}

func (l *leftovers) deleteTopics(ctx context.Context, names []string) error {
	if l.keepTopics {
		return nil
	}
	return topics.Delete(ctx, l.adm, names...)
}

// deleteGroups deletes groups, waiting (within ctx) for any that still
// has members: a stage that stopped has left its group, but the broker
// may not have processed the leave yet.
func (l *leftovers) deleteGroups(ctx context.Context, groups []string) error {
	for len(groups) > 0 {
		resps, err := l.adm.DeleteGroups(ctx, groups...)
		if err != nil {
			return fmt.Errorf("delete groups %v: %w", groups, err)
		}
		var busy []string
		var errs []error
		for _, r := range resps.Sorted() {
			switch {
			case r.Err == nil || errors.Is(r.Err, kerr.GroupIDNotFound):
			case errors.Is(r.Err, kerr.NonEmptyGroup):
				busy = append(busy, r.Group)
			default:
				errs = append(errs, fmt.Errorf("delete group %s: %w", r.Group, r.Err))
			}
		}
		if len(errs) > 0 {
			return errors.Join(errs...)
		}
		groups = busy
		if len(groups) > 0 {
			select {
			case <-ctx.Done():
				return fmt.Errorf("delete groups %v: still have members: %w", groups, ctx.Err())
			case <-time.After(200 * time.Millisecond):
			}
		}
	}
	return nil
}

func removeDirs(dirs []string) error {
	var errs []error
	for _, d := range dirs {
		if err := os.RemoveAll(d); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (l *leftovers) dropDatabases(ctx context.Context, dbs []string) error {
	if len(dbs) == 0 {
		return nil
	}
	conn, err := l.env.ClickHouseServer.Dial(ctx, "default", false)
	if err != nil {
		return fmt.Errorf("drop databases %v: %w", dbs, err)
	}
	defer conn.Close()
	var errs []error
	for _, db := range dbs {
		if err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+db); err != nil {
			errs = append(errs, fmt.Errorf("drop database %s: %w", db, err))
		}
	}
	return errors.Join(errs...)
}

func positive(field string, v int) error {
	if v <= 0 {
		return fmt.Errorf("bench: %s must be positive (got %d)", field, v)
	}
	return nil
}

func positiveDuration(field string, d time.Duration) error {
	if d <= 0 {
		return fmt.Errorf("bench: %s must be positive (got %s)", field, d)
	}
	return nil
}

func required(field string, set bool) error {
	if !set {
		return fmt.Errorf("bench: %s is required", field)
	}
	return nil
}
