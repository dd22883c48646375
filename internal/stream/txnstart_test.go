package stream_test

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
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
//     still reports the previous one as PrepareCommit or PrepareAbort (an
//     observer describes the transactional ID every millisecond or so; a
//     produce written after EndTxn's response and before an observation
//     that still saw the transaction completing, itself before the next
//     EndTxn, was early). This holds however fast the broker writes the
//     markers;
//   - no such refusal in the broker's log for the start's topics (it
//     appears only when the markers took longer than the leader's retry);
//   - one InitProducerID (the producer ID is never re-initialised) and no
//     session restart.
func TestRealFreshStartNoSequenceRejects(t *testing.T) {
	brokers := testenv.RealKafka(t)
	serverLog := testenv.RealKafkaServerLog(t)
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

	const refusal = "Expected sequence 0 for transactions v2"
	var failed int
	for i, r := range runs {
		var refused []string
		for _, topic := range []string{r.out, r.changelog} {
			refused = append(refused, testenv.KafkaServerLogLines(t, serverLog, refusal, " in partition "+topic+"-")...)
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

func (c *copyProc) Punctuate(*stream.Tx) error { return nil }
func (c *copyProc) Close()                     {}

// wire records when the stage's client wrote Produce and EndTxn requests
// and read EndTxn responses, and counts its InitProducerID requests.
type wire struct {
	mu              sync.Mutex
	produces        []time.Time
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
	}
}

// observation is what DescribeTransactions returned: the coordinator was
// in state at some moment between sent and received.
type observation struct {
	sent, received time.Time
	state          string
}

// observe describes the transactional ID until ctx ends.
func observe(ctx context.Context, t *testing.T, brokers []string, id string) <-chan []observation {
	out := make(chan []observation, 1)
	adm := testenv.Admin(t, brokers)
	go func() {
		var obs []observation
		defer func() { out <- obs }()
		for ctx.Err() == nil {
			sent := time.Now()
			ds, err := adm.DescribeTransactions(ctx, id)
			if err == nil {
				if d, ok := ds[id]; ok && d.Err == nil {
					obs = append(obs, observation{sent: sent, received: time.Now(), state: d.State})
				}
			}
			select {
			case <-ctx.Done():
			case <-time.After(time.Millisecond):
			}
		}
	}()
	return out
}

// earlyProduces counts the produce requests written after an EndTxn
// response while the coordinator still finished that transaction: an
// observation sent after the produce was written still saw PrepareCommit or
// PrepareAbort, and was answered before the next EndTxn was written (so it
// saw this transaction, not the next).
func earlyProduces(w *wire, obs []observation) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	early := 0
	for _, ended := range w.endReads {
		next := time.Now().Add(time.Hour)
		for _, ew := range w.endWrites {
			if ew.After(ended) {
				next = ew
				break
			}
		}
		for _, p := range w.produces {
			if !p.After(ended) || !p.Before(next) {
				continue
			}
			for _, o := range obs {
				if o.sent.After(p) && o.received.Before(next) && strings.HasPrefix(o.state, "Prepare") {
					early++
					break
				}
			}
		}
	}
	return early
}

// freshStart is one start of a stage on fresh topics and what it did.
type freshStart struct {
	in, out, changelog, group string

	early           int             // produce requests written before the coordinator finished the previous transaction
	initProducerIDs int64           // InitProducerID requests
	restarts        float64         // the runtime's session restarts
	commits         []time.Duration // the stage's commit latency, per transaction, in order
	elapsed         time.Duration   // from Run until the group committed the end of the input
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
	w := &wire{}
	reg := prometheus.NewRegistry()
	cfg := stream.Config{
		Stage:           "fresh",
		Brokers:         brokers,
		Group:           r.group,
		InstanceID:      "i1",
		InputTopic:      r.in,
		ChangelogTopic:  r.changelog,
		FS:              vfs.NewMem(),
		MaxBatchRecords: batch,
		SessionTimeout:  6 * time.Second,
		Registerer:      reg,
		ClientOptions:   []kgo.Opt{kgo.WithHooks(w)},
	}
	rt, err := stream.New(cfg, proc)
	if err != nil {
		t.Fatal(err)
	}
	octx, ostop := context.WithCancel(context.Background())
	defer ostop()
	observed := observe(octx, t, brokers, cfg.TransactionalID())
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
	adm := testenv.Admin(t, brokers)
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
	ostop()
	obs := <-observed
	readCommits()
	if want := (records + batch - 1) / batch; len(r.commits) < want {
		t.Fatalf("start %d: %d transactions, want at least %d", n, len(r.commits), want)
	}
	r.early = earlyProduces(w, obs)
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
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "meterline_stream_commit_seconds" {
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
