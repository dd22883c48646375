package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/aggregator"
	"github.com/meterline/meterline/ingest"
	"github.com/meterline/meterline/internal/cegen"
	"github.com/meterline/meterline/producer"
)

// IngestConfig configures Ingest.
type IngestConfig struct {
	// Events per run; a multiple of Batch.
	Events int
	// Batch is the number of CloudEvents per request.
	Batch int
	// Connections is the number of keep-alive client connections.
	Connections int
	// Partitions of each run's topic.
	Partitions int32
	// Rounds; each runs the baseline and the ingest once, in alternating
	// order.
	Rounds int
	// LatencyFor is the length of the latency phase, at half the ingest's
	// median rate.
	LatencyFor time.Duration
	// Linger is the producer linger of the ingest and the baseline; 0:
	// the ingest's default.
	Linger time.Duration
	// LatencyRate is the rate of the latency phase in events per second;
	// 0: half the ingest's median rate.
	LatencyRate float64
	// JSON prints the result as JSON too.
	JSON bool
}

// Validate reports every problem with the config.
func (c *IngestConfig) Validate() error {
	errs := []error{positive("events", c.Events), positive("batch", c.Batch), positive("connections", c.Connections),
		positive("partitions", int(c.Partitions)), positive("rounds", c.Rounds), positiveDuration("latency-for", c.LatencyFor)}
	if c.LatencyRate < 0 {
		errs = append(errs, fmt.Errorf("bench: latency-rate %g must not be negative", c.LatencyRate))
	}
	if c.Batch > 0 && c.Events%c.Batch != 0 {
		errs = append(errs, fmt.Errorf("bench: events (%d) must be a multiple of batch (%d)", c.Events, c.Batch))
	}
	return errors.Join(errs...)
}

// ingestMeters: one meter per CloudEvent type, so that Kafka records and
// events are one to one.
const ingestMeters = `meters:
  - {name: tokens, event_type: prompt, value_property: $.tokens, group_by: {model: $.model}}
`

// ingestBatch is request r of bench ingest's input: batch CloudEvents of
// type prompt.
func ingestBatch(r, batch, customers int, now time.Time) []byte {
	return cegen.Batch(batch, func(k int) cegen.Event {
		i := r*batch + k
		return cegen.Event{ID: "req-" + strconv.Itoa(i), Source: "bench", Type: "prompt",
			Subject: fmt.Sprintf("cust-%05d", i%customers),
			Time:    now.Add(-30 * time.Minute).Add(time.Duration(i%1_000_000) * time.Millisecond).UTC().Format(time.RFC3339Nano),
			Data:    map[string]any{"tokens": 1 + i%100, "model": []string{"m1", "m2", "m3"}[i%3]}}
	})
}

// Ingest measures `meterline ingest` (POST /api/v1/events, batches of
// CloudEvents from keep-alive connections) against a minimal HTTP handler
// that reads the same bodies and produces the same events' records,
// pre-encoded, with the same producer settings, each run into a topic of
// its own. Both are counted by the records in Kafka, not by responses,
// and each run's CPU time per record is reported (this process's: the
// clients', the handler's and its producer's; the broker's is not), which
// a loaded machine disturbs less than the rates. Then it measures the
// latency of a success at half the ingest's median rate.
func Ingest(ctx context.Context, env *Env, cfg IngestConfig) (err error) {
	left, err := newLeftovers(env, cfg.Validate)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, left.remove()) }()
	b := &ingestBench{env: env, cfg: cfg, left: left}
	now := time.Now()
	cat, err := aggregator.ParseMeters([]byte(ingestMeters))
	if err != nil {
		return err
	}
	b.meters = cat
	requests := cfg.Events / cfg.Batch
	env.say("building %d requests of %d CloudEvents", requests, cfg.Batch)
	b.bodies = make([][]byte, requests)
	for r := range b.bodies {
		b.bodies[r] = ingestBatch(r, cfg.Batch, 10_000, now)
	}
	// The baseline's records are the ones the ingest writes.
	if b.recs, err = b.preEncode(); err != nil {
		return err
	}
	keys := fmt.Sprintf("%sbench-keys-%d", env.Topics.Prefix, now.UnixNano())
	compact := "compact"
	if err := left.createTopic(ctx, keys, 1, map[string]*string{"cleanup.policy": &compact}); err != nil {
		return err
	}
	b.keysTopic = keys
	// The quota gate reads an empty balances topic of its own: its view
	// is loaded, and holds nobody.
	b.balancesTopic = fmt.Sprintf("%sbench-balances-%d", env.Topics.Prefix, now.UnixNano())
	if err := left.createTopic(ctx, b.balancesTopic, 1, map[string]*string{"cleanup.policy": &compact}); err != nil {
		return err
	}
	cl, err := env.client()
	if err != nil {
		return err
	}
	defer cl.Close()
	if b.warm, err = env.client(kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.RequiredAcks(kgo.AllISRAcks())); err != nil {
		return err
	}
	defer b.warm.Close()
	if _, b.token, err = ingest.NewAdmin(cl, keys).CreateKey(ctx, ingest.KeySpec{Tenant: "bench", Customers: []string{"*"}}); err != nil {
		return err
	}

	rounds := Rounds{N: cfg.Rounds, Unit: "events", Progress: env.say, HoldLast: true}
	res, err := rounds.Run(ctx, ingestBaseline{b}, ingestPath{b})
	if err != nil {
		return err
	}
	mb, mi := res.Median(0), res.Median(1)
	cb, ci := median(b.cpu[0]), median(b.cpu[1])
	rate := mi / 2
	if cfg.LatencyRate > 0 {
		rate = cfg.LatencyRate
	}
	env.say("latency: %.0f events/s (half the ingest's median), the baseline and the ingest in turn, %s each", rate, cfg.LatencyFor)
	b.traceMu.Lock()
	b.tracing, b.trace = true, map[string][]time.Duration{}
	b.traceMu.Unlock()
	lat, err := b.latency(ctx, rate)
	if err != nil {
		return err
	}
	fmt.Fprintf(env.Out, "events: %d per run in requests of %d from %d keep-alive connections, %d partitions, %d rounds (medians; Kafka records counted)\n",
		cfg.Events, cfg.Batch, cfg.Connections, cfg.Partitions, cfg.Rounds)
	writeAligned(env.Out,
		"baseline minimal handler:", fmt.Sprintf("%.0f events/s", mb),
		"meterline ingest:", fmt.Sprintf("%.0f events/s", mi),
		"ratio (per round, median):", fmt.Sprintf("%.2f", res.RoundRatio(1, 0)),
		"CPU per record (this process):", fmt.Sprintf("baseline %.1f µs, ingest %.1f µs (medians; ratio %.2f)", cb, ci, cb/ci),
		fmt.Sprintf("latency of a success at %.0f events/s:", rate), fmt.Sprintf("(in %d alternating segments; load average %s before, %s after)", latencySegments, lat.load[0], lat.load[1]),
		"  baseline minimal handler:", pq(lat.baseline),
		"  meterline ingest:", pq(lat.ingest),
		"  ingest handler total:", pq(lat.stages["total"]),
		"  ingest stage read:", pq(lat.stages["read"]),
		"  ingest stage parse:", pq(lat.stages["parse"]),
		"  ingest stage enqueue:", pq(lat.stages["enqueue"]),
		"  ingest stage ack:", pq(lat.stages["ack"]),
		"  baseline's wait for the ack:", pq(lat.stages["baseline ack"]))
	if !cfg.JSON {
		return nil
	}
	ms := func(d time.Duration) float64 { return d.Seconds() * 1000 }
	return json.NewEncoder(env.Out).Encode(map[string]any{"baseline_median": mb, "ingest_median": mi, "ratio": res.RoundRatio(1, 0),
		"baseline_cpu_us_per_record": cb, "ingest_cpu_us_per_record": ci,
		"latency_rate": rate, "p50_ms": ms(lat.ingest.p50), "p99_ms": ms(lat.ingest.p99),
		"baseline_p50_ms": ms(lat.baseline.p50), "baseline_p99_ms": ms(lat.baseline.p99), "load_average": lat.load,
		"baseline": res.JSON(0, "minimal-handler"), "ingest": res.JSON(1, "meterline-ingest")})
}

type ingestBench struct {
	env       *Env
	cfg       IngestConfig
	left      *leftovers
	meters    *aggregator.Catalog
	bodies    [][]byte
	recs      [][]*kgo.Record // per request, the records the ingest writes
	keysTopic string
	// warm writes the warm-up records (topic): acks=all, each to the
	// partition it names.
	warm *kgo.Client
	// cpu is the process's CPU time per record of each run, in µs: the
	// baseline's (0) and the ingest's (1), in round order.
	cpu [2][]float64
	// balancesTopic is the quota gate's, empty.
	balancesTopic string
	token         string
	// ingest is the ingest of the last round, kept up for the latency
	// phase (Rounds.HoldLast), with its topic.
	ingest      *ingest.Server
	ingestStop  func() error
	ingestTopic string
	// trace holds the stage timings of the kept ingest's requests,
	// recorded from the latency phase on (tracing).
	traceMu sync.Mutex
	tracing bool
	trace   map[string][]time.Duration
}

// recordBaselineAck records the time the baseline waited for Kafka's
// acknowledgement of a request's records, as the ingest's ack stage.
func (b *ingestBench) recordBaselineAck(d time.Duration) {
	b.traceMu.Lock()
	defer b.traceMu.Unlock()
	if b.tracing {
		b.trace["baseline ack"] = append(b.trace["baseline ack"], d)
	}
}

// record is the kept ingest's ingest.Config.Trace.
func (b *ingestBench) record(t ingest.Timings) {
	b.traceMu.Lock()
	defer b.traceMu.Unlock()
	if !b.tracing {
		return
	}
	for name, d := range map[string]time.Duration{"read": t.Read, "parse": t.Parse, "enqueue": t.Enqueue, "ack": t.Ack, "total": t.Total} {
		b.trace[name] = append(b.trace[name], d)
	}
}

// ingestConfig is the config of the measured ingest on topic.
func (b *ingestBench) ingestConfig(topic string) ingest.Config {
	cfg := ingest.Config{Addr: "127.0.0.1:0", Kafka: b.env.Kafka, ClientOptions: b.env.ClientOptions, Topic: topic,
		KeysTopic: b.keysTopic, BalancesTopic: b.balancesTopic, Meters: b.meters, MaxEvents: b.cfg.Batch, MaxBodyBytes: 16 << 20,
		Logger: b.env.Logger, Registerer: prometheus.NewRegistry(), Trace: b.record, Linger: b.cfg.Linger,
		// Every connection posts with the bench's one key: none waits
		// for a slot, as no request is refused. One tenant holds at most
		// half the slots (its fair share of those free), so there are
		// twice as many as connections.
		MaxInFlight: max(ingest.DefaultMaxInFlight, 2*b.cfg.Connections), MaxInFlightPerTenant: max(ingest.DefaultMaxInFlightPerTenant, b.cfg.Connections)}
	cfg.EnsureDefaults()
	return cfg
}

// preEncode returns the records the ingest writes for each request: the
// events mapped by the meters file and encoded by the producer.
func (b *ingestBench) preEncode() ([][]*kgo.Record, error) {
	cfg := b.ingestConfig("")
	popts, err := cfg.ProducerOptions()
	if err != nil {
		return nil, err
	}
	p, err := producer.New(popts...)
	if err != nil {
		return nil, err
	}
	defer p.Close()
	out := make([][]*kgo.Record, len(b.bodies))
	for r, body := range b.bodies {
		var evs []struct {
			ID, Source, Subject, Time string
			Data                      struct {
				Tokens int64
				Model  string
			}
		}
		if err := json.Unmarshal(body, &evs); err != nil {
			return nil, err
		}
		for _, ce := range evs {
			t, _ := time.Parse(time.RFC3339Nano, ce.Time)
			rec, err := p.Record(producer.Event{EventID: producer.EventID(ce.Source, ce.ID), CustomerID: ce.Subject, Meter: "tokens",
				Quantity: ce.Data.Tokens, EventTime: t, Source: ce.Source, Properties: map[string]string{"model": ce.Data.Model}})
			if err != nil {
				return nil, err
			}
			out[r] = append(out[r], rec)
		}
	}
	return out, nil
}

// topic creates the topic of one run and writes one record to each of
// its partitions (acks=all) before the run's clock starts. A partition
// just created may refuse the first records for a while although the
// metadata shows its leader; the producer then looks again only after its
// metadata's minimum age (5 s by default), so a run that started on a
// fresh topic stalled for seconds on its clock, whichever contender it
// was. countRecords does not count these records.
func (b *ingestBench) topic(ctx context.Context, what string, round int) (string, error) {
	name := fmt.Sprintf("%sbench-%s-%d-%d", b.env.Topics.Prefix, what, time.Now().UnixNano(), round)
	lat := "LogAppendTime"
	if err := b.left.createTopic(ctx, name, b.cfg.Partitions, map[string]*string{"message.timestamp.type": &lat}); err != nil {
		return name, err
	}
	for p := range b.cfg.Partitions {
		r := &kgo.Record{Topic: name, Partition: p, Value: []byte("bench warm-up")}
		if err := b.warm.ProduceSync(ctx, r).FirstErr(); err != nil {
			return name, fmt.Errorf("bench: warm-up record in %s/%d: %w", name, p, err)
		}
	}
	return name, nil
}

// post sends every body from Connections keep-alive connections and
// returns how long it took until the last answer, and the CPU time the
// process spent meanwhile (the clients', the server's and its producer's);
// any answer but success is an error.
func (b *ingestBench) post(ctx context.Context, url string, header func(r int, h http.Header)) (elapsed, cpu time.Duration, err error) {
	var next atomic.Int64
	var wg sync.WaitGroup
	errc := make(chan error, b.cfg.Connections)
	cpu0 := processCPU()
	start := time.Now()
	for c := 0; c < b.cfg.Connections; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			hc := keepAliveClient()
			defer hc.CloseIdleConnections()
			for ctx.Err() == nil {
				r := int(next.Add(1) - 1)
				if r >= len(b.bodies) {
					return
				}
				if err := postOne(ctx, hc, url, b.bodies[r], func(h http.Header) { header(r, h) }); err != nil {
					errc <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	elapsed, cpu = time.Since(start), processCPU()-cpu0
	close(errc)
	if err := <-errc; err != nil {
		return 0, 0, err
	}
	return elapsed, cpu, ctx.Err()
}

// processCPU is the CPU time (user and system) the process has used; 0
// where the system does not say.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// cpuResult records a run's CPU time per record for contender i (0: the
// baseline, 1: the ingest) and returns the run's result with it.
func (b *ingestBench) cpuResult(i int, name string, n int, elapsed, cpu time.Duration) Result {
	us := cpu.Seconds() * 1e6 / float64(n)
	b.cpu[i] = append(b.cpu[i], us)
	return Result{Name: name, Count: n, Elapsed: elapsed, Detail: fmt.Sprintf("; %.1f µs CPU per record", us)}
}

func keepAliveClient() *http.Client {
	return &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1, MaxConnsPerHost: 1,
		DialContext: (&net.Dialer{Timeout: 5 * time.Second}).DialContext}}
}

func postOne(ctx context.Context, hc *http.Client, url string, body []byte, header func(http.Header)) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/cloudevents-batch+json")
	header(req.Header)
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	rb, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		return fmt.Errorf("bench: %s answered %d: %s", url, resp.StatusCode, rb)
	}
	return nil
}

// countRecords returns the number of records the run wrote to topic (the
// sum of its end offsets, less the warm-up record of each partition; the
// topics are written without transactions).
func (b *ingestBench) countRecords(ctx context.Context, topic string) (int, error) {
	ends, err := b.left.adm.ListEndOffsets(ctx, topic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return 0, fmt.Errorf("bench: end offsets of %s: %w", topic, err)
	}
	n := 0
	ends.Each(func(o kadm.ListedOffset) { n += int(o.Offset) - 1 }) // less the warm-up record (topic)
	return n, nil
}

// pq formats the quantiles of a latency.
func pq(l latencies) string {
	return fmt.Sprintf("p50 %s  p99 %s  (%d requests)", l.p50.Round(100*time.Microsecond), l.p99.Round(100*time.Microsecond), l.n)
}

// ingestPath runs `meterline ingest`'s server.
type ingestPath struct{ b *ingestBench }

func (r ingestPath) Run(ctx context.Context, round int, last bool) (Result, error) {
	b := r.b
	topic, err := b.topic(ctx, "ingest", round)
	if err != nil {
		return Result{}, err
	}
	srv, err := ingest.New(b.ingestConfig(topic))
	if err != nil {
		return Result{}, err
	}
	sctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(sctx) }()
	stopSrv := func() error { stop(); return <-done }
	for srv.Ready() != nil {
		select {
		case err := <-done:
			return Result{}, fmt.Errorf("bench: ingest: %w", err)
		case <-time.After(10 * time.Millisecond):
		}
	}
	elapsed, cpu, err := b.post(ctx, srv.URL()+"/api/v1/events", func(_ int, h http.Header) { h.Set("Authorization", "Bearer "+b.token) })
	if err != nil {
		_ = stopSrv()
		return Result{}, err
	}
	n, err := b.countRecords(ctx, topic)
	if err != nil || n != b.cfg.Events {
		_ = stopSrv()
		return Result{}, errors.Join(err, fmt.Errorf("bench: the ingest wrote %d records, want %d", n, b.cfg.Events))
	}
	if last {
		b.ingest, b.ingestStop, b.ingestTopic = srv, stopSrv, topic
	} else {
		if err := stopSrv(); err != nil {
			return Result{}, err
		}
		b.left.drop(things{topics: []string{topic}})
	}
	return b.cpuResult(1, "meterline ingest", n, elapsed, cpu), nil
}

// ingestBaseline is the least an HTTP front of Kafka does: read the body,
// produce the request's records, pre-encoded, with the ingest's producer
// settings, wait for their acknowledgement, answer 204.
type ingestBaseline struct{ b *ingestBench }

func (r ingestBaseline) Run(ctx context.Context, round int, _ bool) (Result, error) {
	b := r.b
	topic, err := b.topic(ctx, "base", round)
	if err != nil {
		return Result{}, err
	}
	defer b.left.drop(things{topics: []string{topic}})
	url, stop, err := b.startBaseline(ctx, topic)
	if err != nil {
		return Result{}, err
	}
	defer stop()
	elapsed, cpu, err := b.post(ctx, url, func(r int, h http.Header) { h.Set("X-Request", strconv.Itoa(r)) })
	if err != nil {
		return Result{}, err
	}
	n, err := b.countRecords(ctx, topic)
	if err != nil || n != b.cfg.Events {
		return Result{}, errors.Join(err, fmt.Errorf("bench: the baseline wrote %d records, want %d", n, b.cfg.Events))
	}
	return b.cpuResult(0, "baseline (minimal handler)", n, elapsed, cpu), nil
}

// startBaseline serves the baseline handler, producing into topic, and
// returns its URL and how to stop it. A request names its body by the
// X-Request header.
func (b *ingestBench) startBaseline(ctx context.Context, topic string) (string, func(), error) {
	cfg := b.ingestConfig(topic)
	popts, err := cfg.ProducerOptions()
	if err != nil {
		return "", nil, err
	}
	cl, err := kgo.NewClient(producer.ClientOptions(popts...)...)
	if err != nil {
		return "", nil, err
	}
	if err := cl.Ping(ctx); err != nil {
		cl.Close()
		return "", nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		cl.Close()
		return "", nil, err
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if _, err := io.ReadAll(req.Body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		i, err := strconv.Atoi(req.Header.Get("X-Request"))
		if err != nil || i < 0 || i >= len(b.recs) {
			http.Error(w, "no X-Request", http.StatusBadRequest)
			return
		}
		var wg sync.WaitGroup
		var failed atomic.Bool
		for _, rec := range b.recs[i] {
			wg.Add(1)
			cl.Produce(context.Background(), &kgo.Record{Topic: topic, Key: rec.Key, Value: rec.Value}, func(_ *kgo.Record, err error) {
				if err != nil {
					failed.Store(true)
				}
				wg.Done()
			})
		}
		enqueued := time.Now()
		wg.Wait()
		b.recordBaselineAck(time.Since(enqueued))
		if failed.Load() {
			http.Error(w, "not acknowledged", http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})}
	go func() { _ = srv.Serve(ln) }()
	return "http://" + ln.Addr().String() + "/", func() { _ = srv.Close(); cl.Close() }, nil
}

// latencyResult is the latency phase's: the quantiles of a success of
// the baseline and of the ingest at the same rate, in alternating
// segments, and of the ingest's stages (ingest.Timings).
type latencyResult struct {
	rate             float64
	baseline, ingest latencies
	stages           map[string]latencies // read, parse, enqueue, ack
	load             [2]string            // /proc/loadavg before and after
}

// latencySegments is the number of segments of the latency phase: the
// baseline and the ingest take turns, so that a change of the machine's
// load falls on both.
const latencySegments = 4

// latency sends requests at rate events per second to a baseline handler
// and to the last round's ingest, in alternating segments of LatencyFor
// / 2 (LatencyFor each in all), and returns the quantiles of the time to
// a success of each, and of the ingest's stages.
func (b *ingestBench) latency(ctx context.Context, rate float64) (latencyResult, error) {
	if b.ingest == nil {
		return latencyResult{}, errors.New("bench: no ingest kept up for the latency phase")
	}
	defer func() {
		_ = b.ingestStop()
		b.left.drop(things{topics: []string{b.ingestTopic}})
	}()
	res := latencyResult{rate: rate, stages: map[string]latencies{}}
	topic, err := b.topic(ctx, "base-latency", 0)
	if err != nil {
		return res, err
	}
	defer b.left.drop(things{topics: []string{topic}})
	baseURL, stopBase, err := b.startBaseline(ctx, topic)
	if err != nil {
		return res, err
	}
	defer stopBase()
	// The baseline's producer is new: its first requests wait for its
	// producer ID and the topic's metadata, which the kept ingest did
	// long ago. They are not measured.
	for r := range b.cfg.Connections {
		if err := postOne(ctx, http.DefaultClient, baseURL, b.bodies[r%len(b.bodies)], func(h http.Header) { h.Set("X-Request", strconv.Itoa(r%len(b.bodies))) }); err != nil {
			return res, err
		}
	}
	res.load[0] = loadAverage()
	var base, ing []time.Duration
	for seg := range latencySegments {
		var lats []time.Duration
		if seg%2 == 0 {
			lats, err = b.latencyOf(ctx, baseURL, rate, func(r int, h http.Header) { h.Set("X-Request", strconv.Itoa(r)) })
			base = append(base, lats...)
		} else {
			lats, err = b.latencyOf(ctx, b.ingest.URL()+"/api/v1/events", rate, func(int, http.Header) {})
			ing = append(ing, lats...)
		}
		if err != nil {
			return res, err
		}
	}
	res.load[1] = loadAverage()
	if res.baseline, err = quantiles(base, "answer of the baseline"); err != nil {
		return res, err
	}
	if res.ingest, err = quantiles(ing, "answer of the ingest"); err != nil {
		return res, err
	}
	b.traceMu.Lock()
	defer b.traceMu.Unlock()
	for name, ds := range b.trace {
		if res.stages[name], err = quantiles(ds, name); err != nil {
			return res, err
		}
	}
	return res, nil
}

// loadAverage is the first three fields of /proc/loadavg; "?" where
// there is none.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); err == nil && len(f) >= 3 {
		return strings.Join(f[:3], " ")
	}
	return "?"
}

// latencyOf sends requests to url at rate events per second (open loop,
// from the keep-alive connections) for LatencyFor / 2 and returns the
// time to each success. header adds request r's headers.
func (b *ingestBench) latencyOf(ctx context.Context, url string, rate float64, header func(r int, h http.Header)) ([]time.Duration, error) {
	perSec := rate / float64(b.cfg.Batch)
	if perSec <= 0 {
		return nil, errors.New("bench: no rate for the latency phase")
	}
	interval := time.Duration(float64(time.Second) / perSec)
	total := max(int(b.cfg.LatencyFor.Seconds()*perSec)/2, 1)
	clients := make(chan *http.Client, b.cfg.Connections)
	for range b.cfg.Connections {
		clients <- keepAliveClient()
	}
	var mu sync.Mutex
	var lats []time.Duration
	var wg sync.WaitGroup
	errc := make(chan error, 1)
	start := time.Now()
	for i := 0; i < total && ctx.Err() == nil; i++ {
		// Each request is timed from when it was due, so that a wait for a
		// free connection counts too.
		t0 := start.Add(time.Duration(i) * interval)
		if d := time.Until(t0); d > 0 {
			time.Sleep(d)
		}
		hc := <-clients
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { clients <- hc }()
			r := i % len(b.bodies)
			err := postOne(ctx, hc, url, b.bodies[r], func(h http.Header) {
				h.Set("Authorization", "Bearer "+b.token)
				header(r, h)
			})
			if err != nil {
				select {
				case errc <- err:
				default:
				}
				return
			}
			mu.Lock()
			lats = append(lats, time.Since(t0))
			mu.Unlock()
		}()
	}
	wg.Wait()
	for range b.cfg.Connections {
		(<-clients).CloseIdleConnections()
	}
	select {
	case err := <-errc:
		return nil, err
	default:
	}
	return lats, ctx.Err()
}
