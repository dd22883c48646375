package stream_test

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strings"
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

// copyProc copies every input record to the output topic, partitioned by
// key, and keeps the record's value in state: a transaction writes every
// output partition and a changelog partition per input partition, as dedup
// does.
type copyProc struct {
	out     string
	outN    int32
	emitted *atomic.Int64
}

func (c *copyProc) Open(int32, *stream.PartitionState) (stream.Partition, error) {
	return c, nil
}

func (c *copyProc) Process(tx *stream.Tx, recs []*kgo.Record) error {
	for _, r := range recs {
		h := fnv.New32a()
		h.Write(r.Key)
		tx.Emit(&kgo.Record{Topic: c.out, Partition: int32(h.Sum32() % uint32(c.outN)), Key: r.Key, Value: r.Value})
		tx.Put(r.Key, r.Value)
	}
	c.emitted.Add(int64(len(recs)))
	return nil
}

func (c *copyProc) Punctuate(*stream.Tx) error { return nil }
func (c *copyProc) Close()                     {}

// initProducerIDs counts the InitProducerID requests a client writes.
type initProducerIDs struct{ n atomic.Int64 }

func (h *initProducerIDs) OnBrokerWrite(_ kgo.BrokerMetadata, key int16, _ int, _, _ time.Duration, err error) {
	if key == int16(kmsg.InitProducerID) && err == nil {
		h.n.Add(1)
	}
}

// freshStart is what one start of a stage on fresh topics did.
type freshStart struct {
	in, out, changelog string
	initProducerIDs    int64
	restarts           float64
	commits            []time.Duration // the stage's commit latency, per transaction, in order
	elapsed            time.Duration
}

// TestRealFreshStartNoSequenceRejects starts a transactional stage on
// fresh topics 20 times and checks how its first transactions begin.
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
// idempotent producer with no existing state". kgo then resends only after
// its next metadata refresh, up to MetadataMinAge (5 s) later: the stall of
// a fresh stage's second commit. The runtime waits until the coordinator
// has finished the previous transaction before the next one produces.
//
// The check is the mechanism, not a duration: no such refusal in the
// broker's log for any of the 20 starts' topics, one InitProducerID per
// start (the producer ID is never re-initialised) and no session restart.
func TestRealFreshStartNoSequenceRejects(t *testing.T) {
	brokers := testenv.RealKafka(t)
	serverLog := testenv.RealKafkaServerLog(t)
	const (
		starts  = 20
		inN     = 4
		outN    = 8
		records = 12_000
	)
	names := make([]freshStart, starts)
	var ins, outs []string
	for i := range names {
		base := fmt.Sprintf("fresh%d", i+1)
		names[i] = freshStart{
			in:        testenv.Name(t, base+"-in"),
			out:       testenv.Name(t, base+"-out"),
			changelog: testenv.Name(t, base+"-changelog"),
		}
		ins = append(ins, names[i].in, names[i].changelog)
		outs = append(outs, names[i].out)
	}
	// All topics at once: created one by one they took about 1.7 s each.
	createTopics(t, brokers, inN, ins...)
	createTopics(t, brokers, outN, outs...)
	var runs []freshStart
	for i, r := range names {
		runs = append(runs, startFresh(t, brokers, i, r, inN, outN, records))
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
		t.Logf("start %2d: %d InitProducerID, %v restarts, %d refusals, %s to copy %d records, commits %s",
			i+1, r.initProducerIDs, r.restarts, len(refused), r.elapsed.Round(time.Millisecond), records, strings.Join(ms, " "))
		if len(refused) > 0 || r.initProducerIDs != 1 || r.restarts != 0 {
			failed++
			for _, l := range refused[:min(2, len(refused))] {
				t.Logf("  broker: %s", l)
			}
		}
	}
	if failed > 0 {
		t.Errorf("%d of %d starts on fresh topics had the broker refuse a sequence, re-initialised the producer ID or restarted the session (want none)", failed, starts)
	}
}

// createTopics creates the topics, each with n partitions, in one request,
// waits until they are visible and deletes them when the test ends.
func createTopics(t *testing.T, brokers []string, n int, names ...string) {
	t.Helper()
	adm := testenv.Admin(t, brokers)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	resps, err := adm.CreateTopics(ctx, int32(n), 1, nil, names...)
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

// startFresh fills the input of fresh topics, runs a stage until it copied
// everything in at least four transactions, and stops it.
func startFresh(t *testing.T, brokers []string, i int, r freshStart, inN, outN, records int) freshStart {
	t.Helper()
	base := fmt.Sprintf("fresh%d", i+1)
	pcl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(r.in))
	if err != nil {
		t.Fatal(err)
	}
	recs := make([]*kgo.Record, records)
	for j := range recs {
		recs[j] = &kgo.Record{Key: fmt.Appendf(nil, "k%d", j), Value: make([]byte, 100)}
	}
	if err := pcl.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	pcl.Close()

	group := testenv.Name(t, base+"-group")
	var emitted atomic.Int64
	hook := &initProducerIDs{}
	reg := prometheus.NewRegistry()
	rt, err := stream.New(stream.Config{
		Stage:           "fresh",
		Brokers:         brokers,
		Group:           group,
		InstanceID:      "i1",
		InputTopic:      r.in,
		ChangelogTopic:  r.changelog,
		FS:              vfs.NewMem(),
		MaxBatchRecords: records / 4,
		SessionTimeout:  6 * time.Second,
		Registerer:      reg,
		ClientOptions:   []kgo.Opt{kgo.WithHooks(hook)},
	}, &copyProc{out: r.out, outN: int32(outN), emitted: &emitted})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- rt.Run(ctx) }()

	// Poll the stage's commit-latency histogram faster than transactions
	// end, to read each transaction's commit time, until the group's
	// committed offsets reach the end of the input.
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
		if emitted.Load() >= int64(records) && polls%5 == 0 && committedSum(t, adm, group, r.in) == int64(records) {
			r.elapsed = time.Since(start)
			break
		}
		select {
		case err := <-done:
			t.Fatalf("start %d: stage stopped: %v", i+1, err)
		case <-time.After(2 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("start %d: copied %d of %d records in %d transactions within 45s", i+1, emitted.Load(), records, lastN)
		}
	}
	cancel()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("start %d: %v", i+1, err)
	}
	readCommits()
	if len(r.commits) < 4 {
		t.Fatalf("start %d: %d transactions, want at least 4 (MaxBatchRecords is a quarter of the input)", i+1, len(r.commits))
	}
	r.initProducerIDs = hook.n.Load()
	r.restarts = metricValue(t, reg, "meterline_stream_session_restarts_total")
	return r
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
		switch mf.GetName() {
		case "meterline_stream_commit_seconds":
			h := mf.GetMetric()[0].GetHistogram()
			n, sum = h.GetSampleCount(), h.GetSampleSum()
		}
	}
	return n, sum

}

func metricValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
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
