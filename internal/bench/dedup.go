package bench

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/meterline/meterline/dedup"
	"github.com/meterline/meterline/internal/stream"
	"github.com/meterline/meterline/internal/topics"
	"github.com/meterline/meterline/producer"
	"github.com/meterline/meterline/schemas"
)

// DedupConfig configures Dedup.
type DedupConfig struct {
	// Events pre-filled in usage.events, copies included.
	Events int
	// DuplicateRate is the share of the events that are copies of earlier
	// ones, from 0 to 1.
	DuplicateRate float64
	// ReplicationFactors, when set, run the dedup stage once per
	// replication factor in each round, its output and changelog topics
	// created with that factor and min.insync.replicas of
	// topics.DefaultMinInsync (2 for 3, else 1), so that their costs are
	// compared in the same run (RF=3 against RF=1 on a cluster of three).
	// The input and the baselines' topics keep the cluster's default.
	// Default: one dedup, every topic with the cluster's default.
	ReplicationFactors []int16
	StageConfig
}

// Validate reports every problem with the config.
func (c *DedupConfig) Validate() error {
	var rate error
	if c.DuplicateRate < 0 || c.DuplicateRate > 1 {
		rate = fmt.Errorf("bench: duplicate-rate must be from 0 to 1 (got %g)", c.DuplicateRate)
	}
	var rfs []error
	seen := map[int16]bool{}
	for _, rf := range c.ReplicationFactors {
		if rf < 1 {
			rfs = append(rfs, fmt.Errorf("bench: replication factor must be at least 1 (got %d)", rf))
		}
		if seen[rf] {
			rfs = append(rfs, fmt.Errorf("bench: replication factor %d given twice", rf))
		}
		seen[rf] = true
	}
	return errors.Join(positive("events", c.Events), rate, errors.Join(rfs...), c.StageConfig.validate())
}

// Dedup measures the dedup stage on pre-filled input against two
// transactional passthroughs, (a) copying every record and (b) also
// writing one changelog record per event, each from the start of the
// same input with its own group and output topics. The last round's
// dedup, run last, stays up for the phases after the rounds: latency
// (events sent at a steady rate, timed from their send to their
// visibility in usage.deduped), state bytes per key after a full
// compaction, and the restore of the whole state by a wiped instance.
func Dedup(ctx context.Context, env *Env, cfg DedupConfig) (err error) {
	s, err := newStageBench(env, "dedup", "bench", cfg.StageConfig, cfg.Validate)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, s.close()) }()
	b := &dedupBench{stageBench: s, cfg: cfg}
	if err := s.left.createTopics(ctx, topics.Specs(s.names, s.layout)[:1]...); err != nil { // the input topic
		return err
	}
	env.say("pre-filling %s with %d events (%.0f%% copies)", s.names.EventsTopic(), cfg.Events, cfg.DuplicateRate*100)
	if b.unique, err = b.prefill(ctx); err != nil {
		return err
	}
	rounds := Rounds{N: cfg.Rounds, HoldLast: true, Unit: "events", Progress: env.say}
	contenders := []Contender{
		dedupPass{b, "bench-pass-a", "(a) passthrough", nil},
		dedupPass{b, "bench-pass-b", "(b) passthrough + changelog record per event", dedupState{}},
	}
	if len(cfg.ReplicationFactors) == 0 {
		contenders = append(contenders, dedupRun{b: b, keep: true})
	}
	for i, rf := range cfg.ReplicationFactors {
		// The last one stays up after the last round.
		contenders = append(contenders, dedupRun{b: b, rf: rf, keep: i == len(cfg.ReplicationFactors)-1})
	}
	res, err := rounds.Run(ctx, contenders...)
	if err != nil {
		return err
	}

	env.say("latency: %d events/s for %s", cfg.LatencyRate, cfg.LatencyFor)
	lat, err := b.latency(ctx)
	if err2 := s.stopLive(); err == nil {
		err = err2
	}
	if err != nil {
		return err
	}
	// State bytes per key after a full compaction (the stage closed its
	// store; reopen it).
	bytesPerKey, keys, err := stateBytesPerKey(b.liveCfg.Stream.StateDir, cfg.Partitions, env.Logger)
	if err != nil {
		return err
	}
	restoreTook, restored, err := b.restore(ctx)
	if err != nil {
		return err
	}

	out := env.Out
	fmt.Fprintf(out, "input: %d events (%d unique, %.0f%% copies), %d partitions, commit interval %s; medians of %d rounds\n",
		cfg.Events, b.unique, cfg.DuplicateRate*100, cfg.Partitions, cfg.CommitInterval, cfg.Rounds)
	printRates(out, res)
	for i := 3; i < len(res.Runs); i++ {
		fmt.Fprintf(out, "%-46s %9.0f events/s  (%.2f of %s in the same rounds)\n", res.Runs[i][0].Name, res.Median(i),
			res.RoundRatio(i, 2), res.Runs[2][0].Name)
	}
	fmt.Fprintf(out, "latency produce → visible in usage.deduped: p50 %s, p99 %s (%d events at %d/s)\n",
		lat.p50.Round(time.Millisecond), lat.p99.Round(time.Millisecond), lat.n, cfg.LatencyRate)
	fmt.Fprintf(out, "state after full compaction: %.1f bytes per key (%d keys)\n", bytesPerKey, keys)
	fmt.Fprintf(out, "restore of the whole state from the changelog: %s (%.0f records, %d partitions)\n",
		restoreTook.Round(time.Millisecond), restored, cfg.Partitions)
	return nil
}

type dedupBench struct {
	*stageBench
	cfg    DedupConfig
	unique int // unique events in the input
	// liveCfg is the config of the last round's dedup, which s.live runs.
	liveCfg dedup.Config
}

// prefill writes the input and returns the number of unique events.
func (b *dedupBench) prefill(ctx context.Context) (int, error) {
	p, err := producer.New(b.env.producerOptions(producer.WithTopic(b.names.EventsTopic()), producer.WithSource("bench"))...)
	if err != nil {
		return 0, err
	}
	defer p.Close()
	var failed atomic.Int64
	unique, err := dedupInput{n: b.cfg.Events, rate: b.cfg.DuplicateRate, now: time.Now()}.each(func(e producer.Event) error {
		r, err := p.Record(e)
		if err != nil {
			return err
		}
		p.ProduceRecord(r, func(err error) {
			if err != nil {
				failed.Add(1)
			}
		})
		return nil
	})
	if err != nil {
		return 0, err
	}
	if err := p.Flush(ctx); err != nil {
		return 0, err
	}
	if f := failed.Load(); f > 0 {
		return 0, fmt.Errorf("bench: pre-fill: %d sends failed", f)
	}
	return unique, nil
}

// roundPrefix prefixes the topics and groups of round.
func (b *dedupBench) roundPrefix(round int) string {
	return fmt.Sprintf("%sr%d.", b.names.Prefix, round)
}

// dedupPass is baseline (a) or (b): a passthrough of the input into
// topics of its own, dropped after the run with its state: the broker
// and Pebble files a run leaves behind are written back to disk while
// later runs are measured (stalls of 60–110 ms per transaction end were
// seen in the fourth and fifth rounds), and deleted files are not.
type dedupPass struct {
	b     *dedupBench
	topic string // the output topic, after the round's prefix
	name  string
	state stateShape
}

func (p dedupPass) Run(ctx context.Context, round int, _ bool) (Result, error) {
	out := p.b.roundPrefix(round) + p.topic
	if err := p.b.left.createTopics(ctx,
		topics.Spec{Name: out, Partitions: p.b.cfg.Partitions, Configs: map[string]string{"cleanup.policy": "delete"}},
		topics.Spec{Name: out + "-changelog", Partitions: p.b.cfg.Partitions, Configs: map[string]string{"cleanup.policy": "compact"}},
	); err != nil {
		return Result{}, err
	}
	cfg := p.b.streamConfig(out+"-group", "b1")
	cfg.Stage = "bench"
	cfg.InputTopic = p.b.names.EventsTopic()
	cfg.ChangelogTopic = out + "-changelog"
	res, err := p.b.measurePass(ctx, p.name, cfg, out, p.state, p.b.cfg.Events)
	if err != nil {
		return Result{}, err
	}
	p.b.left.drop(things{topics: []string{out, out + "-changelog"}, groups: []string{cfg.Group}, dirs: []string{cfg.StateDir}})
	return res, nil
}

// dedupRun is the dedup stage on the input, with output topics of its
// own, created with replication factor rf (0: the cluster's default); the
// last round's stays up if keep.
type dedupRun struct {
	b    *dedupBench
	rf   int16
	keep bool
}

func (d dedupRun) Run(ctx context.Context, round int, last bool) (Result, error) {
	b := d.b
	last = last && d.keep
	rp := b.roundPrefix(round)
	name := "dedup"
	layout := b.layout
	if d.rf > 0 {
		name = fmt.Sprintf("dedup, replication factor %d", d.rf)
		rp += fmt.Sprintf("rf%d.", d.rf)
		layout.ReplicationFactor, layout.MinInsyncReplicas = d.rf, topics.DefaultMinInsync(d.rf)
	}
	dn := topics.DefaultNames()
	names := topics.Names{Prefix: "", Events: b.names.EventsTopic(), Deduped: rp + dn.Deduped,
		Duplicates: rp + dn.Duplicates, Rejected: rp + dn.Rejected, Aggregates: rp + dn.Aggregates,
		Adjustments: rp + dn.Adjustments, DedupChangelog: rp + dn.DedupChangelog,
		AggregateChangelog: rp + dn.AggregateChangelog, Entitlements: rp + dn.Entitlements, Balances: rp + dn.Balances,
		Keys: rp + dn.Keys}
	if err := b.left.createTopics(ctx, topics.Specs(names, layout)[1:]...); err != nil {
		return Result{}, err
	}
	key, err := dedup.GenerateKey("bench")
	if err != nil {
		return Result{}, err
	}
	cfg := dedup.Config{Stream: b.streamConfig(rp+"bench-dedup", "d1"), Topics: names, Keys: []dedup.Key{key}}
	decisions := []string{"meterline_dedup_accepted_total", "meterline_dedup_duplicates_total", "meterline_rejected_total"}
	reg := newWatchedRegistry(decisions...)
	cfg.Stream.Registerer = reg
	st, err := dedup.New(ctx, cfg)
	if err != nil {
		return Result{}, err
	}
	if err := reg.check(); err != nil {
		return Result{}, err
	}
	decided := func() int64 { return int64(sumMetrics(reg.watched(), decisions...)) }
	sp, err := b.measureStage(ctx, st.Run, decided, b.cfg.Events, last, b.cfg.CPUProfile)
	if err != nil {
		return Result{}, err
	}
	res := Result{Name: name, Count: sp.count, Elapsed: sp.elapsed, Startup: sp.startup,
		Detail: fmt.Sprintf(" (%d unique, %d copies)%s; %s", b.unique, b.cfg.Events-b.unique, sp.startupNote(), txnStats(reg, sp.elapsed))}
	if got := int(sumMetrics(reg, "meterline_dedup_accepted_total")); got != b.unique {
		return Result{}, fmt.Errorf("dedup accepted %d events, %d were unique", got, b.unique)
	}
	if last {
		b.liveCfg = cfg
		return res, nil
	}
	if err := b.stopLive(); err != nil {
		return Result{}, err
	}
	b.left.drop(things{topics: []string{names.DedupedTopic(), names.DuplicatesTopic(), names.RejectedTopic(), names.DedupChangelogTopic()},
		groups: []string{cfg.Stream.Group}, dirs: []string{cfg.Stream.StateDir}})
	return res, nil
}

// latency measures the latency of the dedup left up.
func (b *dedupBench) latency(ctx context.Context) (latencies, error) {
	p, err := producer.New(b.env.producerOptions(producer.WithTopic(b.names.EventsTopic()), producer.WithLinger(0))...)
	if err != nil {
		return latencies{}, err
	}
	defer p.Close()
	return latencyPhase{env: b.env, watch: b.liveCfg.Topics.DedupedTopic(), rate: b.cfg.LatencyRate, dur: b.cfg.LatencyFor,
		target: dedupLatency{p}, what: "event"}.run(ctx)
}

// dedupLatency sends events of a customer "lat", each with a new event ID,
// and finds them in usage.deduped.
type dedupLatency struct{ p *producer.Producer }

func (d dedupLatency) send(_ context.Context, i int) (string, error) {
	id := producer.EventID("latency", fmt.Sprint(time.Now().UnixNano()), fmt.Sprint(i))
	r, err := d.p.Record(producer.Event{EventID: id, CustomerID: "lat", Meter: "api_calls", Quantity: 1, EventTime: time.Now()})
	if err != nil {
		return "", err
	}
	d.p.ProduceRecord(r, nil)
	return id, nil
}

func (dedupLatency) seen(r *kgo.Record) string {
	var d schemas.DedupedEvent
	if schemas.DecodeInto(r.Value, &d) != nil {
		return ""
	}
	return d.EventID
}

// restore starts a wiped instance of the last round's dedup, in the same
// group, and returns the time until it owns every partition (each
// restored from the changelog) and the changelog records it restored.
func (b *dedupBench) restore(ctx context.Context) (time.Duration, float64, error) {
	cfg := b.liveCfg
	cfg.Stream.StateDir = filepath.Join(b.dir, "restore")
	reg := prometheus.NewRegistry()
	cfg.Stream.Registerer = reg
	st, err := dedup.New(ctx, cfg)
	if err != nil {
		return 0, 0, err
	}
	start := time.Now()
	r := startStage(ctx, st.Run)
	defer r.stop()
	for {
		time.Sleep(50 * time.Millisecond)
		if owned := sumMetrics(reg, "meterline_stream_owned_partitions"); int32(owned) == b.cfg.Partitions {
			took := time.Since(start)
			return took, sumMetrics(reg, "meterline_stream_restore_records_total"), nil
		}
		if ended, err := r.exited(); ended {
			return 0, 0, fmt.Errorf("bench: restore: the stage stopped: %v", err)
		}
		if ctx.Err() != nil {
			return 0, 0, ctx.Err()
		}
		if time.Since(start) > 10*time.Minute {
			return 0, 0, errors.New("bench: restore did not finish in 10 minutes")
		}
	}
}

// stateBytesPerKey compacts the store in dir fully and returns its size
// per identity key, and the keys.
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
		return 0, 0, errors.New("bench: no keys in the dedup state")
	}
	return float64(size) / float64(keys), keys, nil
}
