package bench

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime/pprof"
	"slices"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/internal/stream"
	"github.com/meterline/meterline/internal/topics"
)

// running is a stage's Run on a goroutine of its own.
type running struct {
	cancel context.CancelFunc
	done   chan error
	ended  bool  // Run returned
	err    error // what it returned
}

func startStage(ctx context.Context, run func(context.Context) error) *running {
	ctx, cancel := context.WithCancel(ctx)
	r := &running{cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- run(ctx) }()
	return r
}

// errStageStopped: the stage measured returned before it had done its work.
var errStageStopped = errors.New("stage stopped early")

// waitFor polls count every 20 ms until it reaches want, and returns an
// error when the stage stops first or ctx ends.
func (r *running) waitFor(ctx context.Context, count func() int64, want int64) error {
	for count() < want {
		select {
		case err := <-r.done:
			r.ended, r.err = true, err
			return fmt.Errorf("%w at %d of %d records: %v", errStageStopped, count(), want, err)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	return nil
}

// exited reports whether Run has returned, and what it returned, without
// waiting.
func (r *running) exited() (bool, error) {
	if !r.ended {
		select {
		case r.err = <-r.done:
			r.ended = true
		default:
		}
	}
	return r.ended, r.err
}

// stop ends the stage and returns what Run returned (nil when it ended
// because it was stopped). It may be called again, and on a nil running.
func (r *running) stop() error {
	if r == nil {
		return nil
	}
	r.cancel()
	if !r.ended {
		r.err, r.ended = <-r.done, true
	}
	return r.err
}

// span is what measureRun measured of a run. A run's rate is taken over
// its work alone, from the first poll that saw a record handled to the one
// that saw the last: what a stage does once when it starts (opening its
// store, joining the group, restoring, reading its other inputs to their
// ends) is its start-up, reported apart, not spread over its records.
type span struct {
	startup time.Duration // from the start to the first poll that saw a record handled
	elapsed time.Duration // from that poll to the one that saw the last
	count   int           // the records handled in elapsed
	cpu     time.Duration // the process's CPU time in elapsed
}

// rate is the span's records per second.
func (s span) rate() float64 { return float64(s.count) / s.elapsed.Seconds() }

// startupNote is the start-up for a run's progress line.
func (s span) startupNote() string {
	if s.startup == 0 {
		return ""
	}
	return fmt.Sprintf("; started in %d ms", s.startup.Milliseconds())
}

// measureRun starts run and waits until count reaches want, and returns
// the span of the run's work (span). A first poll that already sees every
// record handled leaves no window: the span is then the whole run, its
// start-up included (and reported as 0).
func measureRun(ctx context.Context, run func(context.Context) error, count func() int64, want int64) (span, *running, error) {
	start, cpu0 := time.Now(), processCPU()
	r := startStage(ctx, run)
	var first time.Time
	var n0 int64
	var cpu1 time.Duration
	seen := func() int64 {
		n := count()
		if n > 0 && first.IsZero() {
			first, n0, cpu1 = time.Now(), n, processCPU()
		}
		return n
	}
	if err := r.waitFor(ctx, seen, want); err != nil {
		_ = r.stop()
		return span{}, nil, err
	}
	end, cpu2 := time.Now(), processCPU()
	if n0 >= want {
		return span{elapsed: end.Sub(start), count: int(want), cpu: cpu2 - cpu0}, r, nil
	}
	return span{startup: first.Sub(start), elapsed: end.Sub(first), count: int(want - n0), cpu: cpu2 - cpu1}, r, nil
}

// startProfile writes a CPU profile to path until the returned function
// is called; with no path it does nothing.
func startProfile(path string) (stop func(), err error) {
	if path == "" {
		return func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("bench: cpu profile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("bench: cpu profile: %w", err)
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}

// passthrough is a baseline stage: it copies every input record to out in
// the same kind of transaction as the stage it is compared with, and with
// a state shape also writes one changelog-sized state record per event.
type passthrough struct {
	out   string
	state stateShape // nil: no state, baseline (a)
	n     atomic.Int64
}

// stateShape makes the state record of an input record, sized and spread
// over the key space as the measured stage's own.
type stateShape interface {
	// sizes are the lengths of the key and the value.
	sizes() (key, value int)
	// fill writes r's record into k and v, which hold the previous
	// record's bytes.
	fill(k, v []byte, r *kgo.Record)
}

func (p *passthrough) Open(int32, *stream.PartitionState) (stream.Partition, error) {
	return &passthroughPart{p: p}, nil
}

type passthroughPart struct{ p *passthrough }

func (pp *passthroughPart) Process(tx *stream.Tx, recs []*kgo.Record) error {
	var k, v []byte
	if pp.p.state != nil {
		kl, vl := pp.p.state.sizes()
		k, v = make([]byte, kl), make([]byte, vl)
	}
	for _, r := range recs {
		tx.Emit(&kgo.Record{Topic: pp.p.out, Partition: r.Partition, Key: r.Key, Value: r.Value})
		if pp.p.state != nil {
			pp.p.state.fill(k, v, r)
			tx.Put(k, v)
		}
	}
	pp.p.n.Add(int64(len(recs)))
	return nil
}

func (pp *passthroughPart) Punctuate(*stream.Tx) error { return nil }
func (pp *passthroughPart) Close()                     {}

// dedupState is shaped as dedup's identity records: a key of 'k', a
// 4-byte bucket and the first 16 bytes of SHA-256 of the record key (so
// keys arrive in random order, as in any keyed store), and a value of the
// same size as dedup's.
type dedupState struct{}

func (dedupState) sizes() (int, int) { return 21, 14 }

func (dedupState) fill(k, v []byte, r *kgo.Record) {
	sum := sha256.Sum256(r.Key)
	k[0] = 'k'
	copy(k[5:], sum[:16])
	binary.BigEndian.PutUint64(v[6:], uint64(r.Offset))
}

// aggregateState is shaped as an aggregate: a 40-byte key (prefix, period,
// framed customer, meter and group), one per event, and a 20-byte value
// (its varint state).
type aggregateState struct{}

func (aggregateState) sizes() (int, int) { return 40, 20 }

func (aggregateState) fill(k, _ []byte, r *kgo.Record) {
	k[0] = 'a'
	binary.BigEndian.PutUint64(k[1:], uint64(r.Offset)) // one key per event
	copy(k[9:], r.Key)
}

// sumMetrics sums the series of the named metrics in one Gather: the
// benchmarks poll it while the measured stage runs on the same cores, and
// a Gather of a stage's registry is not free.
func sumMetrics(g prometheus.Gatherer, names ...string) float64 {
	mfs, _ := g.Gather()
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

func metricValue(m *dto.Metric) float64 {
	switch {
	case m.GetCounter() != nil:
		return m.GetCounter().GetValue()
	case m.GetGauge() != nil:
		return m.GetGauge().GetValue()
	}
	return 0
}

// txnStats describes a stage's transactions from its registry: how many,
// records per transaction, and the mean time spent ending them (flush,
// the offset commit and EndTxn; for the aggregator also its OPEN
// revisions), so that a benchmark shows whether a stage is bound by its
// own CPU or by the commit round trips; and how much of that was spent
// waiting for the coordinator to finish the transaction before (its
// markers written), which the broker decides, not the stage.
func txnStats(g prometheus.Gatherer, elapsed time.Duration) string {
	mfs, _ := g.Gather()
	var n, sum, wait, in float64
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			switch mf.GetName() {
			case "meterline_stream_commit_seconds":
				n += float64(m.GetHistogram().GetSampleCount())
				sum += m.GetHistogram().GetSampleSum()
			case "meterline_stream_transaction_settle_wait_seconds":
				wait += m.GetHistogram().GetSampleSum()
			case "meterline_stream_records_in_total":
				in += metricValue(m)
			}
		}
	}
	if n == 0 {
		return "no transactions"
	}
	return fmt.Sprintf("%.0f transactions, %.0f records each, ending one took %.1f ms on average (%.0f%% of the run; waiting for the coordinator to finish the one before, %.0f%%)",
		n, in/n, 1000*sum/n, 100*sum/elapsed.Seconds(), 100*wait/elapsed.Seconds())
}

// StageConfig configures what Dedup and Aggregate do alike.
type StageConfig struct {
	// Partitions of every benchmark topic.
	Partitions int32
	// CommitInterval of every stage measured.
	CommitInterval time.Duration
	// LatencyRate is the events per second sent during the latency phase,
	// LatencyFor its length.
	LatencyRate int
	LatencyFor  time.Duration
	// StateDir is where the Pebble state goes (removed afterwards).
	// Default: a new temporary directory.
	StateDir string
	// Keep keeps the benchmark topics.
	Keep bool
	// Rounds; each measures (a), (b) and the stage once, in a rotating
	// order.
	Rounds int
	// CPUProfile, when set, receives a CPU profile of the last round's
	// run of the stage (bench aggregate: of the aggregator with
	// entitlements; the one without goes to CPUProfile+".without").
	CPUProfile string
}

func (c *StageConfig) validate() error {
	return errors.Join(positive("partitions", int(c.Partitions)), positive("rounds", c.Rounds),
		positive("latency-rate", c.LatencyRate), positiveDuration("latency-for", c.LatencyFor))
}

// stageBench is what Dedup and Aggregate share: where the state goes, the
// topics' names and layout, what the benchmark leaves behind, and the
// last round's stage, which stays up for the phases after the rounds.
type stageBench struct {
	env            *Env
	left           *leftovers
	dir            string
	names          topics.Names // Prefix is the benchmark's own
	layout         topics.Layout
	commitInterval time.Duration
	live           *running
}

// newStageBench prepares a benchmark of stage: its state goes under
// cfg.StateDir (a new temporary directory when empty; removed afterwards),
// its topics are named with the prefix prefix<unix time>.
func newStageBench(env *Env, stage, prefix string, cfg StageConfig, validate func() error) (*stageBench, error) {
	left, err := newLeftovers(env, validate)
	if err != nil {
		return nil, err
	}
	dir := cfg.StateDir
	if dir == "" {
		d, err := os.MkdirTemp("", "meterline-bench-"+stage+"-")
		if err != nil {
			_ = left.remove()
			return nil, err
		}
		dir = d
	}
	left.keepTopics = cfg.Keep
	left.dir(dir)
	names := env.Topics
	names.Prefix = fmt.Sprintf("%s%s%d.", env.Topics.Prefix, prefix, time.Now().Unix())
	layout := topics.DefaultLayout()
	layout.Partitions = cfg.Partitions
	return &stageBench{env: env, left: left, dir: dir, names: names, layout: layout, commitInterval: cfg.CommitInterval}, nil
}

// close stops the stage left up, if any, and deletes what the benchmark
// made.
func (s *stageBench) close() error {
	_ = s.live.stop()
	return s.left.remove()
}

// stopLive stops the stage left up and returns its error.
func (s *stageBench) stopLive() error {
	err := s.live.stop()
	s.live = nil
	return err
}

// streamConfig is the stream config of a stage measured, its group
// remembered for deletion.
func (s *stageBench) streamConfig(group, instance string) stream.Config {
	s.left.group(group)
	return s.env.streamConfig(s.dir, group, instance, s.commitInterval)
}

// measurePass measures a passthrough under cfg from the start of its
// input until it has copied want records to out.
func (s *stageBench) measurePass(ctx context.Context, name string, cfg stream.Config, out string, state stateShape, want int) (Result, error) {
	proc := &passthrough{out: out, state: state}
	rt, err := stream.New(cfg, proc)
	if err != nil {
		return Result{}, err
	}
	sp, r, err := measureRun(ctx, rt.Run, proc.n.Load, int64(want))
	if err == nil {
		err = r.stop()
	}
	if err != nil {
		return Result{}, fmt.Errorf("%s: %w", name, err)
	}
	return Result{Name: name, Count: sp.count, Elapsed: sp.elapsed, Startup: sp.startup,
		Detail: sp.startupNote() + "; " + txnStats(cfg.Registerer.(prometheus.Gatherer), sp.elapsed)}, nil
}

// measureStage measures a stage's run from the start of its input until
// count reaches want (span), and leaves it up (s.live): the caller reads its
// metrics, then stops it (stopLive) unless it is the last round's. With
// profile, the last round's CPU profile is written there.
func (s *stageBench) measureStage(ctx context.Context, run func(context.Context) error, count func() int64, want int, last bool, profile string) (span, error) {
	if !last {
		profile = ""
	}
	stopProfile, err := startProfile(profile)
	if err != nil {
		return span{}, err
	}
	defer stopProfile()
	sp, r, err := measureRun(ctx, run, count, int64(want))
	s.live = r
	return sp, err
}

// printRates prints the median rates of (a), (b) and the stage
// (contenders 0, 1 and 2) and the stage's ratios to both baselines.
func printRates(w io.Writer, res *Results) {
	for i := range 2 {
		fmt.Fprintf(w, "%-46s %9.0f events/s\n", res.Runs[i][0].Name, res.Median(i))
	}
	a, b, st := res.Median(0), res.Median(1), res.Median(2)
	fmt.Fprintf(w, "%-46s %9.0f events/s  (%.2f of (b), %.2f of (a))\n", res.Runs[2][0].Name, st, st/b, st/a)
}
