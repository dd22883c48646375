package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/internal/session"
	"github.com/meterline/meterline/internal/topics"
	"github.com/meterline/meterline/sink"
)

// SinkConfig configures Sink.
type SinkConfig struct {
	// Rows are the usage.deduped records (rows) per run.
	Rows int
	// Partitions of the benchmark topic.
	Partitions int
	// Rounds; each runs the baseline and the sink once, in alternating
	// order.
	Rounds int
	// BatchRows are the rows per INSERT, the same for both (the sink's
	// MaxBatchRecords).
	BatchRows int
	// Customers is the number of distinct customers in the rows.
	Customers int
	// JSON prints the result as JSON too.
	JSON bool
	// CPUProfile, when set, receives a CPU profile of the last round's
	// sink run.
	CPUProfile string
	// AgainstNoViews compares the sink with the analyst views against the
	// same sink into a database without them (rounds alternating), instead
	// of against the bare clickhouse-go loop: the cost of the views.
	AgainstNoViews bool
	// Views, when not nil, are the only analyst views the sink's database
	// keeps (sink.DropViews), to measure one view, or a few, at a time.
	// The baseline's database keeps the same ones.
	Views []string
}

// Validate reports every problem with the config.
func (c *SinkConfig) Validate() error {
	return errors.Join(positive("rows", c.Rows), positive("partitions", c.Partitions), positive("rounds", c.Rounds),
		positive("batch-rows", c.BatchRows), positive("customers", c.Customers))
}

// viewsLabel names the analyst views a run's database keeps.
func viewsLabel(views []string) string {
	switch {
	case views == nil:
		return "the analyst views"
	case len(views) == 0:
		return "no analyst views"
	}
	return "views " + strings.Join(views, ", ")
}

// Sink measures rows/s into ClickHouse through the sink (Kafka → decode →
// INSERT → transactional offset commit) against a bare clickhouse-go
// batch loop writing the same rows. The records are produced once; every
// run writes them into a database of its own, the sink's under a group of
// its own.
func Sink(ctx context.Context, env *Env, cfg SinkConfig) (err error) {
	left, err := newLeftovers(env, cfg.Validate)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, left.remove()) }()
	b := &sinkBench{env: env, cfg: cfg, left: left, stamp: time.Now().UnixNano()}
	b.names = env.Topics
	b.names.Prefix = fmt.Sprintf("%sbench-sink-%d.", env.Topics.Prefix, b.stamp)
	if err := b.prepare(ctx); err != nil {
		return err
	}
	rounds := Rounds{N: cfg.Rounds, Unit: "rows", Progress: env.say}
	if cfg.AgainstNoViews {
		return sinkViewsCompare(ctx, env, rounds, b, cfg.Views, cfg.JSON)
	}
	res, err := rounds.Run(ctx, sinkBaseline{b}, sinkRun{b: b, views: cfg.Views})
	if err != nil {
		return err
	}
	mb, ms, mr := res.Median(0), res.Median(1), res.RoundRatio(1, 0)
	fmt.Fprintf(env.Out, "rows: %d per run, %d partitions, %d rows per INSERT, %d rounds (medians), database with %s\n",
		cfg.Rows, cfg.Partitions, cfg.BatchRows, cfg.Rounds, viewsLabel(cfg.Views))
	writeAligned(env.Out,
		"baseline bare clickhouse-go:", fmt.Sprintf("%.0f rows/s", mb),
		"meterline sink:", fmt.Sprintf("%.0f rows/s", ms),
		"ratio of medians:", fmt.Sprintf("%.2f", ms/mb),
		"median of per-round ratios:", fmt.Sprintf("%.2f", mr))
	if !cfg.JSON {
		return nil
	}
	return json.NewEncoder(env.Out).Encode(map[string]any{"baseline_median": mb, "sink_median": ms, "ratio": ms / mb,
		"round_ratio_median": mr, "baseline": res.JSON(0, "baseline"), "sink": res.JSON(1, "sink")})
}

// sinkViewsCompare runs the sink into a database without the analyst views
// and into one with views (all of them, or those named), in alternating
// rounds, and prints both medians and their ratio (goal of
// docs/benchmarks.md, The analyst views: with ≥ 0.7 × without).
func sinkViewsCompare(ctx context.Context, env *Env, rounds Rounds, b *sinkBench, views []string, asJSON bool) error {
	res, err := rounds.Run(ctx, sinkRun{b: b, views: []string{}}, sinkRun{b: b, views: views})
	if err != nil {
		return err
	}
	without, with, ratio := res.Median(0), res.Median(1), res.RoundRatio(1, 0)
	fmt.Fprintf(env.Out, "sink, %d rows per run, %d partitions, %d rows per INSERT, %d rounds (medians):\n",
		b.cfg.Rows, b.cfg.Partitions, b.cfg.BatchRows, rounds.N)
	writeAligned(env.Out,
		"without the analyst views:", fmt.Sprintf("%.0f rows/s", without),
		"with "+viewsLabel(views)+":", fmt.Sprintf("%.0f rows/s", with),
		"ratio of medians:", fmt.Sprintf("%.2f (goal ≥ 0.70)", with/without),
		"median of per-round ratios:", fmt.Sprintf("%.2f", ratio))
	if !asJSON {
		return nil
	}
	return json.NewEncoder(env.Out).Encode(map[string]any{"without_views_median": without, "with_views_median": with,
		"ratio": with / without, "round_ratio_median": ratio, "views": views,
		"without_views": res.JSON(0, "without views"), "with_views": res.JSON(1, "with views")})
}

type sinkBench struct {
	env   *Env
	cfg   SinkConfig
	left  *leftovers
	stamp int64        // names this benchmark's topics, groups and databases
	names topics.Names // the topics the sink reads
	recs  []*kgo.Record
}

// prepare creates the topics and produces the records into usage.deduped.
func (b *sinkBench) prepare(ctx context.Context) error {
	var all []string
	for _, s := range topics.Specs(b.names, topics.Layout{Partitions: int32(b.cfg.Partitions), ReplicationFactor: -1, EventsTimestamp: "CreateTime"}) {
		all = append(all, s.Name)
		if err := b.left.createTopic(ctx, s.Name, int32(b.cfg.Partitions), nil); err != nil {
			return err
		}
	}
	if err := topics.WaitVisible(ctx, b.left.adm, all...); err != nil {
		return err
	}
	b.env.say("producing %d usage.deduped records to %s", b.cfg.Rows, b.names.DedupedTopic())
	recs, err := sinkRecords(b.names.DedupedTopic(), b.cfg.Rows, b.cfg.Partitions, b.cfg.Customers, time.Now().Add(-time.Hour))
	if err != nil {
		return err
	}
	b.recs = recs
	prod, err := b.env.client(kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.ProducerLinger(5*time.Millisecond))
	if err != nil {
		return err
	}
	defer prod.Close()
	for i := 0; i < len(recs); i += 10000 {
		if err := prod.ProduceSync(ctx, recs[i:min(i+10000, len(recs))]...).FirstErr(); err != nil {
			return err
		}
	}
	return nil
}

// database creates and migrates the database of one run; with views not
// nil it then drops the analyst views not among them (all, for an empty
// views), so that the run writes the ledger tables and those views' only.
func (b *sinkBench) database(ctx context.Context, what string, round int, views []string) (string, error) {
	db := fmt.Sprintf("bench_sink_%s_%d_%d", what, b.stamp%1e9, round)
	b.left.database(db)
	conn, err := b.env.ClickHouseServer.Dial(ctx, db, true)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	if _, err := sink.Migrate(ctx, conn); err != nil {
		return "", err
	}
	if views != nil {
		if err := sink.DropViews(ctx, conn, views...); err != nil {
			return "", err
		}
	}
	return db, nil
}

// sinkBaseline writes the rows with a bare clickhouse-go batch loop,
// BatchRows rows per INSERT, each column appended as one typed slice (the
// driver's fastest path). The rows are decoded and their column slices
// built before the clock starts, so the baseline is the cost of the
// INSERTs alone; the sink adds consuming, decoding and committing to it.
type sinkBaseline struct{ b *sinkBench }

func (s sinkBaseline) Run(ctx context.Context, round int, _ bool) (Result, error) {
	b := s.b
	db, err := b.database(ctx, "base", round, b.cfg.Views)
	if err != nil {
		return Result{}, err
	}
	defer b.left.drop(things{databases: []string{db}})
	conn, err := b.env.ClickHouseServer.Dial(ctx, db, false)
	if err != nil {
		return Result{}, err
	}
	defer conn.Close()
	query, blocks, rows, err := sink.EventBlocks(db, b.names, b.recs, b.cfg.BatchRows)
	if err != nil {
		return Result{}, fmt.Errorf("baseline: %w", err)
	}
	start := time.Now()
	for _, cols := range blocks {
		ictx, cancel := context.WithTimeout(ctx, time.Minute)
		err := insertBlock(ictx, conn, query, cols)
		cancel()
		if err != nil {
			return Result{}, fmt.Errorf("baseline: %w", err)
		}
	}
	return Result{Name: "baseline (bare clickhouse-go)", Count: rows, Elapsed: time.Since(start)}, nil
}

// insertBlock sends one INSERT of a block of column slices.
func insertBlock(ctx context.Context, conn driver.Conn, query string, cols []any) error {
	batch, err := conn.PrepareBatch(ctx, query)
	if err != nil {
		return err
	}
	for j, c := range cols {
		if err := batch.Column(j).Append(c); err != nil {
			return err
		}
	}
	return batch.Send()
}

// sinkRun runs the sink on the records until every row is inserted and
// committed. The clock starts when the first record is polled (the group
// join before it is not throughput) and stops when the last offset is
// committed. Its database keeps the analyst views named in views (all of
// them when views is nil, none when it is empty).
type sinkRun struct {
	b     *sinkBench
	views []string
}

func (s sinkRun) Run(ctx context.Context, round int, last bool) (Result, error) {
	b := s.b
	what, name := "sink", "meterline sink"
	switch {
	case s.views != nil && len(s.views) == 0:
		what, name = "sinknoviews", "meterline sink, no analyst views"
	case s.views != nil:
		what, name = "sinkviews", "meterline sink, "+viewsLabel(s.views)
	}
	db, err := b.database(ctx, what, round, s.views)
	if err != nil {
		return Result{}, err
	}
	group := fmt.Sprintf("bench-%s-%d-%d", what, b.stamp, round)
	b.left.group(group)
	defer b.left.drop(things{databases: []string{db}, groups: []string{group}})
	reg := newWatchedRegistry("meterline_sink_records_in_total", "meterline_sink_records_committed_total", "meterline_sink_rows_total")
	w, err := sink.New(sink.Config{
		Config:           session.Config{Kafka: b.env.Kafka, Group: group, InstanceID: "bench", ClientOptions: b.env.ClientOptions},
		Topics:           b.names,
		ClickHouseServer: b.env.ClickHouseServer, Database: db, MaxBatchRecords: b.cfg.BatchRows,
		Logger: b.env.Logger.Named("bench-sink"), Registerer: reg,
	})
	if err != nil {
		return Result{}, err
	}
	if err := reg.check(); err != nil {
		return Result{}, err
	}
	profile := ""
	if last {
		profile = b.cfg.CPUProfile
	}
	stopProfile, err := startProfile(profile)
	if err != nil {
		return Result{}, err
	}
	defer stopProfile()
	r := startStage(ctx, w.Run)
	defer r.stop()
	elapsed, err := b.waitForRows(ctx, r, reg.watched())
	if err != nil {
		return Result{}, err
	}
	return Result{Name: name, Count: b.cfg.Rows, Elapsed: elapsed}, nil
}

// waitForRows polls the sink's counters until every row is inserted and
// its offset committed, and returns the time from the first record polled
// to then, from reg (the sink's watched counters alone: watchedRegistry),
// every 10 ms: it is gathered while the sink runs on the same two cores,
// so polling it harder would slow the run it measures (the end time is
// exact to the poll interval).
func (b *sinkBench) waitForRows(ctx context.Context, r *running, reg prometheus.Gatherer) (time.Duration, error) {
	var first time.Time
	deadline := time.Now().Add(30 * time.Minute)
	for time.Now().Before(deadline) {
		n := sinkCountsOf(reg)
		if first.IsZero() && n.in > 0 {
			first = time.Now()
		}
		if n.in >= float64(b.cfg.Rows) && n.inserted >= float64(b.cfg.Rows) && n.committed >= n.in {
			return time.Since(first), nil
		}
		if ended, err := r.exited(); ended {
			return 0, fmt.Errorf("sink stopped: %v", err)
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
	return 0, fmt.Errorf("sink did not write %d rows in time", b.cfg.Rows)
}

// sinkCounts are the sink's counters the benchmark waits on.
type sinkCounts struct {
	in        float64 // meterline_sink_records_in_total
	inserted  float64 // meterline_sink_rows_total{outcome="inserted"}
	committed float64 // meterline_sink_records_committed_total: offsets committed by a committed transaction, after the INSERT of their rows
}

func sinkCountsOf(reg prometheus.Gatherer) sinkCounts {
	mfs, _ := reg.Gather()
	var n sinkCounts
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			v := m.GetCounter().GetValue()
			switch mf.GetName() {
			case "meterline_sink_records_in_total":
				n.in += v
			case "meterline_sink_records_committed_total":
				n.committed += v
			case "meterline_sink_rows_total":
				for _, lp := range m.GetLabel() {
					if lp.GetName() == "outcome" && lp.GetValue() == "inserted" {
						n.inserted += v
					}
				}
			}
		}
	}
	return n
}
