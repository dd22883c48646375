package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/meterline/meterline/dedup"
	"github.com/meterline/meterline/internal/kafka"
	"github.com/meterline/meterline/internal/lag"
	"github.com/meterline/meterline/internal/service"
	"github.com/meterline/meterline/internal/session"
	"github.com/meterline/meterline/internal/stream"
)

// StageFlags are the flags of every stateful stage.
type StageFlags struct {
	InstanceID              string        `help:"Instance ID, stable across restarts and unique in the group; the transactional ID is <group>-<instance-id>. Letters, digits, ., _ and - only (up to 249). Default: the host name."`
	StateDir                string        `help:"Directory of the local Pebble state (a cache of the changelog)." default:"meterline-state" type:"path"`
	CommitInterval          time.Duration `help:"Longest a transaction stays open while input keeps arriving." default:"${stream_commit_interval}"`
	SessionTimeout          time.Duration `help:"Consumer group session timeout." default:"${session_timeout}"`
	RebalanceTimeout        time.Duration `help:"Consumer group rebalance timeout." default:"${session_rebalance_timeout}"`
	TransactionTimeout      time.Duration `help:"Broker-side timeout that aborts a dead instance's open transaction." default:"${session_transaction_timeout}"`
	StandbyReplicas         int           `help:"Instances besides its owner that keep each partition's state warm by tailing its changelog, so that a failover restores only the changelog's tail (every instance of the group should use the same value)." default:"${stream_standby_replicas}"`
	StandbyMaxWarmups       int           `help:"Most standby copies one rebalance has instances make at once, group-wide, beyond the copies in place: partitions a joining instance copies before it takes them count first, then copies made to spread the standbys (the others wait for later rebalances; the instance that leads the group applies its own value)." default:"${stream_standby_max_warmups}"`
	StateCleanupDelay       time.Duration `help:"How long the local state of a partition this instance neither owns nor keeps as a standby (revoked, its standby copy moved to another instance, not assigned at start) stays in --state-dir before it is deleted; state a restore would replay in full anyway (beyond the restore horizon) is deleted at once. 0 keeps all state." default:"${stream_state_cleanup_delay}"`
	ChangelogCheckInterval  time.Duration `help:"How often the running stage reads its changelog's cleanup.policy and retention.ms again (restores read them too): a policy that deletes state records a restore must read sets meterline_stream_changelog_unsafe and logs an error, and the next restore is refused." default:"${stream_changelog_check_interval}"`
	MaxDecompressBatchBytes int           `help:"Most bytes one fetched batch of the stage's input may decompress to, with what its records take decoded: a batch past it (a decompression bomb any producer can write) is rejected as oversized in usage.rejected and skipped." default:"${stream_max_decompress_batch_bytes}"`
	MetricsAddr             string        `help:"Address of the HTTP server: the status page at / (and /status.json), /metrics, /healthz and /readyz. Loopback by default; :9464 serves every interface." default:"${metrics_addr}"`
	MetricsHostsFlags       `embed:""`
	AllowCreateTime         bool `help:"Start although a topic whose record timestamps are arrival times (usage.events for dedup; usage.entitlements and usage.deduped for the aggregator, when it decides entitlements) uses message.timestamp.type=CreateTime, which lets every producer choose its records' arrival; a warning is logged. For tests and replays that choose broker times only, never in production."`
	Validate                bool `help:"Check the configuration and exit."`
}

// streamConfig is the stream configuration of stage, with its own group and
// the most input records per transaction.
func (f *StageFlags) streamConfig(g *Globals, group, stage string, maxBatchRecords int, log *zap.Logger, reg prometheus.Registerer) (stream.Config, error) {
	id, err := resolveInstanceID(f.InstanceID)
	if err != nil {
		return stream.Config{}, err
	}
	kc, err := g.kafka()
	if err != nil {
		return stream.Config{}, err
	}
	return stream.Config{
		Config: session.Config{
			Kafka:              kc,
			Group:              group,
			InstanceID:         id,
			SessionTimeout:     f.SessionTimeout,
			RebalanceTimeout:   f.RebalanceTimeout,
			TransactionTimeout: f.TransactionTimeout,
		},
		StateDir:                filepath.Join(f.StateDir, stage+"-"+id),
		CommitInterval:          f.CommitInterval,
		MaxBatchRecords:         maxBatchRecords,
		MaxDecompressBatchBytes: f.MaxDecompressBatchBytes,
		StandbyReplicas:         f.StandbyReplicas,
		StandbyMaxWarmups:       f.StandbyMaxWarmups,
		StateCleanupDelay:       stateCleanupDelay(f.StateCleanupDelay),
		ChangelogCheckInterval:  f.ChangelogCheckInterval,
		Logger:                  log,
		Registerer:              reg,
	}, nil
}

// stateCleanupDelay is the stream's StateCleanupDelay of the flag's
// value: 0 (and a negative one) keeps all state, which the stream's
// config says with a negative delay (its zero takes the default).
func stateCleanupDelay(d time.Duration) time.Duration {
	if d <= 0 {
		return -1
	}
	return d
}

// resolveInstanceID returns id, or the host name when id is empty, when it
// is a safe instance ID (safeInstanceID).
func resolveInstanceID(id string) (string, error) {
	if id != "" {
		if !safeInstanceID(id) {
			return "", fmt.Errorf("--instance-id %q: %s", id, instanceIDRule)
		}
		return id, nil
	}
	h, err := os.Hostname()
	if err != nil {
		return "", fmt.Errorf("--instance-id not set and no host name: %w", err)
	}
	if !safeInstanceID(h) {
		return "", fmt.Errorf("--instance-id not set and the host name %q is no instance ID (%s): give --instance-id", h, instanceIDRule)
	}
	return h, nil
}

// instanceIDRule is the rule of safeInstanceID, for its errors.
const instanceIDRule = "an instance ID is 1 to 249 letters a-z and A-Z, digits, '.', '_' or '-', and not . or ..: " +
	"it goes into the transactional ID <group>-<instance-id> and the state directory <state-dir>/<stage>-<instance-id>"

// safeInstanceID reports whether id keeps to the rule Kafka applies to a
// group instance ID (as to a topic name): 1 to 249 characters of
// [a-zA-Z0-9._-], not "." or "..". Such an ID is one file name below
// --state-dir, never a path that nests or leaves it, and is as plain in
// the transactional ID <group>-<instance-id>, logs and ACLs.
func safeInstanceID(id string) bool {
	if id == "" || len(id) > 249 || id == "." || id == ".." {
		return false
	}
	for _, r := range id {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-') {
			return false
		}
	}
	return true
}

// MetricsHostsFlags name the hosts the HTTP server of --metrics-addr
// answers (service.Server.AllowHosts; docs/operations.md, HTTP servers).
type MetricsHostsFlags struct {
	MetricsAllowedHosts []string `help:"Host names the HTTP server of --metrics-addr answers besides IP addresses, localhost and .localhost names (the Host header of each request; against DNS rebinding). Without it, a server on a loopback address answers only those, one on another address every host; with it, whatever its address, only those and these (e.g. the name Prometheus scrapes it by)." placeholder:"HOST,..."`
}

// metricsServer is the address of a process's HTTP server and the hosts
// it answers (MetricsHostsFlags).
type metricsServer struct {
	addr         string
	allowedHosts []string
}

// lagGroup is a consumer group of the process's own stages, its stage
// (the lag metrics' stage label) and the topics it consumes, for its lag
// metrics.
type lagGroup struct {
	stage  string
	group  string
	inputs []string
}

// runStage serves metrics and health while run runs, and returns run's
// error. A fatal stage error ends the process with status 1. The consumer
// lag of groups (the process's own stages) is exported on reg, computed
// when /metrics is scraped and cached for a few seconds (lag.Collector);
// a stage that has not committed yet is behind from the start of its
// inputs.
// The status page at / shows the stages of status (stream.Runtime.Status)
// and any other stage found in reg.
func runStage(ctx context.Context, g *Globals, ms metricsServer, reg *prometheus.Registry, log *zap.Logger, groups []lagGroup, ready service.Check, run func(context.Context) error, status ...func() service.StageStatus) error {
	return runStageWith(ctx, g, ms, reg, log, groups, ready, run, nil, status...)
}

// runStageWith is runStage with setup, when not nil, called with the
// HTTP server before it serves (to add sections to the status page).
func runStageWith(ctx context.Context, g *Globals, ms metricsServer, reg *prometheus.Registry, log *zap.Logger, groups []lagGroup, ready service.Check, run func(context.Context) error, setup func(*service.Server), status ...func() service.StageStatus) error {
	names := make([]string, len(groups))
	opts := []lag.Option{lag.WithLogger(log)}
	for i, lg := range groups {
		names[i] = lg.group
		opts = append(opts, lag.WithInputTopics(lg.group, lg.inputs...), lag.WithStage(lg.group, lg.stage))
	}
	kc, err := g.kafka()
	if err != nil {
		return err
	}
	lc, err := lag.NewCollector(kc, names, opts...)
	if err != nil {
		return err
	}
	defer lc.Close()
	if err := reg.Register(lc); err != nil {
		return fmt.Errorf("consumer lag metrics: %w", err)
	}
	srv, err := service.Listen(ms.addr, reg, log, ready)
	if err != nil {
		return err
	}
	srv.AllowHosts(ms.allowedHosts...)
	srv.SetLagError(lc.LastError)
	for _, f := range status {
		srv.AddStatus(f)
	}
	if setup != nil {
		setup(srv)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	srvDone := make(chan error, 1)
	go func() { srvDone <- srv.Run(ctx) }()
	stopRefused := stopOnRefusedLogin(ctx, kc.Watch, cancel)
	err = run(ctx)
	cancel()
	if serr := <-srvDone; serr != nil && err == nil {
		err = serr
	}
	if rerr := stopRefused(); rerr != nil && (err == nil || errors.Is(err, context.Canceled)) {
		err = rerr
	}
	if err != nil && !errors.Is(err, context.Canceled) {
		log.Error("stage stopped", zap.Error(err))
		return err
	}
	log.Info("stage stopped")
	return nil
}

// stopOnRefusedLogin calls stop once watch (nil: none) learns of a login
// the brokers refused a client of the stage while it runs, on whichever
// connection: the password changed on the cluster, and the stage reads it
// at start only (docs/operations.md, Kafka: SASL and TLS). The stage's
// session stops on a refusal it meets itself, but a fetch connection
// refused while the group's connection stays up fails no poll: the stage
// would run on, reading nothing. The returned function, called once the
// stage has returned, gives the refusal that stopped it, or nil.
func stopOnRefusedLogin(ctx context.Context, watch *kafka.LoginWatch, stop func()) func() error {
	if watch == nil {
		return func() error { return nil }
	}
	var stopped atomic.Bool
	go func() {
		select {
		case <-watch.Refused():
			stopped.Store(true)
			stop()
		case <-ctx.Done():
		}
	}()
	return func() error {
		if !stopped.Load() {
			return nil
		}
		return fmt.Errorf("%w; the password is read at start only: restart the stage with the current one", watch.Err())
	}
}

// stoppedAtStart reports whether err, returned by a stage's start-up after
// awaitKafka or connectKafka (topic checks, ClickHouse's login check,
// migrations, building the stages), is only the stop the process was
// asked for: ctx has ended, and err and every error it joins come down
// to context.Canceled. A signal in those moments then
// ends the process as a stop at any other time does (status 0, "stage
// stopped"); an error of its own in the same moment still fails it.
func stoppedAtStart(ctx context.Context, err error) bool {
	return err != nil && ctx.Err() != nil && onlyCanceled(err)
}

// onlyCanceled reports whether err is context.Canceled, wrapped or joined
// with nothing else.
func onlyCanceled(err error) bool {
	switch u := err.(type) {
	case interface{ Unwrap() []error }:
		errs := u.Unwrap()
		for _, e := range errs {
			if !onlyCanceled(e) {
				return false
			}
		}
		return len(errs) > 0
	case interface{ Unwrap() error }:
		return err == context.Canceled || onlyCanceled(u.Unwrap())
	}
	return err == context.Canceled
}

// cleanStopAtStart is the deferred check of a stage command's Run, from
// awaitKafka on (the sink's from connectKafka on): an error that is only
// the stop (stoppedAtStart) becomes the clean exit that runStage gives a
// stop later on.
func cleanStopAtStart(ctx context.Context, log *zap.Logger, err *error) {
	if stoppedAtStart(ctx, *err) {
		log.Info("stage stopped")
		*err = nil
	}
}

// DedupCmd is `meterline dedup`.
type DedupCmd struct {
	StageFlags    `embed:""`
	DedupFlags    `embed:""`
	DedupKeyFlags `embed:""`
	Bucket        time.Duration `help:"Expiry granularity: keys are dropped by whole arrival buckets of this size." default:"${dedup_bucket}" hidden:""`
}

// DedupFlags are the dedup stage's own flags: `meterline dedup` takes them
// as they are, `meterline run` with the prefix dedup- (--dedup-window,
// --dedup-group, ...).
type DedupFlags struct {
	Group           string        `help:"Consumer group of the dedup stage." default:"${dedup_group}"`
	Window          time.Duration `help:"Dedup window W: accept only arrival − W < event_time; keep a key W + S after its first arrival. In meterline run the aggregator keeps the same W." default:"${dedup_window}"`
	Skew            time.Duration `help:"Allowed skew S: accept only event_time ≤ arrival + S." default:"${dedup_skew}"`
	TickInterval    time.Duration `help:"How often a tick record is appended to each owned usage.events partition." default:"${dedup_tick_interval}"`
	MaxBatchRecords int           `help:"Most input records in one transaction." default:"${stream_max_batch_records}"`
	Sources         []string      `help:"Sources that get their own label on dedup's per-source metrics; any other source is counted as other (itself refused)." placeholder:"NAME,..."`
}

// DedupKeyFlags name the key ring that signs dedup's headers. The flags are
// --dedup-keys-file and --dedup-forget-ids in `meterline dedup` and
// `meterline run` alike, so they are not among the prefixed DedupFlags.
// --dedup-keys-file is a plain string, not kong's path type, as the
// password files' flags are: the path type makes any value absolute, and
// a ring set there by mistake would then look like a path and be shown by
// the error that it names no file (secret.ReadFile).
type DedupKeyFlags struct {
	KeysFile   string   `name:"dedup-keys-file" help:"File of the keys that sign dedup's re-route and tick headers, one \"<id> <secret hex>\" per line; the first signs, all verify. Every dedup instance needs the same file. Without it the keys are read from METERLINE_DEDUP_KEYS (never pass a secret as a flag). Make one with: meterline dedup-key --out FILE. A key that signed records the events topic may still hold cannot leave the ring: dedup refuses to start without it (docs/operations.md, Dedup keys)." placeholder:"FILE" secretfile:""`
	ForgetKeys []string `name:"dedup-forget-ids" help:"Key IDs removed from the ring on purpose although records they signed may remain in the events topic (a leaked secret): dedup runs without them, and those records lose their re-routed arrival time." placeholder:"ID,..."`
}

// config builds the dedup stage's configuration from its own flags, the
// stage flags sf, the key ring flags and the expiry bucket.
func (f *DedupFlags) config(g *Globals, sf *StageFlags, kf *DedupKeyFlags, bucket time.Duration, log *zap.Logger, reg prometheus.Registerer) (dedup.Config, error) {
	sc, err := sf.streamConfig(g, f.Group, "dedup", f.MaxBatchRecords, log, reg)
	if err != nil {
		return dedup.Config{}, err
	}
	keys, err := dedup.LoadKeys(kf.KeysFile)
	if err != nil {
		return dedup.Config{}, err
	}
	cfg := dedup.Config{Stream: sc, Topics: g.Topic, Window: f.Window, Skew: f.Skew, TickInterval: f.TickInterval, Bucket: bucket,
		Keys: keys, ForgetKeys: kf.ForgetKeys, Sources: f.Sources, AllowCreateTime: sf.AllowCreateTime}
	cfg.EnsureDefaults()
	return cfg, cfg.Validate()
}

func (c *DedupCmd) config(g *Globals, log *zap.Logger, reg prometheus.Registerer) (dedup.Config, error) {
	return c.DedupFlags.config(g, &c.StageFlags, &c.DedupKeyFlags, c.Bucket, log, reg)
}

// Run runs the dedup stage.
func (c *DedupCmd) Run(ctx context.Context, g *Globals, stdio IO, log *zap.Logger) (err error) {
	reg := service.NewRegistry()
	cfg, err := c.config(g, log, reg)
	if err != nil {
		return &ExitError{Code: 2, Err: err}
	}
	if c.Validate {
		fmt.Fprintln(stdio.Stdout, "configuration ok")
		return nil
	}
	if ok, err := g.awaitKafka(ctx, log); !ok {
		return err
	}
	defer cleanStopAtStart(ctx, log, &err)
	st, err := dedup.New(ctx, cfg)
	if err != nil {
		return err
	}
	return runStage(ctx, g, metricsServer{c.MetricsAddr, c.MetricsAllowedHosts}, reg, log, []lagGroup{{"dedup", cfg.Stream.Group, []string{g.Topic.EventsTopic()}}},
		st.Ready, st.Run, st.Status)
}

// DedupKeyCmd is `meterline dedup-key`.
type DedupKeyCmd struct {
	ID  string `help:"ID of the new key (1 to 32 bytes of [A-Za-z0-9._-]); a date in it tells keys apart when rotating." default:"k1"`
	Out string `help:"Write a new key ring to FILE (mode 0600), unless FILE already holds a valid one, which is kept. Without it the key line is printed: put it first in a ring to rotate." type:"path" placeholder:"FILE"`
}

// Run makes a key for dedup's header signatures.
func (c *DedupKeyCmd) Run(stdio IO) error {
	k, err := dedup.GenerateKey(c.ID)
	if err != nil {
		return &ExitError{Code: 2, Err: err}
	}
	if c.Out == "" {
		_, err := stdio.Stdout.Write(dedup.FormatKeys(k))
		return err
	}
	// The file alone, not dedup.LoadKeys: METERLINE_DEDUP_KEYS may be set
	// where the ring is made.
	if _, err := os.Stat(c.Out); err == nil {
		b, err := os.ReadFile(c.Out)
		if err != nil {
			return fmt.Errorf("read key file: %w", err)
		}
		if _, err := dedup.ParseKeys(b); err != nil {
			return fmt.Errorf("key file %s: %w", c.Out, err)
		}
		fmt.Fprintf(stdio.Stdout, "%s already holds a key ring; kept\n", c.Out)
		return nil
	}
	f, err := os.OpenFile(c.Out, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(dedup.FormatKeys(k)); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	fmt.Fprintf(stdio.Stdout, "wrote key %s to %s\n", k.ID, c.Out)
	return nil
}
