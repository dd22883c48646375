package deploy

import (
	"bufio"
	"context"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/internal/topics"
)

// realHeldAlertsFired lists the alerts TestRealInputHeldByOpenTransactionAlert
// fires.
var realHeldAlertsFired = []string{"MeterlineInputHeldByOpenTransaction"}

// TestRealInputHeldByOpenTransactionAlert runs the shipped alert rules
// (scaled as TestRealAlertsFire's, realScale) in a real Prometheus
// scraping a real `meterline dedup` on the real broker, events arriving
// on both partitions of its input all test long:
//
//  1. Healthy: no alert is pending or firing for longer than the scaled
//     threshold and for.
//  2. A producer (not Meterline's) begins a transaction on input
//     partition 0, writes a record and goes away: the partition's last
//     stable offset stops there, dedup reads nothing past it while the
//     events keep arriving, and its lag there stays under a second, but
//     MeterlineInputHeldByOpenTransaction fires for partition 0 only,
//     and the dashboard's panel of held records shows the topic held.
//  3. The runbook (docs/operations.md, MeterlineInputHeldByOpenTransaction),
//     with Kafka's own TransactionsCommand (kafka-transactions.sh):
//     find-hanging on the partition does not list it (its
//     coordinator still tracks it: describe says Ongoing);
//     describe-producers gives its start offset, and abort at that offset
//     ends it: nothing is held, and the alert resolves.
func TestRealInputHeldByOpenTransactionAlert(t *testing.T) {
	promBin := realPrometheus(t, "alert rules")
	parallelAlertTest(t)
	brokers := testenv.RealKafka(t)
	work := testenv.LogDir(t, "meterline-alerts-held-test-*")
	bin := testenv.Meterline(t)

	prefix := testenv.Name(t, "alertsheld") + "."
	names := topics.DefaultNames()
	names.Prefix = prefix
	input := names.EventsTopic()
	deleteTopicsAfter(t, brokers, prefix)
	runCmd(t, bin, filepath.Join(work, "topics.log"), "topics", "create", "--brokers", strings.Join(brokers, ","),
		"--topic-prefix", prefix, "--partitions", "2", "--replication-factor", "1")

	addr := testenv.FreeAddr(t)
	proc := testenv.StartProcess(t, "dedup", filepath.Join(work, "dedup.log"), bin, "dedup",
		"--brokers", strings.Join(brokers, ","), "--log-level", "info", "--topic-prefix", prefix,
		"--group", strings.TrimSuffix(prefix, ".")+"-dedup", "--state-dir", filepath.Join(work, "state"),
		"--session-timeout", "6s", "--transaction-timeout", "10s", "--instance-id", "d1", "--metrics-addr", addr,
		"--tick-interval", "1s", "--dedup-keys-file", testenv.DedupKeysFile(t), "--sources", "api-gateway")
	waitHTTP(t, "http://"+addr+"/readyz", 90*time.Second)

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	p := newProducer(t, brokers, prefix)
	t.Cleanup(p.Close)
	sendLive(ctx, t, &wg, p, 25*time.Millisecond)
	w := watchScaledRules(t, promBin, work, addr)

	t.Log("---- 1. healthy")
	w.waitValue(`count(meterline_consumer_lag_held_seconds{stage="dedup"})`, 2, 60*time.Second)
	for healthy := time.Now(); time.Since(healthy) < 35*time.Second; time.Sleep(time.Second) {
		if as := w.active(); len(as) > 0 {
			t.Fatalf("alerts on a healthy pipeline: %v", as)
		}
	}

	t.Log("---- 2. a transaction left open on input partition 0")
	openTransaction(ctx, t, brokers, prefix+"gone-producer", 5*time.Minute, input, 0)
	held := map[string]string{"topic": input, "partition": "0"}
	w.waitFiring("MeterlineInputHeldByOpenTransaction", held)
	if a := w.find("MeterlineInputHeldByOpenTransaction", map[string]string{"partition": "1"}); a != nil {
		t.Errorf("partition 1, which holds nothing, is held: %v", a)
	}
	w.expectOnly("an input held by an open transaction", "MeterlineInputHeldByOpenTransaction")
	// What the alert is for: the lag does not show it.
	if res, err := w.prom.query(`max(meterline_consumer_lag_seconds{stage="dedup", partition="0"})`); err != nil || len(res) != 1 || res[0].value >= 5 {
		t.Errorf("lag of partition 0 while held: %v (err %v), want under 5 s (the scaled MeterlineConsumerLagGrowing's bound)", res, err)
	}
	if res, err := w.prom.query(`max(meterline_consumer_lag_held_records{stage="dedup", partition="0"})`); err != nil || len(res) != 1 || res[0].value < 100 {
		t.Errorf("held records of partition 0: %v (err %v), want the events of the last 30 s and more", res, err)
	}
	expectHeldPanel(t, w.prom, input)

	t.Log("---- 3. the runbook: find the transaction and abort it")
	// find-hanging lists only transactions their coordinator no longer
	// tracks (KIP-664); this one's still does, as Ongoing until its
	// timeout (5 minutes): describe names it, and its producer. (The
	// committing producer's transactions, open a few milliseconds at a
	// time, can show in find-hanging's listing with a timeout of 0 for
	// the moment between its coordinator ending one and the marker: only
	// the held transaction's start offset is looked for.)
	producers := transactionsCommand(t, brokers, "describe-producers", "--topic", input, "--partition", "0")
	start := heldTransactionStart(t, producers, time.Now(), 20*time.Second)
	// On the partition, not the leader's every partition: those of every
	// topic of a make test run, whose DescribeProducers one by one took
	// find-hanging past a minute on a loaded machine.
	hanging := transactionsCommand(t, brokers, "find-hanging", "--topic", input, "--partition", "0", "--max-transaction-timeout", "0")
	for _, line := range strings.Split(hanging, "\n") {
		if f := strings.Fields(line); len(f) >= 6 && f[0] == input && f[1] == "0" && f[5] == strconv.FormatInt(start, 10) {
			t.Errorf("find-hanging lists the transaction its coordinator tracks (start offset %d):\n%s", start, hanging)
		}
	}
	if d := transactionsCommand(t, brokers, "describe", "--transactional-id", prefix+"gone-producer"); !strings.Contains(d, "Ongoing") {
		t.Errorf("describe --transactional-id %s: not Ongoing:\n%s", prefix+"gone-producer", d)
	}
	transactionsCommand(t, brokers, "abort", "--topic", input, "--partition", "0", "--start-offset", strconv.FormatInt(start, 10))
	w.waitResolved("MeterlineInputHeldByOpenTransaction", held)
	w.waitValue(`count(max(meterline_consumer_lag_held_seconds{stage="dedup", partition="0"}) < 5)`, 1, 30*time.Second)
	w.expectRulesHealthy()
	w.expectFired(realHeldAlertsFired)
	cancel()
	wg.Wait()
	proc.Stop(t)
}

// heldPanel is the title of the dashboard's panel of records held past
// the last stable offset.
const heldPanel = "Consumer lag held by open transactions"

// expectHeldPanel evaluates the queries of the dashboard's heldPanel in
// prom (every instance and group) while partition 0 of topic is held:
// each shows topic held: the events of the last 30 s and more, for
// longer than the scaled alert's threshold (the alert fired).
func expectHeldPanel(t *testing.T, prom promClient, topic string) {
	t.Helper()
	least := map[string]float64{"A": 100, "B": 10} // records, seconds
	targets := 0
	for _, p := range loadDashboard(t).panels() {
		if p.Title != heldPanel {
			continue
		}
		for _, tg := range p.Targets {
			targets++
			q := substitute(tg.Expr, map[string]string{"instance": ".*", "group": ".*"})
			res, err := prom.query(q)
			if err != nil {
				t.Errorf("panel %q/%s: %s: %v", p.Title, tg.RefID, q, err)
				continue
			}
			var got float64
			for _, r := range res {
				if r.metric["topic"] == topic {
					got = r.value
				}
			}
			t.Logf("panel %q/%s: %s = %v for %s", p.Title, tg.RefID, q, got, topic)
			if got < least[tg.RefID] {
				t.Errorf("panel %q/%s: %s: %v for %s (all: %v); want at least %v", p.Title, tg.RefID, q, got, topic, res, least[tg.RefID])
			}
		}
	}
	if targets != 2 {
		t.Errorf("panel %q: %d queries, want 2 (records and seconds held)", heldPanel, targets)
	}
}

// transactionsCommand runs Kafka's kafka-transactions.sh (the class it
// runs, from the jars deploy/local/kafka.sh caches) with args against
// brokers and returns its output.
func transactionsCommand(t *testing.T, brokers []string, args ...string) string {
	t.Helper()
	return kafkaTool(t, brokers, "org.apache.kafka.tools.TransactionsCommand", "kafka-transactions.sh", args...)
}

// kafkaTool runs the class of Kafka's command-line tool name (from the
// jars deploy/local/kafka.sh caches) with args against brokers and
// returns its output.
func kafkaTool(t *testing.T, brokers []string, class, name string, args ...string) string {
	t.Helper()
	libs, err := exec.Command(filepath.Join(repoRoot, "deploy/local/kafka.sh"), "libs").Output()
	if err != nil {
		t.Fatalf("deploy/local/kafka.sh libs: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "java", append([]string{"-cp", strings.TrimSpace(string(libs)) + "/*",
		class, "--bootstrap-server", strings.Join(brokers, ",")}, args...)...)
	out, err := cmd.CombinedOutput()
	t.Logf("%s %s:\n%s", name, strings.Join(args, " "), out)
	if err != nil {
		t.Fatalf("%s %s: %v", name, strings.Join(args, " "), err)
	}
	return string(out)
}

// heldTransactionStart returns the start offset of the transaction
// describe-producers (output out, read at now) shows holding the
// partition, as the runbook finds it: of the producers with a
// CurrentTransactionStartOffset, the one with the lowest (the
// partition's last stable offset), whose last write is at least heldFor
// old. A live transactional producer of the partition can show one too,
// for the milliseconds its transaction is open: a later start offset,
// a recent write. Two transactions that old, or none, fail the test.
func heldTransactionStart(t *testing.T, out string, now time.Time, heldFor time.Duration) int64 {
	t.Helper()
	sc := bufio.NewScanner(strings.NewReader(out))
	startCol, lastCol := -1, -1
	type open struct{ start, last int64 }
	var txns []open
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if startCol < 0 {
			for i, h := range f {
				switch h {
				case "CurrentTransactionStartOffset":
					startCol = i
				case "LastTimestamp":
					lastCol = i
				}
			}
			continue
		}
		if lastCol < 0 || startCol >= len(f) || lastCol >= len(f) {
			continue
		}
		start, err := strconv.ParseInt(f[startCol], 10, 64)
		if err != nil || start < 0 {
			continue // None: no transaction open
		}
		last, err := strconv.ParseInt(f[lastCol], 10, 64)
		if err != nil {
			t.Fatalf("describe-producers: LastTimestamp %q:\n%s", f[lastCol], out)
		}
		txns = append(txns, open{start, last})
	}
	stale, lowest := 0, -1
	for i, o := range txns {
		if now.Sub(time.UnixMilli(o.last)) >= heldFor {
			stale++
		}
		if lowest < 0 || o.start < txns[lowest].start {
			lowest = i
		}
	}
	if lowest < 0 || stale != 1 || now.Sub(time.UnixMilli(txns[lowest].last)) < heldFor {
		t.Fatalf("describe-producers: want one transaction open from the lowest start offset with no write for %v, %d are that old:\n%s", heldFor, stale, out)
	}
	return txns[lowest].start
}

// TestHeldTransactionStart: the held transaction is found beside a live
// producer's caught mid-transaction (describe-producers as a run printed
// it, the held one open 47 s, the live one's started 57 ms before).
func TestHeldTransactionStart(t *testing.T) {
	out := "ProducerId\tProducerEpoch\tLatestCoordinatorEpoch\tLastSequence\tLastTimestamp\tCurrentTransactionStartOffset\t\n" +
		"81        \t0            \t-1                    \t0           \t1796608048426\t871                          \t\n" +
		"46        \t616          \t0                     \t0           \t1796608095417\t1936                         \t\n" +
		"47        \t0            \t-1                    \t1763        \t1796608095474\tNone                         \t\n"
	now := time.UnixMilli(1796608095474)
	if got := heldTransactionStart(t, out, now, 20*time.Second); got != 871 {
		t.Errorf("held transaction from %d, want 871", got)
	}
	alone := "ProducerId\tProducerEpoch\tLatestCoordinatorEpoch\tLastSequence\tLastTimestamp\tCurrentTransactionStartOffset\t\n" +
		"81        \t0            \t-1                    \t0           \t1796608048426\t871                          \t\n"
	if got := heldTransactionStart(t, alone, now, 20*time.Second); got != 871 {
		t.Errorf("held transaction alone from %d, want 871", got)
	}
}
