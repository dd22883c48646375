package deploy

import (
	"context"
	"errors"
	"io"
	"net/http"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/internal/topics"
)

// realWaitAlertsFired lists the alerts TestRealWritesRefusedAlert and
// TestRealOffsetsWaitTooLongAlert fire.
var realWaitAlertsFired = []string{"MeterlineWritesRefused", "MeterlineOffsetsWaitTooLong"}

// waitAlertDedup creates the topics of prefix (2 partitions, replicas
// each) and starts a `meterline dedup` on them that ticks every second, with
// --transaction-timeout txnTimeout; it returns its metrics address and
// its group.
func waitAlertDedup(t *testing.T, brokers []string, work, prefix string, replicas int, txnTimeout time.Duration) (addr, group string) {
	t.Helper()
	bin := testenv.Meterline(t)
	deleteTopicsAfter(t, brokers, prefix)
	runCmd(t, bin, filepath.Join(work, "topics.log"), "topics", "create", "--brokers", strings.Join(brokers, ","),
		"--topic-prefix", prefix, "--partitions", "2", "--replication-factor", strconv.Itoa(replicas))
	addr, group = testenv.FreeAddr(t), strings.TrimSuffix(prefix, ".")+"-dedup"
	testenv.StartProcess(t, "dedup", filepath.Join(work, "dedup.log"), bin, "dedup",
		"--brokers", strings.Join(brokers, ","), "--log-level", "info", "--topic-prefix", prefix,
		"--group", group, "--state-dir", filepath.Join(work, "state"), "--session-timeout", "6s",
		"--transaction-timeout", txnTimeout.String(), "--instance-id", "d1", "--metrics-addr", addr,
		"--tick-interval", "1s", "--dedup-keys-file", testenv.DedupKeysFile(t), "--sources", "api-gateway")
	return addr, group
}

// readyzBody returns the status and body of GET /readyz at addr.
func readyzBody(addr string) (int, string) {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get("http://" + addr + "/readyz")
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestRealWritesRefusedAlert runs the shipped alert rules (scaled as
// TestRealAlertsFire's, realScale) in a real Prometheus scraping a real
// `meterline dedup` on a cluster of three brokers of the test's own
// (deploy/local/kafka.sh, on the test broker's port + 60 to 62, their
// controllers + 70 to 72), its topics with three replicas. Kafka counts
// a min.insync.replicas above a partition's replicas as its replicas, so
// only a replica out of sync makes the brokers refuse writes:
//
//  1. Healthy, events arriving: the refusal gauges are exported at 0; no
//     alert.
//  2. Broker 3 killed, out of every in-sync replica set, and
//     min.insync.replicas 3 on every topic dedup writes: the brokers
//     refuse its writes with NOT_ENOUGH_REPLICAS; /readyz says dedup
//     cannot write and why, kafka-topics.sh lists the partitions (the
//     runbook), and MeterlineWritesRefused fires for below_min_insync,
//     beside MeterlineConsumerLagGrowing (nothing commits while events
//     arrive), no other alert. (The refusal shows once a transaction
//     fails or its records wait 5 s unwritten: here at the transaction
//     timeout, 10 s, since the brokers refuse its end.)
//  3. min.insync.replicas 2: the transaction commits, /readyz answers 200
//     and the alerts resolve.
func TestRealWritesRefusedAlert(t *testing.T) {
	promBin := realPrometheus(t, "alert rules")
	parallelAlertTest(t)
	work := testenv.LogDir(t, "meterline-alerts-refused-test-*")
	script, brokers := ownKafka(t, work, 3, 60, 70)
	script("start")
	prefix := testenv.Name(t, "alertsrefused") + "."
	addr, _ := waitAlertDedup(t, brokers, work, prefix, 3, 10*time.Second)
	waitHTTP(t, "http://"+addr+"/readyz", 90*time.Second)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	p := newProducer(t, brokers, prefix)
	t.Cleanup(p.Close)
	sendLive(ctx, t, &wg, p, 100*time.Millisecond)
	w := watchScaledRules(t, promBin, work, addr)

	t.Log("---- 1. healthy")
	w.waitValue(`count(meterline_stream_write_refused_partitions{stage="dedup"} == 0)`, 2, 60*time.Second)
	w.expectQuiet("healthy")

	t.Log("---- 2. broker 3 down, min.insync.replicas 3")
	adm := testenv.Admin(t, brokers)
	ts, err := adm.ListTopics(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var mine []string // the topics dedup writes, not its input
	for _, n := range ts.Names() {
		if strings.HasPrefix(n, prefix) && n != prefix+"usage.events" {
			mine = append(mine, n)
		}
	}
	script("kill-broker", "3")
	waitOutOfISR(t, adm, 3, mine)
	for _, n := range mine {
		setTopicConfig(t, adm, n, "min.insync.replicas", "3")
	}
	refused := map[string]string{"stage": "dedup", "cause": "below_min_insync"}
	w.waitFiring("MeterlineWritesRefused", refused)
	// Its input piles up behind its committed offsets meanwhile.
	w.expectOnly("writes refused", "MeterlineWritesRefused", "MeterlineConsumerLagGrowing")
	if code, body := readyzBody(addr); code != http.StatusServiceUnavailable || !strings.Contains(body, "cannot write") || !strings.Contains(body, "NOT_ENOUGH_REPLICAS") {
		t.Errorf("/readyz while writes are refused: %d %q, want 503 cannot write … NOT_ENOUGH_REPLICAS", code, body)
	}
	// The runbook: kafka-topics.sh lists the partitions below their
	// min.insync.replicas.
	if out := kafkaTool(t, brokers[:2], "org.apache.kafka.tools.TopicCommand", "kafka-topics.sh", "--describe", "--under-min-isr-partitions"); !strings.Contains(out, prefix+"usage.deduped.v2") {
		t.Errorf("kafka-topics.sh --describe --under-min-isr-partitions does not list %susage.deduped.v2:\n%s", prefix, out)
	}

	t.Log("---- 3. min.insync.replicas 2")
	for _, n := range mine {
		setTopicConfig(t, adm, n, "min.insync.replicas", "2")
	}
	w.waitResolved("MeterlineWritesRefused", refused)
	waitHTTP(t, "http://"+addr+"/readyz", 30*time.Second)
	w.waitResolved("MeterlineConsumerLagGrowing", nil)
	w.expectQuiet("writes commit again")
	cancel()
	wg.Wait()
	w.expectRulesHealthy()
	w.expectFired([]string{"MeterlineWritesRefused"})
}

// waitOutOfISR waits until no partition of topics has broker b in its
// in-sync replicas, failing the test after 60 s.
func waitOutOfISR(t *testing.T, adm *kadm.Client, b int32, topics []string) {
	t.Helper()
	start := time.Now()
	for {
		md, err := adm.Metadata(context.Background(), topics...)
		in := 0
		if err == nil {
			for _, td := range md.Topics {
				for _, pd := range td.Partitions {
					if slices.Contains(pd.ISR, b) {
						in++
					}
				}
			}
		}
		if err == nil && in == 0 {
			t.Logf("broker %d out of every in-sync replica set after %s", b, time.Since(start).Round(100*time.Millisecond))
			return
		}
		if time.Since(start) > 60*time.Second {
			t.Fatalf("broker %d still in %d in-sync replica sets after 60 s (%v)", b, in, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// TestRealOffsetsWaitTooLongAlert runs the shipped alert rules (scaled as
// TestRealAlertsFire's, realScale) in a real Prometheus scraping a real
// `meterline dedup` on the real broker:
//
//  1. Before dedup starts, a previous owner (a transactional ID of the
//     test's, timeout 5 minutes) commits offsets of input partition 0 for
//     dedup's group in a transaction it leaves open: a zombie's.
//  2. Dedup starts: partition 0 waits for its committed offsets
//     (UNSTABLE_OFFSET_COMMIT, cause open_transaction), partition 1 is
//     processed; MeterlineOffsetsWaitTooLong fires, no other alert, and
//     kafka-transactions.sh describe shows the transaction Ongoing on a
//     partition of __consumer_offsets (the runbook).
//  3. The runbook: a producer initialising the same transactional ID
//     aborts the transaction; partition 0 is restored, /readyz answers
//     200 and the alert resolves.
func TestRealOffsetsWaitTooLongAlert(t *testing.T) {
	promBin := realPrometheus(t, "alert rules")
	parallelAlertTest(t)
	brokers := testenv.RealKafka(t)
	work := testenv.LogDir(t, "meterline-alerts-offwait-test-*")
	prefix := testenv.Name(t, "alertsoffwait") + "."
	names := topics.DefaultNames()
	names.Prefix = prefix
	group := strings.TrimSuffix(prefix, ".") + "-dedup"
	txID := prefix + "zombie"

	// The topics first: the zombie's offsets are of the input.
	bin := testenv.Meterline(t)
	deleteTopicsAfter(t, brokers, prefix)
	runCmd(t, bin, filepath.Join(work, "topics-zombie.log"), "topics", "create", "--brokers", strings.Join(brokers, ","),
		"--topic-prefix", prefix, "--partitions", "2", "--replication-factor", "1")
	t.Log("---- 1. a previous owner's transaction left open on the group's offsets of partition 0")
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	pid, epoch := initTxnID(t, cl, txID, 5*time.Minute)
	commitOffsetsInTxn(t, cl, txID, pid, epoch, group, names.EventsTopic(), 0)

	t.Log("---- 2. dedup starts: partition 0 waits")
	addr, _ := waitAlertDedup(t, brokers, work, prefix, 1, 10*time.Second)
	w := watchScaledRules(t, promBin, work, addr)
	w.waitValue(`max(meterline_stream_offsets_waiting_partitions{stage="dedup", cause="open_transaction"})`, 1, 60*time.Second)
	waiting := map[string]string{"stage": "dedup"}
	w.waitFiring("MeterlineOffsetsWaitTooLong", waiting)
	w.expectOnly("offsets held by an open transaction", "MeterlineOffsetsWaitTooLong")
	if a := w.find("MeterlineOffsetsWaitTooLong", waiting); a == nil || !strings.Contains(a.Annotations["description"], "open_transaction 1;") {
		t.Errorf("the alert's description does not count the partition waiting on an open transaction: %v", a)
	}
	if d := transactionsCommand(t, brokers, "describe", "--transactional-id", txID); !strings.Contains(d, "Ongoing") || !strings.Contains(d, "__consumer_offsets-") {
		t.Errorf("describe --transactional-id %s: not Ongoing on a partition of __consumer_offsets:\n%s", txID, d)
	}

	t.Log("---- 3. the same transactional ID initialised again: the transaction aborts")
	initTxnID(t, cl, txID, 5*time.Minute)
	w.waitResolved("MeterlineOffsetsWaitTooLong", waiting)
	waitHTTP(t, "http://"+addr+"/readyz", 60*time.Second)
	w.expectQuiet("offsets stable")
	w.expectRulesHealthy()
	w.expectFired([]string{"MeterlineOffsetsWaitTooLong"})
}

// initTxnID initialises transactional ID txID (InitProducerID), as a
// producer starting with it does: an open transaction of the ID is
// aborted. It returns the producer ID and epoch.
func initTxnID(t *testing.T, cl *kgo.Client, txID string, timeout time.Duration) (int64, int16) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		req := kmsg.NewPtrInitProducerIDRequest()
		req.TransactionalID = &txID
		req.TransactionTimeoutMillis = int32(timeout.Milliseconds())
		resp, err := req.RequestWith(ctx, cl)
		if err == nil {
			err = kerr.ErrorForCode(resp.ErrorCode)
		}
		if err == nil {
			return resp.ProducerID, resp.ProducerEpoch
		}
		if (!kerr.IsRetriable(err) && !errors.Is(err, kerr.ConcurrentTransactions)) || ctx.Err() != nil {
			t.Fatalf("InitProducerID %s: %v", txID, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// commitOffsetsInTxn begins a transaction of txID (producer pid, epoch)
// that commits offset 0 of topic's partition p for group, and leaves it
// open.
func commitOffsetsInTxn(t *testing.T, cl *kgo.Client, txID string, pid int64, epoch int16, group, topic string, p int32) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	add := kmsg.NewPtrAddOffsetsToTxnRequest()
	add.TransactionalID, add.ProducerID, add.ProducerEpoch, add.Group = txID, pid, epoch, group
	ar, err := add.RequestWith(ctx, cl)
	if err == nil {
		err = kerr.ErrorForCode(ar.ErrorCode)
	}
	if err != nil {
		t.Fatalf("AddOffsetsToTxn %s: %v", group, err)
	}
	commit := kmsg.NewPtrTxnOffsetCommitRequest()
	commit.TransactionalID, commit.Group, commit.ProducerID, commit.ProducerEpoch = txID, group, pid, epoch
	tp := kmsg.NewTxnOffsetCommitRequestTopicPartition()
	tp.Partition, tp.Offset = p, 0
	tt := kmsg.NewTxnOffsetCommitRequestTopic()
	tt.Topic, tt.Partitions = topic, []kmsg.TxnOffsetCommitRequestTopicPartition{tp}
	commit.Topics = []kmsg.TxnOffsetCommitRequestTopic{tt}
	cr, err := commit.RequestWith(ctx, cl)
	if err == nil {
		for _, rt := range cr.Topics {
			for _, rp := range rt.Partitions {
				if e := kerr.ErrorForCode(rp.ErrorCode); e != nil {
					err = e
				}
			}
		}
	}
	if err != nil {
		t.Fatalf("TxnOffsetCommit %s %s[%d]: %v", group, topic, p, err)
	}
}
