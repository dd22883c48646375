package clustertest

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/meterline/meterline/internal/kafka"
	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/schemas"
)

// TestRealClusterReadyWaitsForTransactionalID: a real `meterline dedup`
// whose transaction coordinator's broker is paused (SIGSTOP) is not ready
// while its new session's InitProducerID goes unanswered, although it is a
// member of its group and has restored every partition it owns
// (docs/operations.md, "One broker paused or killed"); once the broker is
// resumed (SIGCONT) it is ready within readyAfterResume, and every event
// sent throughout is in usage.deduped exactly once.
//
// The stage is stopped with SIGTERM, the broker paused once the
// coordinator has written the markers of the stage's last transaction (no
// transaction of its holds the restore of its changelog), and the stage
// started again once the controller has fenced the paused broker: its new session's requests that
// may go to any broker then go to the two that answer, and only its
// transactional ID waits. A transaction coordinator
// moves when its broker is fenced; pinCoordinator keeps this one on the
// paused broker (its partition of __transaction_state on that broker
// alone) for as long as the test needs. About 35 s.
func TestRealClusterReadyWaitsForTransactionalID(t *testing.T) {
	s := newSuite(t, time.Minute)
	const id = "i1"
	s.start("dedup", id)
	g := s.generate(50)
	s.waitReady(time.Minute) // under load, committing transactions

	txn := s.txnID("dedup", id)
	n := pinCoordinator(t, s, txn)
	s.stop("dedup", id)
	waitTxnComplete(t, s.brokers, txn)
	s.cluster.Pause(t, n)
	paused := time.Now()
	waitFenced(t, s.brokers, n, paused)
	p := s.start("dedup", id)

	// A member of its group with every partition restored: ready but for
	// its transactional ID.
	deadline := time.Now().Add(30 * time.Second)
	for !restoredAll(p) {
		if time.Now().After(deadline) {
			s.fatalf("dedup %s: not a member with its %d partitions restored 30 s after its start: %s", id, partitions, ready(&http.Client{Timeout: 2 * time.Second}, s, "dedup", id))
		}
		s.sleep(200 * time.Millisecond)
	}
	s.note("dedup %s a member of its group with every partition restored %s after its start, %s after the pause", id,
		time.Since(p.Started()).Round(100*time.Millisecond), time.Since(paused).Round(100*time.Millisecond))
	c := http.Client{Timeout: 2 * time.Second}
	samples, txnReason := 0, 0
	for end := time.Now().Add(readySampled); time.Now().Before(end); samples++ {
		why := ready(&c, s, "dedup", id)
		if why == "" {
			s.fatalf("dedup %s answers /readyz with 200 while its transaction coordinator (broker %d) is paused, %s after the pause: its transactional ID %s cannot be initialised",
				id, n, time.Since(paused).Round(100*time.Millisecond), txn)
		}
		if strings.Contains(why, "initialising transactional ID "+txn) {
			txnReason++
		}
		if len(p.Lines("stage started")) > 0 {
			s.fatalf("dedup %s logged its transactional ID initialised while its transaction coordinator (broker %d) is paused", id, n)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if txnReason == 0 {
		s.fatalf("dedup %s: none of %d /readyz answers while its coordinator was paused said it is initialising its transactional ID", id, samples)
	}
	s.note("dedup %s: /readyz not ready in %d answers over %s, %d of them for its transactional ID", id, samples, readySampled, txnReason)

	s.cluster.Resume(t, n)
	resumed := time.Now()
	s.waitReady(readyAfterResume)
	s.note("dedup %s ready %s after broker %d was resumed", id, time.Since(resumed).Round(100*time.Millisecond), n)

	g.stop()
	tr := s.truth(g)
	s.waitCaughtUp(s.group("dedup"), func(k schemas.Kind) bool { return k == schemas.KindTick }, s.names.EventsTopic())
	var problems []string
	s.checkDeduped(tr, func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) })
	if len(problems) > 0 {
		s.fatalf("usage.deduped:\n  %s", strings.Join(problems, "\n  "))
	}
	s.note("usage.deduped: %d identities exactly once (%d copies, %d rejected)", len(tr.idents), tr.copies, sumInts(tr.rejected))
	s.checkNoSelfExits()
}

// readySampled is how long /readyz is sampled while the stage waits for
// its transaction coordinator; readyAfterResume bounds its readiness once
// the coordinator's broker is resumed: the broker is unfenced and leads
// its partition of __transaction_state again within seconds, and a
// session whose InitProducerID reached its bound (transaction timeout +
// session timeout, 16 s) meanwhile is rebuilt.
const (
	readySampled     = 3 * time.Second
	readyAfterResume = 45 * time.Second
)

// restoredAll reports whether the stage process has restored every
// partition, each assigned to it by its group: it is a member. (Its
// /metrics would say so too, but a scrape takes up to 5 s while a broker
// does not answer: the consumer lag is computed.)
func restoredAll(p *testenv.Process) bool {
	restored := map[int64]bool{}
	for _, l := range p.Lines("partition restored") {
		restored[l.Int("partition")] = true
	}
	return len(restored) == partitions
}

// waitTxnComplete waits until the coordinator of txn has completed its
// last transaction (its markers written), failing the test after 30 s.
func waitTxnComplete(t *testing.T, brokers []string, txn string) {
	t.Helper()
	adm := testenv.Admin(t, brokers)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		ds, err := adm.DescribeTransactions(ctx, txn)
		var d kadm.DescribedTransaction
		if err == nil {
			d, err = ds.On(txn, nil)
		}
		if err == nil && (d.State == "Empty" || d.State == "CompleteCommit" || d.State == "CompleteAbort") {
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("the last transaction of %s not complete after 30 s: state %q, %v", txn, d.State, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitFenced waits until the cluster no longer lists broker n, failing
// the test 30 s after since.
func waitFenced(t *testing.T, brokers []string, n int32, since time.Time) {
	t.Helper()
	ask, err := kgo.NewClient(kgo.SeedBrokers(slices.Delete(slices.Clone(brokers), int(n-1), int(n))...))
	if err != nil {
		t.Fatal(err)
	}
	defer ask.Close()
	for {
		listed, _ := kafka.ListedBrokers(context.Background(), ask.SeedBrokers(), kafka.ListedBrokerWait)
		if len(listed) == len(brokers)-1 {
			t.Logf("broker %d fenced %s after the pause", n, time.Since(since).Round(100*time.Millisecond))
			return
		}
		if time.Since(since) > 30*time.Second {
			t.Fatalf("the cluster still lists %v 30 s after broker %d was paused", listed, n)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// transactionState is Kafka's topic of the transaction coordinators' state.
const transactionState = "__transaction_state"

// txnStatePartition is the partition of __transaction_state that holds
// txn, and whose leader coordinates it: Kafka takes Java's String.hashCode
// of the ID, its absolute value, modulo the partitions.
func txnStatePartition(txn string, parts int) int32 {
	var h int32
	for _, c := range []rune(txn) {
		h = 31*h + int32(c) // ASCII IDs: one UTF-16 unit each
	}
	if h == -1<<31 {
		h = 0
	}
	if h < 0 {
		h = -h
	}
	return h % int32(parts)
}

// pinCoordinator keeps the transaction coordinator of txn on its broker,
// which it returns, through that broker's fencing: txn's partition of
// __transaction_state is left on that broker alone (min.insync.replicas 1
// on the topic meanwhile), so that no other broker takes it over. A
// cleanup (run before the cluster's own) resumes the broker and gives the
// partition its replicas and the topic its setting back.
func pinCoordinator(t *testing.T, s *suite, txn string) int32 {
	t.Helper()
	adm := testenv.Admin(t, s.brokers)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	td, err := adm.ListTopics(ctx, transactionState)
	if err == nil {
		err = td.Error()
	}
	if err != nil {
		t.Fatalf("describing %s: %v", transactionState, err)
	}
	part := txnStatePartition(txn, len(td[transactionState].Partitions))
	pd := td[transactionState].Partitions[part]
	n := s.cluster.TxnCoordinator(t, txn)
	if pd.Leader != n {
		t.Fatalf("%s partition %d (of transactional ID %s) is led by broker %d, but its coordinator is broker %d", transactionState, part, txn, pd.Leader, n)
	}
	cfgs, err := adm.DescribeTopicConfigs(ctx, transactionState)
	if err != nil {
		t.Fatal(err)
	}
	minISR, err := cfgs.On(transactionState, nil)
	if err != nil {
		t.Fatal(err)
	}
	var restoreISR kadm.AlterConfig
	for _, c := range minISR.Configs {
		if c.Key == "min.insync.replicas" {
			restoreISR = kadm.AlterConfig{Op: kadm.DeleteConfig, Name: c.Key}
			if c.Source == kmsg.ConfigSourceDynamicTopicConfig {
				restoreISR = kadm.AlterConfig{Op: kadm.SetConfig, Name: c.Key, Value: c.Value}
			}
		}
	}
	if restoreISR.Name == "" {
		t.Fatalf("%s has no min.insync.replicas", transactionState)
	}
	one := "1"
	alterConfig(t, adm, kadm.AlterConfig{Op: kadm.SetConfig, Name: "min.insync.replicas", Value: &one})
	var once sync.Once
	t.Cleanup(func() {
		once.Do(func() {
			s.cluster.Resume(t, n)
			reassign(t, adm, part, pd.Replicas)
			alterConfig(t, adm, restoreISR)
		})
	})
	reassign(t, adm, part, []int32{n})
	s.note("transactional ID %s: %s partition %d on its coordinator, broker %d, alone (replicas were %v)", txn, transactionState, part, n, pd.Replicas)
	return n
}

// alterConfig sets a config of __transaction_state.
func alterConfig(t *testing.T, adm *kadm.Client, c kadm.AlterConfig) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rs, err := adm.AlterTopicConfigs(ctx, []kadm.AlterConfig{c}, transactionState)
	if err == nil {
		_, err = rs.On(transactionState, nil)
	}
	if err != nil {
		t.Fatalf("%s: setting %s: %v", transactionState, c.Name, err)
	}
}

// reassign gives partition part of __transaction_state the replicas and
// waits until they are its replicas, all in sync.
func reassign(t *testing.T, adm *kadm.Client, part int32, replicas []int32) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	req := kadm.AlterPartitionAssignmentsReq{}
	req.Assign(transactionState, part, replicas)
	rs, err := adm.AlterPartitionAssignments(ctx, req)
	if err == nil {
		err = rs.Error()
	}
	if err != nil {
		t.Fatalf("reassigning %s partition %d to %v: %v", transactionState, part, replicas, err)
	}
	for {
		td, err := adm.ListTopics(ctx, transactionState)
		if err == nil {
			err = td.Error()
		}
		if err == nil {
			pd := td[transactionState].Partitions[part]
			if slices.Equal(sortedIDs(pd.Replicas), sortedIDs(replicas)) && slices.Equal(sortedIDs(pd.ISR), sortedIDs(replicas)) {
				return
			}
			err = fmt.Errorf("replicas %v, in sync %v", pd.Replicas, pd.ISR)
		}
		if ctx.Err() != nil {
			t.Fatalf("%s partition %d not on %v after 2 minutes: %v", transactionState, part, replicas, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

func sortedIDs(ids []int32) []int32 { return slices.Sorted(slices.Values(ids)) }

// TestTxnStatePartition: the partition of __transaction_state is Kafka's
// (Utils.abs(id.hashCode()) % partitions), checked against Java's
// String.hashCode of known strings: "hello" 99162322, "Hello World"
// -862545276, "polygenelubricants" Integer.MIN_VALUE (which Utils.abs
// makes 0). No services.
func TestTxnStatePartition(t *testing.T) {
	for _, c := range []struct {
		id   string
		want int32
	}{{"hello", 99162322 % 50}, {"Hello World", 862545276 % 50}, {"polygenelubricants", 0}} {
		if got := txnStatePartition(c.id, 50); got != c.want {
			t.Errorf("txnStatePartition(%q, 50) = %d, want %d", c.id, got, c.want)
		}
	}
}
