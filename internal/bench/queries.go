package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/meterline/meterline/internal/topics"
	"github.com/meterline/meterline/sink"
)

// QueriesConfig configures Queries.
type QueriesConfig struct {
	// Events are the usage_events rows generated; Revisions about the
	// usage_aggregates rows (sink.SyntheticData).
	Events, Revisions int64
	// Customers is the customer index space (skewed: sink.SyntheticData).
	Customers int64
	// Months of event time, from January 2024.
	Months int
	// Partitions of the generated Kafka coordinates.
	Partitions int64
	// Runs are the timed runs of each query, after one warm-up run.
	Runs int
	// SinkRows are the rows of the sink comparison with and without the
	// analyst views; 0 skips it. SinkRounds rounds of it.
	SinkRows, SinkRounds int
	// Database holds the generated data. Default: a new one, dropped at
	// the end unless Keep.
	Database string
	// Keep keeps the database; with Reuse a later run on it skips the
	// generation when it holds Events events.
	Keep, Reuse bool
	// Settle bounds the wait for background merges to stop after the
	// generation.
	Settle time.Duration
	// JSON prints the result as JSON too.
	JSON bool
}

// Validate reports every problem with the config.
func (c *QueriesConfig) Validate() error {
	var errs []error
	for _, f := range []struct {
		name string
		v    int64
	}{{"events", c.Events}, {"revisions", c.Revisions}, {"customers", c.Customers}, {"partitions", c.Partitions}} {
		if f.v <= 0 {
			errs = append(errs, fmt.Errorf("bench: %s must be positive (got %d)", f.name, f.v))
		}
	}
	errs = append(errs, positive("months", c.Months), positive("runs", c.Runs), positiveDuration("settle", c.Settle))
	if c.Months == 1 {
		errs = append(errs, errors.New("bench: months must be at least 2 (the queries read a closed month and the next)"))
	}
	if c.SinkRows > 0 {
		errs = append(errs, positive("sink-rounds", c.SinkRounds))
	}
	return errors.Join(errs...)
}

// queryGoals are the goals of issue 13 (on the 2-core benchmark machine),
// per query and parameter set; a query without one has none.
var queryGoals = map[string]time.Duration{
	"usage_by_day/median":  50 * time.Millisecond,
	"usage_by_day/largest": time.Second,
	"invoice_lines":        2 * time.Second,
	"invoice_lines/next":   2 * time.Second,
	"top_customers":        2 * time.Second,
	"duplicate_rate":       time.Second,
}

// QueryTiming is one documented query, measured.
type QueryTiming struct {
	Query    string          `json:"query"`
	Params   string          `json:"params"`
	Median   time.Duration   `json:"median_ns"`
	Max      time.Duration   `json:"max_ns"`
	Runs     []time.Duration `json:"runs_ns"`
	RowsRead uint64          `json:"rows_read"`
	Rows     int             `json:"result_rows"`
	Goal     time.Duration   `json:"goal_ns,omitempty"`
}

// Queries generates the synthetic data set inside ClickHouse through the
// real migrations and views (INSERT … SELECT FROM numbers() into the
// ledger tables), waits for the background merges to stop, then times
// every query of docs/analysts.md (Runs warm runs after a warm-up, median
// and max), for the customer of median volume and the largest one where a
// query names a customer; measures the sink's resume lookup at the end of
// a partition of the generated usage_events; and compares the sink's
// throughput with and without the analyst views.
func Queries(ctx context.Context, env *Env, cfg QueriesConfig) (err error) {
	left, err := newLeftovers(env, cfg.Validate)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, left.remove()) }()
	stamp := time.Now().UnixNano()
	db := cfg.Database
	if db == "" {
		db = fmt.Sprintf("bench_queries_%d", stamp%1e9)
	}
	if !cfg.Keep {
		left.database(db)
	}
	conn, err := env.ClickHouseServer.Dial(ctx, db, true)
	if err != nil {
		return err
	}
	defer conn.Close()

	if err := generate(ctx, env, conn, db, cfg); err != nil {
		return err
	}
	settled, err := settleMerges(ctx, env, conn, db, cfg.Settle)
	if err != nil {
		return err
	}
	fmt.Fprintf(env.Out, "merges settled after: %s\n", settled.Round(time.Millisecond))
	if err := printSizes(ctx, env, conn, db); err != nil {
		return err
	}

	timings, err := timeQueries(ctx, env, conn, cfg.Runs)
	if err != nil {
		return err
	}
	printTimings(env, timings)

	part, lookup, err := resumeLookup(ctx, conn, db, cfg)
	if err != nil {
		return err
	}
	fmt.Fprintf(env.Out, "resume lookup near the end of partition %d of %d usage_events rows: %d queries, %d rows read, %s\n",
		part, cfg.Events, lookup.Queries, lookup.RowsRead, lookup.Took.Round(time.Microsecond))

	out := map[string]any{"database": db, "queries": timings, "resume_lookup": lookup, "settle_seconds": settled.Seconds()}
	if cfg.SinkRows > 0 {
		if err := sinkWithViews(ctx, env, cfg, left, stamp, out); err != nil {
			return err
		}
	}
	if cfg.Keep {
		fmt.Fprintf(env.Out, "database %s kept (--reuse runs the queries on it again)\n", db)
	}
	if cfg.JSON {
		return json.NewEncoder(env.Out).Encode(out)
	}
	return nil
}

// longStatement bounds one statement of the generation: generous, for the
// largest data sets.
func longStatement(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, 2*time.Hour)
}

// generate migrates db and fills it with cfg's synthetic data, unless
// (with cfg.Reuse) it holds them already.
func generate(ctx context.Context, env *Env, conn driver.Conn, db string, cfg QueriesConfig) error {
	data := sink.SyntheticData{Events: cfg.Events, Revisions: cfg.Revisions, Customers: cfg.Customers, Months: cfg.Months, Partitions: cfg.Partitions}
	have := uint64(0)
	if cfg.Reuse {
		var err error
		if have, err = eventsHeld(ctx, conn); err != nil {
			return err
		}
	}
	if have == uint64(cfg.Events) {
		env.say("database %s already holds %d events: not generating them again", db, have)
	} else {
		if have > 0 {
			return fmt.Errorf("bench: database %s holds %d events, want %d or none", db, have, cfg.Events)
		}
		if _, err := sink.Migrate(ctx, conn); err != nil {
			return err
		}
		start := time.Now()
		stmts := data.Statements(db)
		for i, s := range stmts {
			qctx, cancel := longStatement(ctx)
			t0 := time.Now()
			err := conn.Exec(qctx, s)
			cancel()
			if err != nil {
				return fmt.Errorf("bench: generate, statement %d of %d: %w", i+1, len(stmts), err)
			}
			env.say("generate %d/%d (%s) in %s", i+1, len(stmts), strings.Fields(s)[2], time.Since(t0).Round(time.Millisecond))
		}
		env.say("generated %d events and about %d aggregate revisions through the views in %s", cfg.Events, cfg.Revisions, time.Since(start).Round(time.Second))
		fmt.Fprintf(env.Out, "generation: %s\n", time.Since(start).Round(time.Millisecond))
	}
	return nil
}

// timeQueries times every query of docs/analysts.md, runs warm runs each,
// for the customer of median volume and the largest one where a query
// names a customer.
func timeQueries(ctx context.Context, env *Env, conn driver.Conn, runs int) ([]QueryTiming, error) {
	median, largest, err := customers(ctx, conn)
	if err != nil {
		return nil, err
	}
	month := sink.SyntheticStart
	fmt.Fprintf(env.Out, "month %s; customer of median volume %s, largest %s\n", month.Format("2006-01"), median, largest)
	var timings []QueryTiming
	for _, q := range sink.AnalystQueries {
		for _, set := range querySets(q, median, largest, month) {
			sql, err := q.For(set.p)
			if err != nil {
				return nil, err
			}
			qt, err := timeQuery(ctx, conn, sql, runs)
			if err != nil {
				return nil, fmt.Errorf("bench: query %s: %w", q.Name, err)
			}
			qt.Query, qt.Params = q.Name, set.params
			key := q.Name
			if set.name != "" {
				key += "/" + set.name
			}
			qt.Goal = queryGoals[key]
			env.say("query %s %s: median %s, max %s, %d rows read", q.Name, qt.Params, qt.Median, qt.Max, qt.RowsRead)
			timings = append(timings, qt)
		}
	}
	return timings, nil
}

// querySet is one set of values a query is timed with: name suffixes the
// query's goal key, params describes the set in the result.
type querySet struct {
	name, params string
	p            sink.QueryParams
}

// querySets are the value sets a query is timed with: the customers of
// median and largest volume for a query that names a customer; for the
// invoice lines, January and February (the period January's late usage
// is booked into; January has none); else one set.
func querySets(q sink.AnalystQuery, median, largest string, month time.Time) []querySet {
	switch {
	case strings.Contains(q.SQL, "'acme'"):
		return []querySet{
			{"median", "median customer " + median, sink.QueryParams{Customer: median, Meter: "api_calls", Month: month}},
			{"largest", "largest customer " + largest, sink.QueryParams{Customer: largest, Meter: "api_calls", Month: month}},
		}
	case q.Name == "invoice_lines":
		next := month.AddDate(0, 1, 0)
		return []querySet{
			{"", "period " + month.Format("2006-01"), sink.QueryParams{Customer: largest, Meter: "api_calls", Month: month}},
			{"next", "period " + next.Format("2006-01") + ", late usage booked", sink.QueryParams{Customer: largest, Meter: "api_calls", Month: next}},
		}
	}
	return []querySet{{"", "", sink.QueryParams{Customer: largest, Meter: "api_calls", Month: month}}}
}

// sinkWithViews compares the sink's throughput without and with the
// analyst views, over cfg.SinkRounds rounds of cfg.SinkRows rows in
// INSERTs of the sink's default batch, and adds the medians to out.
func sinkWithViews(ctx context.Context, env *Env, cfg QueriesConfig, left *leftovers, stamp int64, out map[string]any) error {
	b := &sinkBench{env: env, cfg: SinkConfig{Rows: cfg.SinkRows, Partitions: 16, Rounds: cfg.SinkRounds, BatchRows: sink.DefaultMaxBatchRecords, Customers: 10000},
		left: left, stamp: stamp}
	b.names = env.Topics
	b.names.Prefix = fmt.Sprintf("%sbench-queries-sink-%d.", env.Topics.Prefix, stamp)
	if err := b.prepare(ctx); err != nil {
		return err
	}
	rounds := Rounds{N: cfg.SinkRounds, Unit: "rows", Progress: env.say}
	res, err := rounds.Run(ctx, sinkRun{b: b, views: []string{}}, sinkRun{b: b})
	if err != nil {
		return err
	}
	without, with, ratio := res.Median(0), res.Median(1), res.RoundRatio(1, 0)
	fmt.Fprintf(env.Out, "sink, %d rows, %d rounds (medians):\n", cfg.SinkRows, cfg.SinkRounds)
	writeAligned(env.Out,
		"without the analyst views:", fmt.Sprintf("%.0f rows/s", without),
		"with the analyst views:", fmt.Sprintf("%.0f rows/s", with),
		"ratio of medians:", fmt.Sprintf("%.2f (goal ≥ 0.70)", with/without),
		"median of per-round ratios:", fmt.Sprintf("%.2f", ratio))
	out["sink_without_views"], out["sink_with_views"], out["sink_ratio"], out["sink_round_ratio"] = without, with, with/without, ratio
	return nil
}

// eventsHeld is count() of usage_events in conn's database, 0 when it has
// no such table. EXISTS reads the one table: ClickHouse 18.16 fails a read
// of system.tables that meets a table of the database being dropped (and
// may then abort).
func eventsHeld(ctx context.Context, conn driver.Conn) (uint64, error) {
	qctx, cancel := longStatement(ctx)
	defer cancel()
	var exists uint8
	if err := conn.QueryRow(qctx, "EXISTS TABLE usage_events").Scan(&exists); err != nil || exists == 0 {
		return 0, err
	}
	var n uint64
	err := conn.QueryRow(qctx, "SELECT count() FROM usage_events").Scan(&n)
	return n, err
}

// settleMerges waits until the database has had no merge running for 15
// seconds in a row (a quarter of d, if shorter), or d passed, and returns
// the time it waited.
func settleMerges(ctx context.Context, env *Env, conn driver.Conn, db string, d time.Duration) (time.Duration, error) {
	start := time.Now()
	window := min(15*time.Second, d/4)
	quiet := time.Time{}
	for {
		var n uint64
		qctx, cancel := context.WithTimeout(ctx, time.Minute)
		err := conn.QueryRow(qctx, "SELECT count() FROM system.merges WHERE database = '"+db+"'").Scan(&n)
		cancel()
		if err != nil {
			return 0, err
		}
		switch {
		case n > 0:
			quiet = time.Time{}
		case quiet.IsZero():
			quiet = time.Now()
		case time.Since(quiet) >= window:
			return time.Since(start), nil
		}
		if time.Since(start) > d {
			env.say("merges still running after %s; measuring anyway", d)
			return time.Since(start), nil
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// printSizes prints the rows and active parts of every table.
func printSizes(ctx context.Context, env *Env, conn driver.Conn, db string) error {
	qctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	rows, err := conn.Query(qctx, "SELECT table, sum(rows), count(), sum(bytes_on_disk) FROM system.parts WHERE database = '"+db+"' AND active GROUP BY table ORDER BY table")
	if err != nil {
		return err
	}
	defer rows.Close()
	tw := tabwriter.NewWriter(env.Out, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "table\trows\tactive parts\tMB on disk\t")
	for rows.Next() {
		var t string
		var n, parts, bytes uint64
		if err := rows.Scan(&t, &n, &parts, &bytes); err != nil {
			return err
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.1f\t\n", t, n, parts, float64(bytes)/1e6)
	}
	if err := rows.Err(); err != nil {
		return err
	}
	return tw.Flush()
}

// customers returns the customers of median and largest event volume in
// the first month.
func customers(ctx context.Context, conn driver.Conn) (median, largest string, err error) {
	qctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	rows, err := conn.Query(qctx, `SELECT customer_id, sum(events) AS e FROM usage_daily
WHERE day >= '2024-01-01' AND day < '2024-02-01' GROUP BY customer_id ORDER BY e, customer_id`)
	if err != nil {
		return "", "", err
	}
	defer rows.Close()
	var ids []string
	for rows.Next() {
		var id string
		var e uint64
		if err := rows.Scan(&id, &e); err != nil {
			return "", "", err
		}
		ids = append(ids, id)
	}
	if err := rows.Err(); err != nil {
		return "", "", err
	}
	if len(ids) == 0 {
		return "", "", errors.New("bench: no customer has events in January 2024")
	}
	return ids[len(ids)/2], ids[len(ids)-1], nil
}

// timeQuery runs q once to warm up, then runs times, each reading every
// row of the result.
func timeQuery(ctx context.Context, conn driver.Conn, q string, runs int) (QueryTiming, error) {
	var qt QueryTiming
	for i := 0; i <= runs; i++ {
		var read atomic.Uint64
		qctx, cancel := context.WithTimeout(clickhouse.Context(ctx, clickhouse.WithProgress(func(p *clickhouse.Progress) { read.Add(p.Rows) })), 10*time.Minute)
		start := time.Now()
		rows, err := conn.Query(qctx, q)
		if err != nil {
			cancel()
			return qt, err
		}
		n := 0
		for rows.Next() {
			n++
		}
		err = errors.Join(rows.Err(), rows.Close())
		took := time.Since(start)
		cancel()
		if err != nil {
			return qt, err
		}
		if i == 0 {
			continue // warm-up
		}
		qt.Runs = append(qt.Runs, took)
		qt.Rows, qt.RowsRead = n, read.Load()
	}
	s := slices.Clone(qt.Runs)
	slices.Sort(s)
	qt.Median, qt.Max = s[len(s)/2], s[len(s)-1]
	if len(s)%2 == 0 {
		qt.Median = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return qt, nil
}

func printTimings(env *Env, ts []QueryTiming) {
	tw := tabwriter.NewWriter(env.Out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "query\tparameters\tmedian\tmax\trows read\tresult rows\tgoal")
	for _, t := range ts {
		goal := ""
		if t.Goal > 0 {
			verdict := "met"
			if t.Median > t.Goal {
				verdict = "MISSED"
			}
			goal = fmt.Sprintf("≤ %s: %s", t.Goal, verdict)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%s\n", t.Query, t.Params, t.Median.Round(100*time.Microsecond), t.Max.Round(100*time.Microsecond), t.RowsRead, t.Rows, goal)
	}
	_ = tw.Flush()
}

// resumeLookup runs the sink's resume lookup on the generated table: a
// sink whose committed offset of partition 5 (modulo the partitions) is
// 5,000 below the last one re-consumes a 10,000-record batch.
func resumeLookup(ctx context.Context, conn driver.Conn, db string, cfg QueriesConfig) (int32, sink.ResumeLookup, error) {
	p := int32(5 % cfg.Partitions)
	var last int64
	qctx, cancel := context.WithTimeout(ctx, time.Minute)
	err := conn.QueryRow(qctx, fmt.Sprintf("SELECT max(kafka_offset) FROM usage_events WHERE kafka_partition = %d", p)).Scan(&last)
	cancel()
	if err != nil {
		return p, sink.ResumeLookup{}, err
	}
	// The generated rows carry the default topic names.
	r, err := sink.ResumeLookupAt(ctx, conn, db, topics.DefaultNames(), p, max(last-4999, 0), 10000)
	return p, r, err
}
