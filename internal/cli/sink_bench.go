package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"runtime/pprof"
	"sort"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/meterline/meterline/internal/kafka"
	"github.com/meterline/meterline/internal/topics"
	"github.com/meterline/meterline/schemas"
	"github.com/meterline/meterline/sink"
)

// BenchSinkCmd is `meterline bench sink`: rows/s into ClickHouse through
// the sink (Kafka → decode → INSERT → transactional offset commit) against
// a bare clickhouse-go batch loop writing the same rows.
type BenchSinkCmd struct {
	Rows       int    `help:"usage.deduped records (rows) per run." default:"1000000"`
	Partitions int    `help:"Partitions of the benchmark topic." default:"16"`
	Rounds     int    `help:"Rounds; each runs the baseline and the sink once, in alternating order. Medians are reported." default:"3"`
	BatchRows  int    `help:"Rows per INSERT, the same for both (the sink's --max-batch-records)." default:"10000"`
	Customers  int    `help:"Distinct customers in the generated rows." default:"10000"`
	JSON       bool   `help:"Print the result as JSON too."`
	CPUProfile string `help:"Write a CPU profile of the last round's sink run to this file." hidden:"" type:"path"`
}

// Run runs the benchmark.
func (c *BenchSinkCmd) Run(ctx context.Context, g *Globals, stdio IO, log *zap.Logger) error {
	stamp := time.Now().UnixNano()
	names := g.Topic
	names.Prefix = fmt.Sprintf("%sbench-sink-%d.", g.Topic.Prefix, stamp)
	kc, err := g.connectKafka(ctx)
	if err != nil {
		return err
	}
	srv, err := g.clickHouse()
	if err != nil {
		return err
	}
	if err := checkClickHouse(ctx, srv); err != nil {
		return err
	}
	admCl, err := kafka.NewClient(kc)
	if err != nil {
		return err
	}
	defer admCl.Close()
	adm := kadm.NewClient(admCl)
	var all []string
	for _, s := range topics.Specs(names, topics.Layout{Partitions: int32(c.Partitions), ReplicationFactor: -1, EventsTimestamp: "CreateTime"}) {
		all = append(all, s.Name)
	}
	for _, name := range all {
		resp, err := adm.CreateTopic(ctx, int32(c.Partitions), -1, nil, name)
		if err == nil {
			err = resp.Err
		}
		if err != nil {
			return fmt.Errorf("create %s: %w", name, err)
		}
	}
	defer func() { _, _ = adm.DeleteTopics(context.Background(), all...) }()
	if err := topics.WaitVisible(ctx, adm, all...); err != nil {
		return err
	}

	// The records, produced once; every sink run reads them under a new group.
	fmt.Fprintf(stdio.Stderr, "bench: producing %d usage.deduped records to %s\n", c.Rows, names.DedupedTopic())
	recs := benchSinkRecords(names.DedupedTopic(), c.Rows, c.Partitions, c.Customers)
	prod, err := kafka.NewClient(kc, kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.ProducerLinger(5*time.Millisecond))
	if err != nil {
		return err
	}
	for i := 0; i < len(recs); i += 10000 {
		if err := prod.ProduceSync(ctx, recs[i:min(i+10000, len(recs))]...).FirstErr(); err != nil {
			prod.Close()
			return err
		}
	}
	prod.Close()

	var base, snk []sinkBenchRun
	for round := 0; round < c.Rounds; round++ {
		runBase := func() error {
			r, err := c.baseline(ctx, g, names, recs, round, stamp)
			if err != nil {
				return err
			}
			base = append(base, r)
			fmt.Fprintf(stdio.Stderr, "bench: round %d baseline (bare clickhouse-go): %.0f rows/s\n", round+1, r.Rate)
			return nil
		}
		runSink := func() error {
			r, err := c.sink(ctx, g, names, round, stamp, log, round == c.Rounds-1)
			if err != nil {
				return err
			}
			snk = append(snk, r)
			fmt.Fprintf(stdio.Stderr, "bench: round %d meterline sink:             %.0f rows/s\n", round+1, r.Rate)
			return nil
		}
		order := []func() error{runBase, runSink}
		if round%2 == 1 {
			order[0], order[1] = order[1], order[0]
		}
		for _, f := range order {
			if err := f(); err != nil {
				return err
			}
		}
	}
	mb, ms := medianRate(base), medianRate(snk)
	// Each round's two runs are back to back, so their ratio is less
	// exposed to load that comes and goes on a shared machine.
	ratios := make([]sinkBenchRun, len(base))
	for i := range base {
		ratios[i] = sinkBenchRun{Rate: snk[i].Rate / base[i].Rate}
	}
	mr := medianRate(ratios)
	fmt.Fprintf(stdio.Stdout, "rows: %d per run, %d partitions, %d rows per INSERT, %d rounds (medians)\n", c.Rows, c.Partitions, c.BatchRows, c.Rounds)
	fmt.Fprintf(stdio.Stdout, "baseline bare clickhouse-go: %.0f rows/s\n", mb)
	fmt.Fprintf(stdio.Stdout, "meterline sink:              %.0f rows/s\n", ms)
	fmt.Fprintf(stdio.Stdout, "ratio of medians:            %.2f\n", ms/mb)
	fmt.Fprintf(stdio.Stdout, "median of per-round ratios:  %.2f\n", mr)
	if c.JSON {
		return json.NewEncoder(stdio.Stdout).Encode(map[string]any{
			"baseline_median": mb, "sink_median": ms, "ratio": ms / mb, "round_ratio_median": mr, "baseline": base, "sink": snk})
	}
	return nil
}

func benchSinkRecords(topic string, n, partitions, customers int) []*kgo.Record {
	start := time.Now().Add(-time.Hour)
	recs := make([]*kgo.Record, n)
	for i := range recs {
		p := int32(i % partitions)
		ts := start.Add(time.Duration(i) * time.Microsecond)
		e := &schemas.DedupedEvent{
			EventID: schemas.EventID("bench", fmt.Sprint(i)), CustomerID: fmt.Sprintf("customer-%d", i%customers), Meter: "api_calls",
			Quantity: int64(i%100 + 1), EventTime: ts.UnixMilli(), Source: "bench",
			Properties: []schemas.Property{{Name: "model", Value: fmt.Sprint("m", i%4)}, {Name: "region", Value: "eu"}},
			IngestTime: ts.UnixMilli(), SourcePartition: p, SourceOffset: int64(i / partitions),
		}
		recs[i] = &kgo.Record{Topic: topic, Partition: p, Key: []byte(e.CustomerID + "/api_calls"), Value: schemas.MustEncode(e), Timestamp: ts}
	}
	return recs
}

func benchDB(ctx context.Context, g *Globals, what string, round int, stamp int64) (string, func(), error) {
	db := fmt.Sprintf("bench_sink_%s_%d_%d", what, stamp%1e9, round)
	srv, err := g.clickHouse()
	if err != nil {
		return "", nil, err
	}
	conn, err := srv.Dial(ctx, db, true)
	if err != nil {
		return "", nil, err
	}
	if _, err := sink.Migrate(ctx, conn); err != nil {
		conn.Close()
		return "", nil, err
	}
	conn.Close()
	drop := func() {
		if c, err := srv.Dial(context.Background(), "default", false); err == nil {
			dctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			_ = c.Exec(dctx, "DROP DATABASE IF EXISTS "+db)
			cancel()
			c.Close()
		}
	}
	return db, drop, nil
}

func (c *BenchSinkCmd) baseline(ctx context.Context, g *Globals, names topics.Names, recs []*kgo.Record, round int, stamp int64) (sinkBenchRun, error) {
	db, drop, err := benchDB(ctx, g, "base", round, stamp)
	if err != nil {
		return sinkBenchRun{}, err
	}
	defer drop()
	srv, err := g.clickHouse()
	if err != nil {
		return sinkBenchRun{}, err
	}
	conn, err := srv.Dial(ctx, db, false)
	if err != nil {
		return sinkBenchRun{}, err
	}
	defer conn.Close()
	d, n, err := sink.BaselineInsert(ctx, conn, db, names, recs, c.BatchRows)
	if err != nil {
		return sinkBenchRun{}, err
	}
	return sinkBenchRun{Name: "baseline", Events: n, Seconds: d.Seconds(), Rate: float64(n) / d.Seconds()}, nil
}

// sink runs the sink on the records until every row is inserted and
// committed. The clock starts when the first record is polled (the group
// join before it is not throughput) and stops when the last offset is
// committed.
func (c *BenchSinkCmd) sink(ctx context.Context, g *Globals, names topics.Names, round int, stamp int64, log *zap.Logger, profile bool) (sinkBenchRun, error) {
	db, drop, err := benchDB(ctx, g, "sink", round, stamp)
	if err != nil {
		return sinkBenchRun{}, err
	}
	defer drop()
	kc, err := g.kafka()
	if err != nil {
		return sinkBenchRun{}, err
	}
	srv, err := g.clickHouse()
	if err != nil {
		return sinkBenchRun{}, err
	}
	reg := prometheus.NewRegistry()
	w, err := sink.New(sink.Config{
		Kafka: kc, Group: fmt.Sprintf("bench-sink-%d-%d", stamp, round), InstanceID: "bench", Topics: names,
		ClickHouseServer: srv, Database: db, MaxBatchRecords: c.BatchRows, Logger: log.Named("bench-sink"), Registerer: reg,
	})
	if err != nil {
		return sinkBenchRun{}, err
	}
	if profile && c.CPUProfile != "" {
		f, err := os.Create(c.CPUProfile)
		if err != nil {
			return sinkBenchRun{}, err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return sinkBenchRun{}, err
		}
		defer pprof.StopCPUProfile()
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(rctx) }()
	defer func() { cancel(); <-done }()
	// One Gather per poll, every 10 ms: the registry is gathered while the
	// sink runs on the same two cores, so polling it harder would slow the
	// run it measures (the end time is exact to the poll interval).
	var first, last time.Time
	deadline := time.Now().Add(30 * time.Minute)
	for time.Now().Before(deadline) {
		n := sinkCountsOf(reg)
		if first.IsZero() && n.in > 0 {
			first = time.Now()
		}
		if n.in >= float64(c.Rows) && n.inserted >= float64(c.Rows) && n.committed >= n.in {
			last = time.Now()
			break
		}
		select {
		case err := <-done:
			return sinkBenchRun{}, fmt.Errorf("sink stopped: %v", err)
		case <-time.After(10 * time.Millisecond):
		}
	}
	if last.IsZero() {
		return sinkBenchRun{}, fmt.Errorf("sink did not write %d rows in time", c.Rows)
	}
	d := last.Sub(first)
	return sinkBenchRun{Name: "sink", Events: c.Rows, Seconds: d.Seconds(), Rate: float64(c.Rows) / d.Seconds()}, nil
}

// sinkCounts are the sink's counters the benchmark waits on.
type sinkCounts struct {
	in        float64 // meterline_sink_records_in_total
	inserted  float64 // meterline_sink_rows_total{outcome="inserted"}
	committed float64 // meterline_sink_records_committed_total: offsets committed by a committed transaction, after the INSERT of their rows
}

func sinkCountsOf(reg *prometheus.Registry) sinkCounts {
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

// sinkBenchRun is one measured run.
type sinkBenchRun struct {
	Name    string  `json:"name"`
	Events  int     `json:"rows"`
	Seconds float64 `json:"seconds"`
	Rate    float64 `json:"rows_per_second"`
}

func medianRate(rs []sinkBenchRun) float64 {
	if len(rs) == 0 {
		return 0
	}
	v := make([]float64, len(rs))
	for i, r := range rs {
		v[i] = r.Rate
	}
	sort.Float64s(v)
	if len(v)%2 == 1 {
		return v[len(v)/2]
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2
}
