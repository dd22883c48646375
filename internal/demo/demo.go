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

	// onCaughtUp, in tests, runs once the stages caught up with the
	// generator, before they stop.
	onCaughtUp func(caughtUpState)
	// curl is the command printed for the HTTP ingest.
	curl string
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
	srv, err := ingest.New(ingest.Config{Addr: cfg.IngestAddr, Kafka: kafka.Config{Brokers: brokers}, Topic: names.EventsTopic(), KeysTopic: names.KeysTopic(),
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
	for _, sub := range []string{"kafka", "state"} {
		if err := os.RemoveAll(filepath.Join(cfg.Dir, sub)); err != nil {
			return false, err
		}
	}
	if err := os.MkdirAll(filepath.Join(cfg.Dir, "kafka"), 0o755); err != nil {
		return false, err
	}
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.DataDir(filepath.Join(cfg.Dir, "kafka")))
	if err != nil {
		return false, fmt.Errorf("demo: embedded broker: %w", err)
	}
	defer cluster.Close()
	brokers := cluster.ListenAddrs()
	names := topics.DefaultNames()
	layout := topics.DefaultLayout()
	layout.Partitions = partitions
	if err := createTopics(ctx, brokers, names, layout); err != nil {
		return false, err
	}

	streamCfg := func(group, id string) stream.Config {
		return stream.Config{
			Config: session.Config{Kafka: kafka.Config{Brokers: brokers}, Group: group, InstanceID: id,
				SessionTimeout: 6 * time.Second, RestartBackoff: 200 * time.Millisecond},
			StateDir: filepath.Join(cfg.Dir, "state", group), CommitInterval: 100 * time.Millisecond,
			Logger: cfg.Logger, Registerer: cfg.Registry}
	}
	// The embedded broker lives as long as the demo: an ephemeral key signs
	// dedup's headers, and the generator's services get their own labels.
	key, err := dedup.GenerateKey("demo")
	if err != nil {
		return false, err
	}
	dcfg := dedup.Config{Stream: streamCfg(dedupGroup, "demo"), Topics: names, TickInterval: time.Second,
		Keys: []dedup.Key{key}, Sources: append(append([]string{}, services...), buggySource)}
	cat, _ := aggregator.ParseMeters([]byte("meters:\n  - {name: api_calls, aggregation: SUM, unit: requests}\n  - {name: tokens, aggregation: SUM, unit: tokens}\n  - {name: storage_mb, aggregation: SUM, unit: MB}\n" +
		"  - {name: " + httpMeter + ", aggregation: SUM, unit: tokens, event_type: prompt, value_property: $.tokens}\n"))
	acfg := aggregator.Config{Stream: streamCfg(aggGroup, "demo"), Topics: names, Meters: cat, Period: aggregator.Hour, Grace: 30 * time.Second}

	runCtx, stopAll := context.WithCancel(context.Background())
	defer stopAll()
	as, err := aggregator.New(ctx, acfg)
	if err != nil {
		return false, err
	}
	var wg sync.WaitGroup
	errc := make(chan error, 5)
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := as.Run(runCtx); err != nil {
			errc <- fmt.Errorf("aggregate: %w", err)
		}
	}()
	rec := &recovery{replayed: func() float64 {
		return metricSum(cfg.Registry, "meterline_stream_restore_records_total", map[string]string{"stage": "dedup"})
	}}
	// The sink stops after the other stages, once it has written all their
	// output, so it has its own context.
	sinkCtx, stopSink := context.WithCancel(context.Background())
	defer stopSink()
	var sinkWG sync.WaitGroup
	if chConn != nil {
		w, err := sink.New(sink.Config{
			Config: session.Config{Kafka: kafka.Config{Brokers: brokers}, Group: sinkGroup, InstanceID: "demo",
				SessionTimeout: 6 * time.Second},
			Topics: names, ClickHouseServer: cfg.ClickHouseServer, Database: cfg.Database, MaxBatchWait: 500 * time.Millisecond,
			CommitInterval: 500 * time.Millisecond, Logger: cfg.Logger, Registerer: cfg.Registry})
		if err != nil {
			return false, err
		}
		sinkWG.Add(1)
		go func() {
			defer sinkWG.Done()
			if err := w.Run(sinkCtx); err != nil {
				errc <- fmt.Errorf("sink: %w", err)
			}
		}()
	}
	dedupStage := make(chan *dedup.Stage, 1)
	var currentDedup atomic.Pointer[dedup.Stage] // for the status page
	wg.Add(1)
	go func() {
		defer wg.Done()
		// Run dedup; when the demo kills it in-process, start it again on
		// the same state directory: it restores and carries on.
		for runCtx.Err() == nil {
			ds, err := dedup.New(runCtx, dcfg)
			if err != nil {
				errc <- fmt.Errorf("dedup: %w", err)
				return
			}
			currentDedup.Store(ds)
			select {
			case dedupStage <- ds:
			default:
				<-dedupStage
				dedupStage <- ds
			}
			err = ds.Run(runCtx)
			if errors.Is(err, stream.ErrCrashed) {
				rec.crashed(err)
				continue
			}
			if err != nil {
				errc <- fmt.Errorf("dedup: %w", err)
			}
			return
		}
	}()

	if cfg.IngestAddr != "" {
		// Like the status page, the ingest is a convenience: the demo runs
		// without it when its address is taken.
		srv, curl, err := startIngest(ctx, runCtx, cfg, brokers, names, cat, errc, &wg)
		switch {
		case ctx.Err() != nil:
			return false, ctx.Err()
		case err != nil:
			fmt.Fprintf(cfg.Out, "HTTP ingest not served: %v (choose another address with --ingest)\n", err)
			cfg.Logger.Warn("demo HTTP ingest not served", zap.Error(err))
		default:
			cfg.IngestAddr, cfg.curl = srv.Addr(), curl // the bound address, for the live view
			fmt.Fprintf(cfg.Out, "HTTP ingest on %s with a demo key for meter %s; post a CloudEvent:\n  %s\n\n", srv.URL(), httpMeter, curl)
		}
	}

	p, err := producer.New(producer.WithBrokers(brokers...), producer.WithTopic(names.EventsTopic()))
	if err != nil {
		return false, err
	}
	defer p.Close()
	tr := newTruth()
	rng := rand.New(rand.NewSource(cfg.Seed))
	gen := &generator{p: p, topic: names.EventsTopic(), rate: cfg.Rate, rng: rng, truth: tr}
	genCtx, stopGen := context.WithCancel(ctx)
	defer stopGen()
	if cfg.Duration > 0 {
		var cancel context.CancelFunc
		genCtx, cancel = context.WithTimeout(genCtx, cfg.Duration)
		defer cancel()
	}
	genDone := make(chan error, 1)
	go func() { genDone <- gen.run(genCtx) }()

	view := &aggView{latest: map[string]*schemas.Aggregate{}}
	go follow(runCtx, brokers, names.AggregatesTopic(), view.add)
	page := serveStatus(cfg, brokers, names, tr, view, as, &currentDedup)
	defer page.close()
	cfg.HTTPAddr = page.addr // the bound address, for the live view

	// Kill dedup once, at a random moment in the middle of the run.
	crashAfter := 20 * time.Second
	if cfg.Duration > 0 {
		crashAfter = time.Duration(float64(cfg.Duration) * (0.3 + 0.3*rng.Float64()))
	}
	points := []string{fault.BeforeCommit, fault.AfterCommit, fault.DuringApply, fault.AfterApply}
	crashTimer := time.AfterFunc(crashAfter, func() {
		ds := <-dedupStage
		dedupStage <- ds
		pt := points[rng.Intn(len(points))]
		rec.armed(pt)
		ds.CrashAt(pt)
	})
	defer crashTimer.Stop()

	start := time.Now()
	refresh := 5 * time.Second
	if cfg.Live {
		refresh = time.Second
	}
	tick := time.NewTicker(refresh)
	defer tick.Stop()
	running := true
	for running {
		select {
		case err := <-genDone:
			if err != nil {
				return false, err
			}
			running = false
		case err := <-errc:
			return false, err
		case <-tick.C:
			render(cfg, start, tr, cfg.Registry, view, rec, brokers)
		}
	}
	render(cfg, start, tr, cfg.Registry, view, rec, brokers)
	fmt.Fprintf(cfg.Out, "\ngenerator stopped; waiting for the stages to catch up ...\n")
	if err := waitCaughtUp(brokers, 2*time.Minute); err != nil {
		return false, err
	}
	page.caughtUp()
	stopAll()
	wg.Wait()
	var ch *chResult
	if chConn != nil {
		fmt.Fprintf(cfg.Out, "waiting for the sink to write everything to ClickHouse ...\n")
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		want, err := expectedRows(ctx, brokers, names)
		cancel()
		if err != nil {
			return false, err
		}
		ch = waitSink(chConn, cfg.ClickHouse, cfg.Database, want, 2*time.Minute)
		stopSink()
		sinkWG.Wait()
	}
	select {
	case err := <-errc:
		return false, err
	default:
	}
	return report(cfg.Out, brokers, names, tr, rec, ch)
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
		fmt.Fprintf(w, "[%s] events in %d · deduped %.0f · duplicates %.0f · rejected %.0f%s · %s\n",
			el.Round(time.Second), sent, metricSum(reg, "meterline_dedup_accepted_total", nil),
			metricSum(reg, "meterline_dedup_duplicates_total", nil), metricSum(reg, "meterline_rejected_total", nil), ch, rec)
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

func waitCaughtUp(brokers []string, d time.Duration) error {
	deadline := time.Now().Add(d)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		rows, err := lag.Compute(ctx, kafka.Config{Brokers: brokers}, []string{dedupGroup, aggGroup}, time.Now())
		cancel()
		if err == nil {
			behind := int64(0)
			groups := map[string]bool{}
			for _, r := range rows {
				behind += r.Records
				groups[r.Group] = true
			}
			if behind == 0 && len(groups) == 2 {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("demo: the stages did not catch up within %s (last error: %v)", d, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
