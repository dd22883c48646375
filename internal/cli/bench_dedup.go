package cli

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"sort"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/meterline/meterline/dedup"
	"github.com/meterline/meterline/internal/kafka"
	"github.com/meterline/meterline/internal/stream"
	"github.com/meterline/meterline/internal/topics"
	"github.com/meterline/meterline/producer"
	"github.com/meterline/meterline/schemas"
)

// BenchDedupCmd is `meterline bench dedup`.
type BenchDedupCmd struct {
	Events         int           `help:"Events pre-filled in usage.events, copies included." default:"2000000"`
	DuplicateRate  float64       `help:"Share of the events that are copies of earlier ones." default:"0.05"`
	Partitions     int32         `help:"Partitions of every benchmark topic." default:"16"`
	CommitInterval time.Duration `help:"Commit interval of every stage measured." default:"100ms"`
	LatencyRate    int           `help:"Events per second sent during the latency phase." default:"5000"`
	LatencyFor     time.Duration `help:"Length of the latency phase." default:"15s"`
	StateDir       string        `help:"Where the benchmark keeps Pebble state (removed afterwards)." default:"" type:"path"`
	Keep           bool          `help:"Keep the benchmark topics."`
	Rounds         int           `help:"Rounds; each measures (a), (b) and dedup once, in a rotating order. Medians are reported." default:"3"`
	CPUProfile     string        `help:"Write a CPU profile of the dedup phase to this file." hidden:"" type:"path"`
}

type dedupBenchResult struct {
	name    string
	events  int
	elapsed time.Duration
}

func (r dedupBenchResult) rate() float64 { return float64(r.events) / r.elapsed.Seconds() }

// medianResult returns the result with the median rate.
func medianResult(rs []dedupBenchResult) dedupBenchResult {
	s := append([]dedupBenchResult{}, rs...)
	sort.Slice(s, func(i, j int) bool { return s[i].rate() < s[j].rate() })
	return s[len(s)/2]
}

// Run runs the benchmark.
func (c *BenchDedupCmd) Run(ctx context.Context, g *Globals, stdio IO, log *zap.Logger) error {
	say := func(format string, args ...any) { fmt.Fprintf(stdio.Stderr, "bench: "+format+"\n", args...) }
	dir := c.StateDir
	if dir == "" {
		d, err := os.MkdirTemp("", "meterline-bench-dedup-")
		if err != nil {
			return err
		}
		dir = d
	}
	defer os.RemoveAll(dir)

	names := g.Topic
	names.Prefix = fmt.Sprintf("%sbench%d.", g.Topic.Prefix, time.Now().Unix())
	layout := topics.DefaultLayout()
	layout.Partitions = c.Partitions
	adm, closeAdm, err := adminClient(ctx, g)
	if err != nil {
		return err
	}
	defer closeAdm()
	kc, err := g.kafka()
	if err != nil {
		return err
	}
	var created []string
	create := func(specs []topics.Spec) error {
		for _, s := range specs {
			created = append(created, s.Name)
		}
		_, err := topics.Create(ctx, adm, specs, -1)
		return err
	}
	if !c.Keep {
		defer func() { _, _ = adm.DeleteTopics(context.Background(), created...) }()
	}
	if err := create(topics.Specs(names, layout)[:1]); err != nil { // the input topic
		return err
	}

	say("pre-filling %s with %d events (%.0f%% copies)", names.EventsTopic(), c.Events, c.DuplicateRate*100)
	unique, err := prefillEvents(ctx, kc, names.EventsTopic(), c.Events, c.DuplicateRate)
	if err != nil {
		return err
	}
	// drop deletes a finished run's output topics and state: the broker and
	// Pebble files a run leaves behind are written back to disk while later
	// runs are measured (stalls of 60–110 ms per transaction end were seen
	// in the fourth and fifth rounds), and deleted files are not.
	drop := func(stateDir string, ts ...string) {
		if !c.Keep {
			_, _ = adm.DeleteTopics(context.Background(), ts...)
			_ = os.RemoveAll(stateDir)
		}
	}
	quiet := log.WithOptions(zap.IncreaseLevel(zap.WarnLevel))
	base := func(group, instance string) stream.Config {
		return stream.Config{Kafka: kc, Group: group, InstanceID: instance,
			StateDir: filepath.Join(dir, group+"-"+instance), CommitInterval: c.CommitInterval, Logger: quiet,
			Registerer: prometheus.NewRegistry()}
	}

	// Each round measures (a), (b) and dedup from the start of the same
	// input, each with its own group and output topics, in a rotating
	// order; medians are reported. The last round's dedup stays up for the
	// latency, state-size and restore measurements.
	var resA, resB, resD []dedupBenchResult
	var (
		st        *dedup.Stage
		dcfg      dedup.Config
		names2    topics.Names
		stopDedup context.CancelFunc
		done      chan error
	)
	for round := 0; round < c.Rounds; round++ {
		rp := fmt.Sprintf("%sr%d.", names.Prefix, round)
		runPass := func(name string, changelog bool) error {
			out := rp + name
			specs := []topics.Spec{
				{Name: out, Partitions: c.Partitions, Configs: map[string]string{"cleanup.policy": "delete"}},
				{Name: out + "-changelog", Partitions: c.Partitions, Configs: map[string]string{"cleanup.policy": "compact"}},
			}
			if err := create(specs); err != nil {
				return err
			}
			cfg := base(out+"-group", "b1")
			cfg.Stage = "bench"
			cfg.InputTopic = names.EventsTopic()
			cfg.ChangelogTopic = out + "-changelog"
			proc := &passthrough{out: out, changelog: changelog}
			r, err := runUntil(ctx, cfg, proc, func() int64 { return proc.n.Load() }, int64(c.Events))
			if err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			drop(cfg.StateDir, out, out+"-changelog")
			if changelog {
				r.name = "(b) passthrough + changelog record per event"
				resB = append(resB, r)
			} else {
				r.name = "(a) passthrough"
				resA = append(resA, r)
			}
			say("round %d %s: %.0f events/s; %s", round+1, r.name, r.rate(), txnStats(cfg.Registerer.(prometheus.Gatherer), r.elapsed))
			return nil
		}
		runDedup := func() error {
			last := round == c.Rounds-1
			names2 = topics.Names{Prefix: "", Events: names.EventsTopic(), Deduped: rp + "usage.deduped",
				Duplicates: rp + "usage.duplicates", Rejected: rp + "usage.rejected", Aggregates: rp + "usage.aggregates",
				Adjustments: rp + "usage.adjustments", DedupChangelog: rp + "meterline-dedup-changelog",
				AggregateChangelog: rp + "meterline-aggregate-changelog"}
			if err := create(topics.Specs(names2, layout)[1:]); err != nil {
				return err
			}
			dcfg = dedup.Config{Stream: base(rp+"bench-dedup", "d1"), Topics: names2}
			reg := prometheus.NewRegistry()
			dcfg.Stream.Registerer = reg
			var err error
			st, err = dedup.New(ctx, dcfg)
			if err != nil {
				return err
			}
			var dctx context.Context
			dctx, stopDedup = context.WithCancel(ctx)
			done = make(chan error, 1)
			if last && c.CPUProfile != "" {
				f, err := os.Create(c.CPUProfile)
				if err != nil {
					return err
				}
				if err := pprof.StartCPUProfile(f); err != nil {
					return err
				}
			}
			start := time.Now()
			go func() { done <- st.Run(dctx) }()
			decided := func() int64 {
				return int64(sumCounter(reg, "meterline_dedup_accepted_total", "meterline_dedup_duplicates_total", "meterline_rejected_total"))
			}
			if err := waitCount(ctx, decided, int64(c.Events), done); err != nil {
				stopDedup()
				return err
			}
			r := dedupBenchResult{name: "dedup", events: c.Events, elapsed: time.Since(start)}
			if last && c.CPUProfile != "" {
				pprof.StopCPUProfile()
			}
			resD = append(resD, r)
			say("round %d dedup: %.0f events/s (%d unique, %d copies); %s", round+1, r.rate(), unique, c.Events-unique, txnStats(reg, r.elapsed))
			if got := int(sumCounter(reg, "meterline_dedup_accepted_total")); got != unique {
				stopDedup()
				return fmt.Errorf("dedup accepted %d events, %d were unique", got, unique)
			}
			if !last {
				stopDedup()
				<-done
				drop(dcfg.Stream.StateDir, names2.DedupedTopic(), names2.DuplicatesTopic(), names2.RejectedTopic(), names2.DedupChangelogTopic())
			}
			return nil
		}
		steps := []func() error{
			func() error { return runPass("bench-pass-a", false) },
			func() error { return runPass("bench-pass-b", true) },
			runDedup,
		}
		// Rotate, but keep dedup last in the last round (it stays up).
		if round < c.Rounds-1 {
			k := round % 3
			steps = append(steps[k:], steps[:k]...)
		}
		for _, f := range steps {
			if err := f(); err != nil {
				return err
			}
		}
	}
	names = names2
	results := []dedupBenchResult{medianResult(resA), medianResult(resB)}
	dres := medianResult(resD)

	// Latency: produce at a steady rate into the running stage and time each
	// event from its broker arrival to its visibility in usage.deduped.
	say("latency: %d events/s for %s", c.LatencyRate, c.LatencyFor)
	lat, err := measureLatency(ctx, kc, names, c.LatencyRate, c.LatencyFor)
	stopDedup()
	if err2 := <-done; err2 != nil && err == nil {
		err = err2
	}
	if err != nil {
		return err
	}

	// State bytes per key after a full compaction (the stage closed its
	// store; reopen it).
	bytesPerKey, keys, err := stateBytesPerKey(dcfg.Stream.StateDir, c.Partitions, log)
	if err != nil {
		return err
	}

	// Restore: a wiped instance of the same group rebuilds every partition.
	rcfg := dcfg
	rcfg.Stream.StateDir = filepath.Join(dir, "restore")
	rcfg.Stream.Registerer = prometheus.NewRegistry()
	rst, err := dedup.New(ctx, rcfg)
	if err != nil {
		return err
	}
	rctx, stopRestore := context.WithCancel(ctx)
	rdone := make(chan error, 1)
	rstart := time.Now()
	go func() { rdone <- rst.Run(rctx) }()
	var restoreTook time.Duration
	for {
		time.Sleep(50 * time.Millisecond)
		if owned := gaugeValue(rcfg.Stream.Registerer.(*prometheus.Registry), "meterline_stream_owned_partitions"); int32(owned) == c.Partitions {
			restoreTook = time.Since(rstart)
			break
		}
		select {
		case err := <-rdone:
			stopRestore()
			return fmt.Errorf("restore run stopped: %v", err)
		default:
		}
		if time.Since(rstart) > 10*time.Minute {
			stopRestore()
			return errors.New("restore did not finish in 10 minutes")
		}
	}
	restored := sumCounter(rcfg.Stream.Registerer.(*prometheus.Registry), "meterline_stream_restore_records_total")
	stopRestore()
	<-rdone

	out := stdio.Stdout
	fmt.Fprintf(out, "input: %d events (%d unique, %.0f%% copies), %d partitions, commit interval %s; medians of %d rounds\n",
		c.Events, unique, c.DuplicateRate*100, c.Partitions, c.CommitInterval, c.Rounds)
	for _, r := range results {
		fmt.Fprintf(out, "%-46s %9.0f events/s\n", r.name, r.rate())
	}
	fmt.Fprintf(out, "%-46s %9.0f events/s  (%.2f of (b), %.2f of (a))\n", "dedup", dres.rate(),
		dres.rate()/results[1].rate(), dres.rate()/results[0].rate())
	fmt.Fprintf(out, "latency produce → visible in usage.deduped: p50 %s, p99 %s (%d events at %d/s)\n",
		lat.p50.Round(time.Millisecond), lat.p99.Round(time.Millisecond), lat.n, c.LatencyRate)
	fmt.Fprintf(out, "state after full compaction: %.1f bytes per key (%d keys)\n", bytesPerKey, keys)
	fmt.Fprintf(out, "restore of the whole state from the changelog: %s (%.0f records, %d partitions)\n",
		restoreTook.Round(time.Millisecond), restored, c.Partitions)
	return nil
}

// passthrough is a baseline stage: it copies every input record to out in
// the same kind of transaction, and with changelog also writes one
// changelog-sized state record per event, shaped as dedup's identity
// records: a key of 'k', a 4-byte bucket and the first 16 bytes of SHA-256
// of the record key (so keys arrive in random order, as in any keyed
// store), and a value of the same size as dedup's.
type passthrough struct {
	out       string
	changelog bool
	n         atomic.Int64
}

func (p *passthrough) Open(int32, *stream.PartitionState) (stream.Partition, error) {
	return &passthroughPart{p: p}, nil
}

type passthroughPart struct{ p *passthrough }

func (pp *passthroughPart) Process(tx *stream.Tx, recs []*kgo.Record) error {
	var k [21]byte
	var v [14]byte
	for _, r := range recs {
		tx.Emit(&kgo.Record{Topic: pp.p.out, Partition: r.Partition, Key: r.Key, Value: r.Value})
		if pp.p.changelog {
			sum := sha256.Sum256(r.Key)
			k[0] = 'k'
			copy(k[5:], sum[:16])
			binary.BigEndian.PutUint64(v[6:], uint64(r.Offset))
			tx.Put(k[:], v[:])
		}
	}
	pp.p.n.Add(int64(len(recs)))
	return nil
}

func (pp *passthroughPart) Punctuate(*stream.Tx) error { return nil }
func (pp *passthroughPart) Close()                     {}

func runUntil(ctx context.Context, cfg stream.Config, proc stream.Processor, count func() int64, want int64) (dedupBenchResult, error) {
	rt, err := stream.New(cfg, proc)
	if err != nil {
		return dedupBenchResult{}, err
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- rt.Run(rctx) }()
	err = waitCount(ctx, count, want, done)
	el := time.Since(start)
	cancel()
	if !errors.Is(err, errStageStopped) { // else waitCount took Run's result
		if err2 := <-done; err == nil {
			err = err2
		}
	}
	return dedupBenchResult{events: int(want), elapsed: el}, err
}

var errStageStopped = errors.New("stage stopped early")

func waitCount(ctx context.Context, count func() int64, want int64, done <-chan error) error {
	for count() < want {
		select {
		case err := <-done:
			return fmt.Errorf("%w at %d of %d records: %v", errStageStopped, count(), want, err)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	return nil
}

// prefillEvents writes n events, of which a share rate are exact copies of
// earlier ones, and returns the number of unique events.
func prefillEvents(ctx context.Context, kc kafka.Config, topic string, n int, rate float64) (int, error) {
	p, err := newProducer(kc, producer.WithTopic(topic), producer.WithSource("bench"))
	if err != nil {
		return 0, err
	}
	defer p.Close()
	now := time.Now()
	unique := 0
	var failed atomic.Int64
	every := 0
	if rate > 0 {
		every = int(1 / rate)
	}
	for i := 0; i < n; i++ {
		id := unique
		if every > 0 && i%every == every-1 && unique > 0 {
			id = (i * 7919) % unique // a copy of an earlier event
		} else {
			unique++
		}
		e := producer.Event{EventID: producer.EventID("bench", fmt.Sprint(id)), CustomerID: fmt.Sprintf("cust-%05d", id%10000),
			Meter: []string{"api_calls", "tokens", "storage_bytes", "compute_ms", "egress_bytes"}[id%5], Quantity: int64(1 + id%100),
			EventTime: now.Add(-time.Hour).Add(time.Duration(id%3_600_000) * time.Millisecond), Source: "bench"}
		r, err := p.Record(e)
		if err != nil {
			return 0, err
		}
		p.ProduceRecord(r, func(err error) {
			if err != nil {
				failed.Add(1)
			}
		})
	}
	if err := p.Flush(ctx); err != nil {
		return 0, err
	}
	if f := failed.Load(); f > 0 {
		return 0, fmt.Errorf("pre-fill: %d sends failed", f)
	}
	return unique, nil
}

type latencies struct {
	p50, p99 time.Duration
	n        int
}

func measureLatency(ctx context.Context, kc kafka.Config, names topics.Names, rate int, dur time.Duration) (latencies, error) {
	cl, err := kafka.NewClient(kc, kgo.ConsumeTopics(names.DedupedTopic()),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtEnd()), kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.FetchMaxWait(50*time.Millisecond))
	if err != nil {
		return latencies{}, err
	}
	defer cl.Close()
	// Make sure the consumer is positioned before sending.
	pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	cl.PollFetches(pctx)
	cancel()
	p, err := newProducer(kc, producer.WithTopic(names.EventsTopic()), producer.WithLinger(0))
	if err != nil {
		return latencies{}, err
	}
	defer p.Close()
	sent := map[string]time.Time{}
	var lats []time.Duration
	total := int(float64(rate) * dur.Seconds())
	seen := 0
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	per := rate / 100
	if per < 1 {
		per = 1
	}
	i := 0
	deadline := time.Now().Add(dur + 30*time.Second)
	for seen < total && time.Now().Before(deadline) {
		if i < total {
			<-tick.C
			for j := 0; j < per && i < total; j++ {
				id := producer.EventID("latency", fmt.Sprint(time.Now().UnixNano()), fmt.Sprint(i))
				r, err := p.Record(producer.Event{EventID: id, CustomerID: "lat", Meter: "api_calls", Quantity: 1, EventTime: time.Now()})
				if err != nil {
					return latencies{}, err
				}
				sent[id] = time.Now()
				p.ProduceRecord(r, nil)
				i++
			}
		}
		fctx, cancel := context.WithTimeout(ctx, time.Millisecond)
		fs := cl.PollFetches(fctx)
		cancel()
		now := time.Now()
		fs.EachRecord(func(r *kgo.Record) {
			var d schemas.DedupedEvent
			if schemas.DecodeInto(r.Value, &d) != nil {
				return
			}
			if t0, ok := sent[d.EventID]; ok {
				lats = append(lats, now.Sub(t0))
				delete(sent, d.EventID)
				seen++
			}
		})
	}
	return quantiles(lats, "event")
}

// quantiles sorts the latencies measured and returns their p50 and p99.
func quantiles(lats []time.Duration, what string) (latencies, error) {
	if len(lats) == 0 {
		return latencies{}, fmt.Errorf("latency: no %s became visible", what)
	}
	sort.Slice(lats, func(a, b int) bool { return lats[a] < lats[b] })
	q := func(f float64) time.Duration { return lats[int(f*float64(len(lats)-1))] }
	return latencies{p50: q(0.50), p99: q(0.99), n: len(lats)}, nil
}

func stateBytesPerKey(dir string, partitions int32, log *zap.Logger) (float64, int, error) {
	st, err := stream.OpenStore(dir, nil, log.WithOptions(zap.IncreaseLevel(zap.WarnLevel)))
	if err != nil {
		return 0, 0, err
	}
	defer st.Close()
	db := st.DB()
	if err := db.Compact(context.Background(), []byte{0x00}, []byte{0xff}, true); err != nil {
		return 0, 0, err
	}
	keys := 0
	for p := int32(0); p < partitions; p++ {
		if err := st.Scan(p, []byte{'k'}, []byte{'l'}, func(_, _ []byte) error { keys++; return nil }); err != nil {
			return 0, 0, err
		}
	}
	var size uint64
	for _, l := range db.Metrics().Levels {
		size += uint64(l.TablesSize)
	}
	if keys == 0 {
		return 0, 0, errors.New("no keys in the dedup state")
	}
	return float64(size) / float64(keys), keys, nil
}

// sumCounter sums the series of the named metrics in one Gather: the
// benchmarks poll it while the measured stage runs on the same cores, and
// a Gather of a stage's registry is not free.
func sumCounter(reg *prometheus.Registry, names ...string) float64 {
	mfs, _ := reg.Gather()
	s := 0.0
	for _, mf := range mfs {
		if !slices.Contains(names, mf.GetName()) {
			continue
		}
		for _, m := range mf.GetMetric() {
			s += metricValue(m)
		}
	}
	return s
}

func gaugeValue(reg *prometheus.Registry, name string) float64 { return sumCounter(reg, name) }

// txnStats describes a stage's transactions from its registry: how many,
// records per transaction, and the mean time spent ending them (flush,
// the offset commit and EndTxn; for the aggregator also its OPEN
// revisions), so that a benchmark shows
// whether a stage is bound by its own CPU or by the commit round trips.
func txnStats(g prometheus.Gatherer, elapsed time.Duration) string {
	mfs, _ := g.Gather()
	var n, sum, in float64
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			switch mf.GetName() {
			case "meterline_stream_commit_seconds":
				n += float64(m.GetHistogram().GetSampleCount())
				sum += m.GetHistogram().GetSampleSum()
			case "meterline_stream_records_in_total":
				in += metricValue(m)
			}
		}
	}
	if n == 0 {
		return "no transactions"
	}
	return fmt.Sprintf("%.0f transactions, %.0f records each, ending one took %.1f ms on average (%.0f%% of the run)",
		n, in/n, 1000*sum/n, 100*sum/elapsed.Seconds())
}

func metricValue(m *dto.Metric) float64 {
	switch {
	case m.GetCounter() != nil:
		return m.GetCounter().GetValue()
	case m.GetGauge() != nil:
		return m.GetGauge().GetValue()
	}
	return 0
}
