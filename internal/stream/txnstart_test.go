package stream_test

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/meterline/meterline/internal/kafka"
	"github.com/meterline/meterline/internal/session"
	"github.com/meterline/meterline/internal/stream"
	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/internal/topics"
)

// TestRealFreshStartNoSequenceRejects starts a transactional stage on
// fresh topics 20 times and checks how each transaction begins.
//
// Under transactions v2 (KIP-890) a commit's EndTxn returns once the
// coordinator has decided, and the commit markers are written after. A
// produce of the next transaction that reaches a partition leader before
// they are all written is held (add.partitions.to.txn.retry.backoff.max.ms,
// 100 ms by default) and then refused with CONCURRENT_TRANSACTIONS. kgo
// pipelines up to five produce requests per broker, so the requests behind
// the refused first batch of each partition (sequence 0) arrive with
// sequences the partition has not seen, and the broker refuses those too:
// "OutOfOrderSequenceException … Expected sequence 0 for transactions v2
// idempotent producer with no existing state". kgo resends only after its
// next metadata refresh, up to MetadataMinAge (5 s) later: the stall of a
// fresh stage's second commit. The runtime holds a transaction's records
// back until the coordinator has finished the previous transaction.
//
// The checks are the mechanism, not durations, per start:
//   - no produce request of a transaction is written while the coordinator
//     still reports the previous one as PrepareCommit or PrepareAbort: an
//     observer describes the transactional ID right after every produce
//     request the stage writes (see earlyProduces). This does not depend on
//     the markers outlasting the leaders' 100 ms retry, so it catches the
//     early produce that usually goes unnoticed;
//   - no such refusal in the broker's log for the start's topics (it
//     appears only when the markers took longer than the leader's retry);
//   - one InitProducerID (the producer ID is never re-initialised) and no
//     session restart.
func TestRealFreshStartNoSequenceRejects(t *testing.T) {
	brokers := testenv.RealKafka(t)
	serverLog := testenv.RealKafkaServerLog(t)
	began := time.Now()
	const (
		starts  = 20
		inN     = 4
		outN    = 16
		records = 16_000
		txns    = 8 // at least: MaxBatchRecords is records/txns
	)
	runs := make([]freshStart, starts)
	var ins, outs []string
	for i := range runs {
		base := fmt.Sprintf("fresh%d", i+1)
		runs[i] = freshStart{
			in:        testenv.Name(t, base+"-in"),
			out:       testenv.Name(t, base+"-out"),
			changelog: testenv.Name(t, base+"-changelog"),
			group:     testenv.Name(t, base+"-group"),
		}
		ins = append(ins, runs[i].in, runs[i].changelog)
		outs = append(outs, runs[i].out)
	}
	// All topics at once: created one by one they took over a second each.
	createTopics(t, brokers, inN, ins...)
	createTopics(t, brokers, outN, outs...)
	for i := range runs {
		runs[i].run(t, brokers, i+1, outN, records, records/txns)
	}

	refusals := testenv.KafkaServerLogLines(t, serverLog, began, "Expected sequence 0 for transactions v2")
	var failed int
	for i := range runs {
		r := &runs[i]
		var refused []string
		for _, l := range refusals {
			if strings.Contains(l, " in partition "+r.out+"-") || strings.Contains(l, " in partition "+r.changelog+"-") {
				refused = append(refused, l)
			}
		}
		ms := make([]string, len(r.commits))
		for j, d := range r.commits {
			ms[j] = fmt.Sprint(d.Round(time.Millisecond))
		}
		t.Logf("start %2d: %d early produce requests, %d refusals, %d InitProducerID, %v restarts; copied in %s, commits %s",
			i+1, r.early, len(refused), r.initProducerIDs, r.restarts, r.elapsed.Round(time.Millisecond), strings.Join(ms, " "))
		if r.early > 0 || len(refused) > 0 || r.initProducerIDs != 1 || r.restarts != 0 {
			failed++
			for _, l := range refused[:min(2, len(refused))] {
				t.Logf("  broker: %s", l)
			}
			if l := r.logs.String(); l != "" {
				t.Logf("  the stage's warnings:\n%s", testenv.Tail(l, 20))
			}
			if r.timeline != "" {
				t.Logf("  timeline of the start (ms from Run):\n%s", r.timeline)
			}
		}
	}
	if failed > 0 {
		t.Errorf("%d of %d starts on fresh topics produced before the coordinator finished the previous transaction, had the broker refuse a sequence, re-initialised the producer ID or restarted the session (want none)", failed, starts)
	}
}

// copyProc copies every input record to the output topic, partitioned by
// key, and keeps the record's value in state: a transaction writes every
// output partition and a changelog partition per input partition, as dedup
// does.
type copyProc struct {
	out     string
	outN    uint32
	emitted atomic.Int64

	mu      sync.Mutex
	flushes []time.Time // when commits began: Flush runs in commit, before End
}

func (c *copyProc) Open(int32, *stream.PartitionState) (stream.Partition, error) { return c, nil }

func (c *copyProc) Process(tx *stream.Tx, recs []*kgo.Record) error {
	for _, r := range recs {
		h := fnv.New32a()
		h.Write(r.Key)
		tx.Emit(&kgo.Record{Topic: c.out, Partition: int32(h.Sum32() % c.outN), Key: r.Key, Value: r.Value})
		tx.Put(r.Key, r.Value)
	}
	c.emitted.Add(int64(len(recs)))
	return nil
}

// Flush records when a commit began: time.Now runs before the commit's
// EndTxn is written, however late the goroutine gets to run.
func (c *copyProc) Flush(*stream.Tx) error {
	now := time.Now()
	c.mu.Lock()
	c.flushes = append(c.flushes, now)
	c.mu.Unlock()
	return nil
}

func (c *copyProc) Punctuate(*stream.Tx) error { return nil }
func (c *copyProc) Close()                     {}

// wire records when the stage's client wrote Produce requests and read
// EndTxn responses, and counts its InitProducerID requests. A hook's
// time.Now runs after the write or read, possibly much later on a busy
// machine; earlyProduces only relies on them being late, never early.
type wire struct {
	after func() // called after each produce request written and EndTxn response read

	mu              sync.Mutex
	produces        []time.Time
	offsetCommits   []time.Time // TxnOffsetCommit requests written
	endWrites       []time.Time
	endReads        []time.Time
	initProducerIDs int64
}

func (w *wire) OnBrokerWrite(_ kgo.BrokerMetadata, key int16, _ int, _, _ time.Duration, err error) {
	now := time.Now()
	if err != nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	switch kmsg.Key(key) {
	case kmsg.Produce:
		w.produces = append(w.produces, now)
		w.after()
	case kmsg.TxnOffsetCommit:
		w.offsetCommits = append(w.offsetCommits, now)
	case kmsg.EndTxn:
		w.endWrites = append(w.endWrites, now)
	case kmsg.InitProducerID:
		w.initProducerIDs++
	}
}

func (w *wire) OnBrokerRead(_ kgo.BrokerMetadata, key int16, _ int, _, _ time.Duration, err error) {
	now := time.Now()
	if err == nil && kmsg.Key(key) == kmsg.EndTxn {
		w.mu.Lock()
		w.endReads = append(w.endReads, now)
		w.mu.Unlock()
		w.after()
	}
}

// observation is what DescribeTransactions returned: the coordinator was
// in state at some moment between sent and received.
type observation struct {
	sent, received time.Time
	state          string
	epoch          int16
}

// observer describes the transactional ID right after each produce
// request the stage writes and each EndTxn response it reads (the wire
// hook calls after), so that some description is processed by the
// coordinator after each, however slow the machine.
type observer struct {
	adm *kadm.Client
	id  string

	wg  sync.WaitGroup
	mu  sync.Mutex
	obs []observation
}

func (o *observer) after() {
	o.wg.Add(1)
	go func() {
		defer o.wg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		sent := time.Now()
		ds, err := o.adm.DescribeTransactions(ctx, o.id)
		if err != nil {
			return
		}
		if d, ok := ds[o.id]; ok && d.Err == nil {
			o.mu.Lock()
			o.obs = append(o.obs, observation{sent: sent, received: time.Now(), state: d.State, epoch: d.ProducerEpoch})
			o.mu.Unlock()
		}
	}()
}

// observations returns what the descriptions saw, in the order they were
// sent, once all have been answered.
func (o *observer) observations() []observation {
	o.wg.Wait()
	o.mu.Lock()
	defer o.mu.Unlock()
	slices.SortFunc(o.obs, func(a, b observation) int { return a.sent.Compare(b.sent) })
	return o.obs
}

// earlyProduces counts the produce requests written while the coordinator
// still finished the transaction before theirs.
//
// Under transactions v2 every EndTxn bumps the producer epoch, and the
// coordinator reports the new epoch X from then on: PrepareCommit (or
// PrepareAbort) X while it writes the markers, CompleteCommit X, then
// Ongoing X for the next transaction, whose records carry epoch X, until
// the next EndTxn moves it to Prepare… X+1. So a produce request of the
// transaction after the k-th EndTxn is early if a description sent after
// it was written still saw Prepare… with that EndTxn's epoch X_k. X_k is
// the epoch of a description sent after the EndTxn's response and answered
// before the next EndTxn can have been written; without one, the
// transaction is not judged.
//
// Every time errs towards not counting. A hook runs after its write or
// read, a description's sent time precedes its processing. The next EndTxn
// is written after the next transaction's TxnOffsetCommit was answered,
// whose write hook runs before its answer is read (the first one after
// the k-th EndTxn's response, if it precedes the next EndTxn's response,
// else the next commit's start, taken before its EndTxn).
func earlyProduces(w *wire, commits []time.Time, obs []observation) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	commits = slices.SortedFunc(slices.Values(commits), time.Time.Compare)
	early := 0
	for k, ended := range w.endReads {
		nextEnd := farFuture
		if k+1 < len(w.endReads) {
			nextEnd = w.endReads[k+1]
		}
		endBound := farFuture // before the next EndTxn was written
		if i := slices.IndexFunc(commits, ended.Before); i >= 0 {
			endBound = commits[i]
		}
		if i := slices.IndexFunc(w.offsetCommits, ended.Before); i >= 0 && w.offsetCommits[i].Before(nextEnd) {
			endBound = w.offsetCommits[i]
		}
		var epoch int16 = -1
		for _, o := range obs {
			if o.sent.After(ended) && o.received.Before(endBound) {
				epoch = o.epoch
				break
			}
		}
		if epoch < 0 {
			continue
		}
		for _, p := range w.produces {
			if !p.After(ended) || !p.Before(nextEnd) {
				continue
			}
			if slices.ContainsFunc(obs, func(o observation) bool {
				return o.sent.After(p) && o.epoch == epoch && strings.HasPrefix(o.state, "Prepare")
			}) {
				early++
			}
		}
	}
	return early
}

var farFuture = time.Now().Add(24 * time.Hour)

// freshStart is one start of a stage on fresh topics and what it did.
type freshStart struct {
	in, out, changelog, group string

	early           int                // produce requests written before the coordinator finished the previous transaction
	initProducerIDs int64              // InitProducerID requests
	restarts        float64            // the runtime's session restarts
	commits         []time.Duration    // the stage's commit latency, per transaction, in order
	elapsed         time.Duration      // from Run until the group committed the end of the input
	logs            testenv.SyncBuffer // the stage's warnings
	timeline        string             // of the requests and observations, if early > 0
}

// createTopics creates the topics, each with n partitions, in one request,
// waits until they are visible and deletes them when the test ends.
func createTopics(t *testing.T, brokers []string, n int32, names ...string) {
	t.Helper()
	adm := testenv.Admin(t, brokers)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	resps, err := adm.CreateTopics(ctx, n, 1, nil, names...)
	if err == nil {
		err = resps.Error()
	}
	if err != nil {
		t.Fatalf("create topics: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, _ = adm.DeleteTopics(ctx, names...)
	})
	if err := topics.WaitVisible(ctx, adm, names...); err != nil {
		t.Fatal(err)
	}
	// In the metadata is not yet served: the broker creates a partition's
	// log when it learns that it leads it. Wait until every partition's
	// leader answers, so that no start begins while its partitions are
	// being created (the fresh-start test's 480 took 4-11 s on a loaded
	// 2-core machine, longer than a transaction).
	for {
		offs, err := adm.ListEndOffsets(ctx, names...)
		if err == nil {
			err = offs.Error()
		}
		if err == nil {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("partitions of the new topics not led: %v", err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// run fills the input, runs a stage until the group committed the end of
// the input, and stops it.
func (r *freshStart) run(t *testing.T, brokers []string, n int, outN uint32, records, batch int) {
	t.Helper()
	pcl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(r.in))
	if err != nil {
		t.Fatal(err)
	}
	recs := make([]*kgo.Record, records)
	for j := range recs {
		recs[j] = &kgo.Record{Key: fmt.Appendf(nil, "k%d", j), Value: make([]byte, 100)}
	}
	err = pcl.ProduceSync(context.Background(), recs...).FirstErr()
	pcl.Close()
	if err != nil {
		t.Fatal(err)
	}

	proc := &copyProc{out: r.out, outN: outN}
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	obs := &observer{adm: adm, id: r.group + "-i1"}
	w := &wire{after: obs.after}
	reg := prometheus.NewRegistry()
	cfg := stream.Config{
		Config: session.Config{
			Kafka:          kafka.Config{Brokers: brokers},
			Group:          r.group,
			InstanceID:     "i1",
			SessionTimeout: 6 * time.Second,
			ClientOptions:  []kgo.Opt{kgo.WithHooks(w)},
		},
		Stage:           "fresh",
		InputTopic:      r.in,
		ChangelogTopic:  r.changelog,
		FS:              vfs.NewMem(),
		MaxBatchRecords: batch,
		Registerer:      reg,
		Logger:          zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()), zapcore.AddSync(&r.logs), zap.WarnLevel)),
	}
	rt, err := stream.New(cfg, proc)
	if err != nil {
		t.Fatal(err)
	}
	if id := cfg.TransactionalID(); id != obs.id {
		t.Fatalf("transactional ID %s, observing %s", id, obs.id)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- rt.Run(ctx) }()

	// Read the stage's commit-latency histogram faster than transactions
	// end, for each transaction's commit time, until the group's committed
	// offsets reach the end of the input.
	var (
		lastN   uint64
		lastSum float64
	)
	readCommits := func() {
		n, sum := commitStats(t, reg)
		if n > lastN {
			per := time.Duration((sum - lastSum) / float64(n-lastN) * float64(time.Second))
			for range n - lastN {
				r.commits = append(r.commits, per)
			}
			lastN, lastSum = n, sum
		}
	}
	deadline := time.Now().Add(45 * time.Second)
	for polls := 0; ; polls++ {
		readCommits()
		if proc.emitted.Load() >= int64(records) && polls%5 == 0 && committedSum(t, adm, r.group, r.in) == int64(records) {
			r.elapsed = time.Since(start)
			break
		}
		select {
		case err := <-done:
			t.Fatalf("start %d: stage stopped: %v", n, err)
		case <-time.After(2 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("start %d: copied %d of %d records in %d transactions within 45s", n, proc.emitted.Load(), records, lastN)
		}
	}
	cancel()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("start %d: %v", n, err)
	}
	seen := obs.observations()
	readCommits()
	// Every commit observed how long it waited for the coordinator to
	// finish the transaction before, a part of its commit time.
	if wn, wsum := histogramStats(t, reg, "meterline_stream_transaction_settle_wait_seconds"); wn != lastN || wsum > lastSum {
		t.Errorf("start %d: settle_wait_seconds %d samples, sum %.3fs; commit_seconds %d samples, sum %.3fs", n, wn, wsum, lastN, lastSum)
	}
	if want := (records + batch - 1) / batch; len(r.commits) < want {
		t.Fatalf("start %d: %d transactions, want at least %d", n, len(r.commits), want)
	}
	proc.mu.Lock()
	r.early = earlyProduces(w, proc.flushes, seen)
	proc.mu.Unlock()
	r.timeline = timeline(w, proc.flushes, seen, start)
	r.initProducerIDs = w.initProducerIDs
	r.restarts = counterValue(t, reg, "meterline_stream_session_restarts_total")
}

// committedSum returns the sum of the group's committed offsets on topic.
func committedSum(t *testing.T, adm *kadm.Client, group, topic string) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	offs, err := adm.FetchOffsets(ctx, group)
	if err != nil {
		t.Fatalf("fetch offsets of %s: %v", group, err)
	}
	var sum int64
	offs.Each(func(o kadm.OffsetResponse) {
		if o.Topic == topic && o.Err == nil {
			sum += o.At
		}
	})
	return sum
}

// commitStats reads the stage's commit-latency histogram.
func commitStats(t *testing.T, reg *prometheus.Registry) (n uint64, sum float64) {
	t.Helper()
	return histogramStats(t, reg, "meterline_stream_commit_seconds")
}

// histogramStats reads the sample count and sum of the stage's histogram
// name.
func histogramStats(t *testing.T, reg *prometheus.Registry, name string) (n uint64, sum float64) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			h := mf.GetMetric()[0].GetHistogram()
			return h.GetSampleCount(), h.GetSampleSum()
		}
	}
	return 0, 0
}

func counterValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var v float64
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				v += m.GetCounter().GetValue()
			}
		}
	}
	return v
}

// timeline lists the stage's produce writes, commit starts and EndTxn
// requests and the observer's changes of state, for a failure message.
func timeline(w *wire, commits []time.Time, obs []observation, t0 time.Time) string {
	type ev struct {
		at time.Time
		s  string
	}
	ms := func(at time.Time) string { return fmt.Sprintf("%.1f", float64(at.Sub(t0).Microseconds())/1000) }
	var evs []ev
	w.mu.Lock()
	for _, at := range w.produces {
		evs = append(evs, ev{at, "produce written"})
	}
	for _, at := range w.endWrites {
		evs = append(evs, ev{at, "EndTxn written"})
	}
	for _, at := range w.endReads {
		evs = append(evs, ev{at, "EndTxn read"})
	}
	w.mu.Unlock()
	for _, at := range commits {
		evs = append(evs, ev{at, "commit began"})
	}
	prev := ""
	for _, o := range obs {
		if st := fmt.Sprintf("%s epoch %d", o.state, o.epoch); st != prev {
			evs = append(evs, ev{o.sent, "observed " + st + " (answered at " + ms(o.received) + ")"})
			prev = st
		}
	}
	slices.SortFunc(evs, func(a, b ev) int { return a.at.Compare(b.at) })
	var b strings.Builder
	for i := 0; i < len(evs); {
		j := i + 1
		for j < len(evs) && evs[j].s == evs[i].s {
			j++
		}
		if j-i > 1 {
			fmt.Fprintf(&b, "%s–%s %s ×%d\n", ms(evs[i].at), ms(evs[j-1].at), evs[i].s, j-i)
		} else {
			fmt.Fprintf(&b, "%s %s\n", ms(evs[i].at), evs[i].s)
		}
		i = j
	}
	return b.String()
}
