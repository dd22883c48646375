// Package demo runs Meterline on an embedded broker with a built-in usage
// generator, shows it live, kills and restarts the dedup stage once, and
// ends with a report that reconciles the committed output topics against
// the generator's own ground truth.
package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/meterline/meterline/aggregator"
	"github.com/meterline/meterline/dedup"
	"github.com/meterline/meterline/ingest"
	"github.com/meterline/meterline/internal/fault"
	"github.com/meterline/meterline/internal/kafka"
	"github.com/meterline/meterline/internal/lag"
	"github.com/meterline/meterline/internal/service"
	"github.com/meterline/meterline/internal/session"
	"github.com/meterline/meterline/internal/stream"
	"github.com/meterline/meterline/internal/topics"
	"github.com/meterline/meterline/producer"
	"github.com/meterline/meterline/schemas"
	"github.com/meterline/meterline/sink"
)

// Config configures a demo run.
type Config struct {
	// Dir holds the embedded broker's data and the Pebble state; it is
	// emptied at the start of a run. Default: ./meterline-demo.
	Dir string
	// Duration ends the run; 0 runs until ctx ends (Ctrl-C).
	Duration time.Duration
	// Rate is the generator's events per second. Default: 200.
	Rate int
	// Seed seeds the generator and the crash point; 0 uses the clock.
	Seed int64
	// Out receives the live view and the report.
	Out io.Writer
	// Live redraws the view in place (a terminal); otherwise a status line
	// is printed every few seconds.
	Live bool
	// Logger receives the stages' logs. Default: none.
	Logger *zap.Logger
	// Registry receives the stages' metrics.
	Registry *prometheus.Registry
	// ClickHouse, when set, is the native-protocol address of a ClickHouse
	// into which the demo also runs the sink; the report then checks its
	// tables too and prints a query to try. Default: no sink.
	ClickHouse string
	// ClickHouseServer is the same with a user, password and TLS; its
	// address, when set, stands for ClickHouse. Default: ClickHouse as
	// user "default", no password, no TLS.
	ClickHouseServer sink.Server
	// Database is the sink's ClickHouse database. The demo drops it and
	// creates it again, migrated, at the start of a run (the embedded
	// broker's offsets start again at 0); it refuses a database that has
	// tables but was not made by the demo. Default: meterline_demo.
	Database string
	// HTTPAddr is where the status page (/), /status.json and /metrics
	// are served while the demo runs (status.go). Default: none.
	HTTPAddr string
	// IngestAddr is where the HTTP ingest is served while the demo runs,
	// with a key made at the start for meter httpMeter only: the demo prints
	// it and a curl command that posts a CloudEvent. Those events are
	// counted downstream like any other, and reported on their own line,
	// outside the reconciliation against the generator. Default: none.
	IngestAddr string
	// Lock is Dir's lock from LockDir, taken by the caller; nil: Run
	// takes it, and refuses a Dir another demo holds.
	Lock *DirLock

	// onCaughtUp, in tests, runs once the stages caught up with the
	// generator, before they stop.
	onCaughtUp func(caughtUpState)
	// curl is the command printed for the HTTP ingest.
	curl string
	// dedupTick, in tests, replaces dedup's tick interval of a second.
	dedupTick time.Duration
}

// httpMeter is the meter of the demo's HTTP ingest key: the generator
// never writes it, so the report keeps its events apart.
const httpMeter = "http_tokens"

// startIngest makes a key for httpMeter and serves the HTTP ingest until
// runCtx ends. It returns the server and a curl command that posts one
// CloudEvent with the key.
func startIngest(ctx, runCtx context.Context, cfg Config, brokers []string, names topics.Names, cat *aggregator.Catalog,
	errc chan<- error, wg *sync.WaitGroup) (*ingest.Server, string, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		return nil, "", err
	}
	_, token, err := ingest.NewAdmin(cl, names.KeysTopic()).CreateKey(ctx, ingest.KeySpec{Tenant: "demo", Customers: []string{"*"},
		Meters: []string{httpMeter}, CreatedBy: "meterline demo"})
	cl.Close()
	if err != nil {
		return nil, "", fmt.Errorf("demo: ingest key: %w", err)
	}
	srv, err := ingest.New(ingest.Config{Addr: cfg.IngestAddr, Kafka: kafka.Config{Brokers: brokers}, Topic: names.EventsTopic(), KeysTopic: names.KeysTopic(), BalancesTopic: names.BalancesTopic(),
		Meters: cat, Logger: cfg.Logger, Registerer: cfg.Registry})
	if err != nil {
		return nil, "", err
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := srv.Run(runCtx); err != nil {
			errc <- fmt.Errorf("ingest: %w", err)
		}
	}()
	ready := time.NewTicker(50 * time.Millisecond)
	defer ready.Stop()
	deadline := time.After(30 * time.Second)
	for srv.Ready() != nil {
		select {
		case <-ctx.Done():
			return nil, "", ctx.Err()
		case <-deadline:
			return nil, "", fmt.Errorf("demo: the ingest did not load its keys within 30s: %w", srv.Ready())
		case <-ready.C:
		}
	}
	event := `{"specversion":"1.0","id":"my-event-1","source":"curl","type":"prompt","subject":"acme","data":{"tokens":42}}`
	curl := fmt.Sprintf("curl -sS %s/api/v1/events -H 'Authorization: Bearer %s' -H 'Content-Type: application/cloudevents+json' -d '%s'",
		srv.URL(), token, event)
	return srv, curl, nil
}

const (
	partitions = 4
	dedupGroup = dedup.DefaultGroup
	aggGroup   = aggregator.DefaultGroup
)

// Run runs the demo and reports whether the final reconciliation matched.
func Run(ctx context.Context, cfg Config) (bool, error) {
	cfg.ensureDefaults()
	if cfg.Lock == nil {
		lock, err := LockDir(cfg.Dir)
		if err != nil {
			return false, err
		}
		defer lock.Close()
	}
	var chConn driver.Conn
	if cfg.ClickHouse != "" {
		// Before anything starts: an unreachable ClickHouse is a clear
		// error, not a demo that waits for it.
		conn, err := prepareDatabase(ctx, cfg.ClickHouseServer, cfg.Database)
		if err != nil {
			return false, err
		}
		defer conn.Close()
		chConn = conn
	}
	cluster, err := startBroker(ctx, cfg.Dir)
	if err != nil {
		return false, err
	}
	defer cluster.Close()

	d := &demoRun{cfg: cfg, brokers: cluster.ListenAddrs(), names: topics.DefaultNames(), errc: make(chan error, 5),
		dedupStage: make(chan *dedup.Stage, 1)}
	d.ent = newEntSetup(cfg, d.names)
	if err := d.ent.write(ctx, d.brokers); err != nil {
		return false, err
	}
	reference, err := d.ent.model(ctx, d.brokers)
	if err != nil {
		return false, err
	}
	fmt.Fprintf(cfg.Out, "%s\n\n", d.ent.describe())
	d.runCtx, d.stopAll = context.WithCancel(context.Background())
	defer d.stopAll()
	// The sink stops after the other stages, once it has written all their
	// output, so it has its own context.
	d.sinkCtx, d.stopSink = context.WithCancel(context.Background())
	defer d.stopSink()
	if err := d.startStages(ctx, chConn != nil); err != nil {
		return false, err
	}
	if err := d.serveIngest(ctx); err != nil {
		return false, err
	}

	p, err := producer.New(producer.WithBrokers(d.brokers...), producer.WithTopic(d.names.EventsTopic()))
	if err != nil {
		return false, err
	}
	defer p.Close()
	d.truth = newTruth(reference)
	rng := rand.New(rand.NewSource(d.cfg.Seed))
	gen := &generator{p: p, topic: d.names.EventsTopic(), rate: d.cfg.Rate, rng: rng, truth: d.truth}
	genCtx, stopGen := context.WithCancel(ctx)
	defer stopGen()
	if d.cfg.Duration > 0 {
		var cancel context.CancelFunc
		genCtx, cancel = context.WithTimeout(genCtx, d.cfg.Duration)
		defer cancel()
	}
	// The crash draws its moment and point before the generator owns rng.
	crashTimer := d.armCrash(rng, d.crashDedup)
	defer crashTimer.Stop()
	genDone := make(chan error, 1)
	go func() { genDone <- gen.run(genCtx) }()

	d.view = &aggView{latest: map[string]*schemas.Aggregate{}}
	go follow(d.runCtx, d.brokers, d.names.AggregatesTopic(), d.view.add)
	page := serveStatus(d.cfg, d.brokers, d.names, d.truth, d.view, d.as, &d.currentDedup)
	defer page.close()
	d.cfg.HTTPAddr = page.addr // the bound address, for the live view

	if err := d.watch(genDone); err != nil {
		return false, err
	}
	fmt.Fprintf(d.cfg.Out, "\ngenerator stopped; waiting for the stages to catch up ...\n")
	if err := waitCaughtUp(d.brokers, d.names, d.cfg.Registry, 2*time.Minute); err != nil {
		return false, err
	}
	page.caughtUp()
	ch, err := d.stop(chConn)
	if err != nil {
		return false, err
	}
	return report(d.cfg.Out, d.brokers, d.names, d.truth, d.rec, ch, d.ent)
}

// ensureDefaults fills in the defaults of the fields left zero.
func (cfg *Config) ensureDefaults() {
	if cfg.Dir == "" {
		cfg.Dir = "meterline-demo"
	}
	if cfg.Rate <= 0 {
		cfg.Rate = 200
	}
	if cfg.Seed == 0 {
		cfg.Seed = time.Now().UnixNano()
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if cfg.Registry == nil {
		cfg.Registry = prometheus.NewRegistry()
	}
	if cfg.Out == nil {
		cfg.Out = io.Discard
	}
	if cfg.Database == "" {
		cfg.Database = "meterline_demo"
	}
	if cfg.ClickHouseServer.Addr == "" {
		cfg.ClickHouseServer.Addr = cfg.ClickHouse
	}
	cfg.ClickHouse = cfg.ClickHouseServer.Addr
}

// startBroker empties dir's broker data and state, starts the embedded
// broker on dir/kafka and creates the topics, with partitions partitions
// each.
func startBroker(ctx context.Context, dir string) (*kfake.Cluster, error) {
	for _, sub := range emptiedDirs {
		if err := os.RemoveAll(filepath.Join(dir, sub)); err != nil {
			return nil, err
		}
	}
	if err := os.MkdirAll(filepath.Join(dir, "kafka"), 0o755); err != nil {
		return nil, err
	}
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.DataDir(filepath.Join(dir, "kafka")))
	if err != nil {
		return nil, fmt.Errorf("demo: embedded broker: %w", err)
	}
	layout := topics.DefaultLayout()
	layout.Partitions = partitions
	if err := createTopics(ctx, cluster.ListenAddrs(), topics.DefaultNames(), layout); err != nil {
		cluster.Close()
		return nil, err
	}
	return cluster, nil
}

// demoRun is one run of the demo: the stages on the embedded broker, the
// generator's truth and what the live view shows.
type demoRun struct {
	cfg     Config
	brokers []string
	names   topics.Names
	cat     *aggregator.Catalog
	// errc receives the first errors of the stages (buffered: a stage
	// that fails does not wait for the demo to read it).
	errc chan error

	// runCtx runs dedup, the aggregator and the ingest, and wg waits for
	// them; sinkCtx and sinkWG the same for the sink, which stops last.
	runCtx   context.Context
	stopAll  context.CancelFunc
	wg       sync.WaitGroup
	sinkCtx  context.Context
	stopSink context.CancelFunc
	sinkWG   sync.WaitGroup

	as *aggregator.Stage
	// dedupStage holds the dedup stage running now, for the crash;
	// currentDedup the same for the status page.
	dedupStage   chan *dedup.Stage
	currentDedup atomic.Pointer[dedup.Stage]
	rec          *recovery

	truth *truth
	view  *aggView
	// ent is what the demo wrote to usage.entitlements.
	ent *entSetup
}

// streamConfig is the stream configuration of the demo's stage of group.
func (d *demoRun) streamConfig(group, id string) stream.Config {
	return stream.Config{
		Config: session.Config{Kafka: kafka.Config{Brokers: d.brokers}, Group: group, InstanceID: id,
			SessionTimeout: 6 * time.Second, RestartBackoff: 200 * time.Millisecond},
		StateDir: filepath.Join(d.cfg.Dir, "state", group), CommitInterval: 100 * time.Millisecond,
		Logger: d.cfg.Logger, Registerer: d.cfg.Registry}
}

// demoMeters are the meters of the generator and of the HTTP ingest key.
const demoMeters = "meters:\n  - {name: api_calls, aggregation: SUM, unit: requests}\n  - {name: tokens, aggregation: SUM, unit: tokens}\n  - {name: storage_mb, aggregation: SUM, unit: MB}\n" +
	"  - {name: " + httpMeter + ", aggregation: SUM, unit: tokens, event_type: prompt, value_property: $.tokens}\n"

// startStages starts the aggregator, the sink when withSink, and dedup.
func (d *demoRun) startStages(ctx context.Context, withSink bool) error {
	d.cat, _ = aggregator.ParseMeters([]byte(demoMeters))
	acfg := aggregator.Config{Stream: d.streamConfig(aggGroup, "demo"), Topics: d.names, Meters: d.cat, Period: aggregator.Hour, Grace: 30 * time.Second,
		Entitlements: true}
	as, err := aggregator.New(ctx, acfg)
	if err != nil {
		return err
	}
	d.as = as
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		if err := as.Run(d.runCtx); err != nil {
			d.errc <- fmt.Errorf("aggregate: %w", err)
		}
	}()
	d.rec = &recovery{replayed: func() float64 {
		return metricSum(d.cfg.Registry, "meterline_stream_restore_records_total", map[string]string{"stage": "dedup"})
	}}
	if withSink {
		if err := d.startSink(); err != nil {
			return err
		}
	}
	return d.startDedup()
}

// startSink runs the sink into cfg's ClickHouse until sinkCtx ends.
func (d *demoRun) startSink() error {
	w, err := sink.New(sink.Config{
		Config: session.Config{Kafka: kafka.Config{Brokers: d.brokers}, Group: sinkGroup, InstanceID: "demo",
			SessionTimeout: 6 * time.Second},
		Topics: d.names, ClickHouseServer: d.cfg.ClickHouseServer, Database: d.cfg.Database, MaxBatchWait: 500 * time.Millisecond,
		CommitInterval: 500 * time.Millisecond, Logger: d.cfg.Logger, Registerer: d.cfg.Registry})
	if err != nil {
		return err
	}
	d.sinkWG.Add(1)
	go func() {
		defer d.sinkWG.Done()
		if err := w.Run(d.sinkCtx); err != nil {
			d.errc <- service.StageError("sink", err)
		}
	}()
	return nil
}

// startDedup runs dedup until runCtx ends; when the demo kills it
// in-process, it starts it again on the same state directory: it restores
// and carries on.
func (d *demoRun) startDedup() error {
	// The embedded broker lives as long as the demo: an ephemeral key signs
	// dedup's headers, and the generator's services get their own labels.
	key, err := dedup.GenerateKey("demo")
	if err != nil {
		return err
	}
	tick := time.Second
	if d.cfg.dedupTick > 0 {
		tick = d.cfg.dedupTick
	}
	dcfg := dedup.Config{Stream: d.streamConfig(dedupGroup, "demo"), Topics: d.names, TickInterval: tick,
		Keys: []dedup.Key{key}, Sources: append(append([]string{}, services...), buggySource)}
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		for d.runCtx.Err() == nil {
			ds, err := dedup.New(d.runCtx, dcfg)
			if err != nil {
				d.errc <- fmt.Errorf("dedup: %w", err)
				return
			}
			d.currentDedup.Store(ds)
			select {
			case d.dedupStage <- ds:
			default:
				<-d.dedupStage
				d.dedupStage <- ds
			}
			err = ds.Run(d.runCtx)
			if errors.Is(err, stream.ErrCrashed) {
				d.rec.crashed(err)
				continue
			}
			if err != nil {
				d.errc <- fmt.Errorf("dedup: %w", err)
			}
			return
		}
	}()
	return nil
}

// serveIngest serves the HTTP ingest on cfg.IngestAddr, if set. Like the
// status page, the ingest is a convenience: the demo runs without it when
// its address is taken. Only ctx ending is an error.
func (d *demoRun) serveIngest(ctx context.Context) error {
	if d.cfg.IngestAddr == "" {
		return nil
	}
	srv, curl, err := startIngest(ctx, d.runCtx, d.cfg, d.brokers, d.names, d.cat, d.errc, &d.wg)
	switch {
	case ctx.Err() != nil:
		return ctx.Err()
	case err != nil:
		fmt.Fprintf(d.cfg.Out, "HTTP ingest not served: %v (choose another address with --ingest-addr)\n", err)
		d.cfg.Logger.Warn("demo HTTP ingest not served", zap.Error(err))
	default:
		d.cfg.IngestAddr, d.cfg.curl = srv.Addr(), curl // the bound address, for the live view
		fmt.Fprintf(d.cfg.Out, "HTTP ingest on %s with a demo key for meter %s; post a CloudEvent:\n  %s\n\n", srv.URL(), httpMeter, curl)
	}
	return nil
}

// armCrash kills dedup once (crash), at a random moment in the middle of
// the run, at a random one of the crash points. It draws both from rng
// before it returns, never in the timer's goroutine: a rand.Rand is not
// safe for concurrent use, and the generator takes rng over once it runs.
func (d *demoRun) armCrash(rng *rand.Rand, crash func(point string)) *time.Timer {
	crashAfter := 20 * time.Second
	if d.cfg.Duration > 0 {
		crashAfter = time.Duration(float64(d.cfg.Duration) * (0.3 + 0.3*rng.Float64()))
	}
	points := []string{fault.BeforeCommit, fault.AfterCommit, fault.DuringApply, fault.AfterApply}
	pt := points[rng.Intn(len(points))]
	return time.AfterFunc(crashAfter, func() {
		d.rec.armed(pt)
		crash(pt)
	})
}

// crashDedup kills the dedup stage running now in-process at point.
func (d *demoRun) crashDedup(point string) {
	ds := <-d.dedupStage
	d.dedupStage <- ds
	ds.CrashAt(point)
}

// watch shows the live view until the generator ends (genDone), and
// returns its error or the first error of a stage.
func (d *demoRun) watch(genDone <-chan error) error {
	start := time.Now()
	refresh := 5 * time.Second
	if d.cfg.Live {
		refresh = time.Second
	}
	tick := time.NewTicker(refresh)
	defer tick.Stop()
	for {
		select {
		case err := <-genDone:
			if err != nil {
				return err
			}
			render(d.cfg, start, d.truth, d.cfg.Registry, d.view, d.rec, d.brokers)
			return nil
		case err := <-d.errc:
			return err
		case <-tick.C:
			render(d.cfg, start, d.truth, d.cfg.Registry, d.view, d.rec, d.brokers)
		}
	}
}

// stop stops dedup, the aggregator and the ingest once they caught up,
// then, with chConn, waits for the sink to write all their output to
// ClickHouse and stops it. It returns what the sink wrote (nil without a
// sink) or the first error of a stage.
func (d *demoRun) stop(chConn driver.Conn) (*chResult, error) {
	d.stopAll()
	d.wg.Wait()
	var ch *chResult
	if chConn != nil {
		fmt.Fprintf(d.cfg.Out, "waiting for the sink to write everything to ClickHouse ...\n")
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		want, err := expectedRows(ctx, d.brokers, d.names)
		cancel()
		if err != nil {
			return nil, err
		}
		ch = waitSink(chConn, d.cfg.ClickHouseServer, d.cfg.Database, want, 2*time.Minute)
		d.stopSink()
		d.sinkWG.Wait()
	}
	select {
	case err := <-d.errc:
		return nil, err
	default:
	}
	return ch, nil
}

func createTopics(ctx context.Context, brokers []string, names topics.Names, layout topics.Layout) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		return err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	_, err = topics.Create(ctx, kadm.NewClient(cl), topics.Specs(names, layout), 1)
	return err
}

// recovery records the demo's kill and restart of dedup.
type recovery struct {
	mu       sync.Mutex
	point    string
	at       time.Time
	crashes  int
	replayed func() float64 // changelog records dedup replayed on restores
}

func (r *recovery) armed(point string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.point = point
}

func (r *recovery) crashed(error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.crashes++
	r.at = time.Now()
}

func (r *recovery) String() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case r.crashes > 0:
		return fmt.Sprintf("dedup killed in-process at %s (%s), restarted on the same state; restores replayed %.0f changelog records",
			r.point, r.at.Format("15:04:05"), r.replayed())
	case r.point != "":
		return "dedup armed to die at " + r.point
	}
	return "no crash yet (dedup will be killed once, at a random moment)"
}

// hadCrash reports whether dedup was killed and restarted in this run.
func (r *recovery) hadCrash() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.crashes > 0
}

// ended describes the recovery for the final report: a run stopped before
// dedup's crash point had no crash, rather than one still to come.
func (r *recovery) ended() string {
	r.mu.Lock()
	crashes, point := r.crashes, r.point
	r.mu.Unlock()
	switch {
	case crashes > 0:
		return r.String()
	case point != "":
		return "no crash in this run: it stopped while dedup was armed to die at " + point
	}
	return "no crash in this run: it stopped before dedup's crash point (about 20 s in, or midway through --duration)"
}

// aggView keeps the latest revision of each key of usage.aggregates, fed
// by follow.
type aggView struct {
	mu     sync.Mutex
	latest map[string]*schemas.Aggregate
}

// follow reads topic from the start, read_committed, until ctx ends, and
// hands each record to add. The views it feeds are for display: a client
// that cannot be made leaves them empty.
func follow(ctx context.Context, brokers []string, topic string, add func(*kgo.Record)) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	if err != nil {
		return
	}
	defer cl.Close()
	for ctx.Err() == nil {
		cl.PollFetches(ctx).EachRecord(add)
	}
}

// add keeps the record's aggregate if it is its key's latest revision.
func (v *aggView) add(r *kgo.Record) {
	var a schemas.Aggregate
	if schemas.DecodeInto(r.Value, &a) != nil {
		return
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if cur, ok := v.latest[string(r.Key)]; !ok || a.Revision > cur.Revision {
		v.latest[string(r.Key)] = &a
	}
}

// currentPeriod returns, per customer and meter, the latest value of this
// period's aggregates.
func (v *aggView) currentPeriod(now time.Time) map[string]map[string]int64 {
	start, _ := aggregator.Hour.Bounds(now.UnixMilli())
	out := map[string]map[string]int64{}
	v.mu.Lock()
	defer v.mu.Unlock()
	for _, a := range v.latest {
		if a.PeriodStart != start {
			continue
		}
		if out[a.CustomerID] == nil {
			out[a.CustomerID] = map[string]int64{}
		}
		out[a.CustomerID][a.Meter] += a.Value
	}
	return out
}

func metricSum(reg *prometheus.Registry, name string, match map[string]string) float64 {
	mfs, _ := reg.Gather()
	s := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for k, want := range match {
				if labelOf(m, k) != want {
					continue next
				}
			}
			if c := m.GetCounter(); c != nil {
				s += c.GetValue()
			} else if g := m.GetGauge(); g != nil {
				s += g.GetValue()
			}
		}
	}
	return s
}

func labelOf(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

func render(cfg Config, start time.Time, tr *truth, reg *prometheus.Registry, view *aggView, rec *recovery, brokers []string) {
	w := cfg.Out
	el := time.Since(start)
	sent := tr.sent.Load()
	if !cfg.Live {
		ch := ""
		if cfg.ClickHouse != "" {
			ch = fmt.Sprintf(" · clickhouse rows %.0f", metricSum(reg, "meterline_sink_rows_total", map[string]string{"outcome": "inserted"}))
		}
		// Bad input apart from the aggregator's refusals, as the report
		// counts them.
		refused := metricSum(reg, "meterline_rejected_total", map[string]string{"reason": schemas.ReasonOverLimit}) +
			metricSum(reg, "meterline_rejected_total", map[string]string{"reason": schemas.ReasonNoCredit})
		fmt.Fprintf(w, "[%s] events in %d · deduped %.0f · duplicates %.0f · rejected %.0f · refused by caps and credits %.0f%s · %s\n",
			el.Round(time.Second), sent, metricSum(reg, "meterline_dedup_accepted_total", nil),
			metricSum(reg, "meterline_dedup_duplicates_total", nil), metricSum(reg, "meterline_rejected_total", nil)-refused, refused, ch, rec)
		return
	}
	var b strings.Builder
	b.WriteString("\033[H\033[2J")
	fmt.Fprintf(&b, "Meterline demo — %s elapsed · embedded broker · state in %s · Ctrl-C ends the run\n\n", el.Round(time.Second), cfg.Dir)
	fmt.Fprintf(&b, "  events in          %8d   (%.0f/s)\n", sent, float64(sent)/el.Seconds())
	fmt.Fprintf(&b, "  deduped            %8.0f\n", metricSum(reg, "meterline_dedup_accepted_total", nil))
	fmt.Fprintf(&b, "  duplicates dropped %8.0f   (conflicting %.0f)\n", metricSum(reg, "meterline_dedup_duplicates_total", nil),
		metricSum(reg, "meterline_dedup_duplicates_total", map[string]string{"conflict": "true"}))
	var reasons []string
	for _, r := range schemas.Reasons {
		if n := metricSum(reg, "meterline_rejected_total", map[string]string{"reason": r}); n > 0 {
			reasons = append(reasons, fmt.Sprintf("%s %.0f", r, n))
		}
	}
	fmt.Fprintf(&b, "  rejected           %8.0f   %s\n", metricSum(reg, "meterline_rejected_total", nil), strings.Join(reasons, " · "))
	fmt.Fprintf(&b, "  late → adjustments %8.0f\n", metricSum(reg, "meterline_aggregate_late_events_total", nil))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	groups := []string{dedupGroup, aggGroup}
	if cfg.ClickHouse != "" {
		groups = append(groups, sinkGroup)
	}
	rows, err := lag.Compute(ctx, kafka.Config{Brokers: brokers}, groups, time.Now())
	cancel()
	if err == nil {
		per := map[string]int64{}
		for _, r := range rows {
			per[r.Group] += r.Records
		}
		fmt.Fprintf(&b, "  lag                dedup %d records · aggregate %d records", per[dedupGroup], per[aggGroup])
		if cfg.ClickHouse != "" {
			fmt.Fprintf(&b, " · sink %d records", per[sinkGroup])
		}
		b.WriteString("\n")
	}
	if cfg.ClickHouse != "" {
		fmt.Fprintf(&b, "  clickhouse         %8.0f rows inserted into %s\n",
			metricSum(reg, "meterline_sink_rows_total", map[string]string{"outcome": "inserted"}), cfg.Database)
	}
	fmt.Fprintf(&b, "  recovery           %s\n", rec)
	if cfg.HTTPAddr != "" {
		fmt.Fprintf(&b, "  status page        http://%s/\n", cfg.HTTPAddr)
	}
	if cfg.curl != "" {
		fmt.Fprintf(&b, "  HTTP ingest        %s\n", cfg.curl)
	}
	b.WriteString("\n")
	cur := view.currentPeriod(time.Now())
	fmt.Fprintf(&b, "  this hour, per customer (latest revision):\n")
	fmt.Fprintf(&b, "    %-10s %10s %12s %11s\n", "customer", "api_calls", "tokens", "storage_mb")
	cs := make([]string, 0, len(cur))
	for c := range cur {
		cs = append(cs, c)
	}
	sort.Strings(cs)
	for _, c := range cs {
		fmt.Fprintf(&b, "    %-10s %10d %12d %11d\n", c, cur[c]["api_calls"], cur[c]["tokens"], cur[c]["storage_mb"])
	}
	fmt.Fprint(w, b.String())
}
