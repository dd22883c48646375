package testenv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Environment variables naming a real cluster of several brokers started by
// `KAFKA_CLUSTER=3 deploy/local/kafka.sh start` (make test and make chaos
// start one and set them).
const (
	// EnvKafkaCluster is the cluster's brokers, node 1 first, as
	// `deploy/local/kafka.sh brokers` prints them.
	EnvKafkaCluster = "METERLINE_TEST_KAFKA_CLUSTER"
	// EnvKafkaClusterDir is the cluster's KAFKA_DATA_DIR when it is not
	// the script's default.
	EnvKafkaClusterDir = "METERLINE_TEST_KAFKA_CLUSTER_DIR"
)

// Cluster is a real Kafka cluster whose brokers a test may kill, stop,
// pause and start again, one at a time, through deploy/local/kafka.sh.
// Broker n (1-based) has node ID n and listens on Brokers[n-1].
type Cluster struct {
	Brokers []string
	script  string
	env     []string
}

// RealCluster returns the real cluster named by METERLINE_TEST_KAFKA_CLUSTER,
// or skips the test, saying so plainly, when it is not set or with -short.
func RealCluster(t testing.TB) *Cluster {
	t.Helper()
	v := os.Getenv(EnvKafkaCluster)
	if v == "" || testing.Short() {
		t.Skipf("SKIP: real Kafka cluster test; set %s=host:port,host:port,host:port (KAFKA_CLUSTER=3 deploy/local/kafka.sh start; make test does) and drop -short", EnvKafkaCluster)
	}
	brokers := strings.Split(v, ",")
	_, port, err := net.SplitHostPort(brokers[0])
	if err != nil {
		t.Fatalf("%s=%s: %v", EnvKafkaCluster, v, err)
	}
	_, file, _, _ := runtime.Caller(0)
	c := &Cluster{Brokers: brokers, script: filepath.Join(filepath.Dir(file), "..", "..", "deploy", "local", "kafka.sh")}
	for _, kv := range os.Environ() {
		// The single broker's settings (make exports KAFKA_PORT) are not
		// the cluster's.
		if !strings.HasPrefix(kv, "KAFKA_") {
			c.env = append(c.env, kv)
		}
	}
	c.env = append(c.env, "KAFKA_CLUSTER="+strconv.Itoa(len(brokers)), "KAFKA_PORT="+port, "KAFKA_START_TIMEOUT=240")
	if dir := os.Getenv(EnvKafkaClusterDir); dir != "" {
		c.env = append(c.env, "KAFKA_DATA_DIR="+dir)
	}
	// Whatever the test did, the next one gets the whole cluster: paused
	// brokers resumed, stopped ones started, and every replica in sync
	// again (a broker resumed by this cleanup after a test failed before
	// its own WaitHealthy is still catching up: the next test's topics
	// would be under-replicated).
	t.Cleanup(func() {
		for n := range brokers {
			cmd := exec.Command("bash", c.script, "resume-broker", strconv.Itoa(n+1))
			cmd.Env = c.env
			_ = cmd.Run()
		}
		c.run(t, "start")
		c.WaitHealthy(t, cleanupHealthy)
	})
	return c
}

// cleanupHealthy bounds the wait of RealCluster's cleanup for a whole
// cluster: a broker that was paused or killed for a minute catches up in
// seconds on this machine.
const cleanupHealthy = 4 * time.Minute

// run runs the cluster script with args, failing the test if it fails.
func (c *Cluster) run(t testing.TB, args ...string) {
	t.Helper()
	start := time.Now()
	cmd := exec.Command("bash", append([]string{c.script}, args...)...)
	cmd.Env = c.env
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("kafka.sh %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	t.Logf("kafka.sh %s (%s): %s", strings.Join(args, " "), time.Since(start).Round(time.Millisecond), strings.TrimSpace(lastLine(string(out))))
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}

// Status runs the script's status: one line per broker, exit status 0
// when all of them serve, 3 otherwise.
func (c *Cluster) Status(t testing.TB) (int, string) {
	t.Helper()
	cmd := exec.Command("bash", c.script, "status")
	cmd.Env = c.env
	out, err := cmd.Output()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return 0, string(out)
	case errors.As(err, &exit):
		return exit.ExitCode(), string(out)
	}
	t.Fatalf("kafka.sh status: %v", err)
	return 0, ""
}

// Kill SIGKILLs broker n (kill -9: no controlled shutdown, no flush).
func (c *Cluster) Kill(t testing.TB, n int32) { t.Helper(); c.run(t, "kill-broker", fmt.Sprint(n)) }

// Stop stops broker n with SIGTERM (a controlled shutdown).
func (c *Cluster) Stop(t testing.TB, n int32) { t.Helper(); c.run(t, "stop-broker", fmt.Sprint(n)) }

// Start starts broker n and waits until it serves.
func (c *Cluster) Start(t testing.TB, n int32) { t.Helper(); c.run(t, "start-broker", fmt.Sprint(n)) }

// KillAll SIGKILLs every broker at once: the whole cluster lost, the
// controller quorum with it (each node is a broker and a controller).
func (c *Cluster) KillAll(t testing.TB) { t.Helper(); c.everyBroker(t, "kill-broker") }

// PauseAll SIGSTOPs every broker at once: the cluster keeps its
// connections and answers nothing (a frozen host, a network that drops
// everything).
func (c *Cluster) PauseAll(t testing.TB) { t.Helper(); c.everyBroker(t, "pause-broker") }

// ResumeAll SIGCONTs every broker at once.
func (c *Cluster) ResumeAll(t testing.TB) { t.Helper(); c.everyBroker(t, "resume-broker") }

// everyBroker runs the script's verb (kill-broker, pause-broker, ...) on
// every broker at once, failing the test if one fails.
func (c *Cluster) everyBroker(t testing.TB, verb string) {
	t.Helper()
	start := time.Now()
	outs := make([]string, len(c.Brokers))
	errs := make([]error, len(c.Brokers))
	var wg sync.WaitGroup
	for n := range c.Brokers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cmd := exec.Command("bash", c.script, verb, fmt.Sprint(n+1))
			cmd.Env = c.env
			out, err := cmd.CombinedOutput()
			outs[n], errs[n] = strings.TrimSpace(lastLine(string(out))), err
		}()
	}
	wg.Wait()
	for n, err := range errs {
		if err != nil {
			t.Fatalf("kafka.sh %s %d: %v\n%s", verb, n+1, err, outs[n])
		}
	}
	t.Logf("kafka.sh %s of every broker at once (%s): %s", verb, time.Since(start).Round(time.Millisecond), strings.Join(outs, "; "))
}

// StopAll stops every broker at once with SIGTERM (kafka.sh stop).
func (c *Cluster) StopAll(t testing.TB) { t.Helper(); c.run(t, "stop") }

// StartAll starts every broker that is not running, side by side, and
// waits until each serves (kafka.sh start).
func (c *Cluster) StartAll(t testing.TB) { t.Helper(); c.run(t, "start") }

// Pause SIGSTOPs broker n: it keeps its connections but answers nothing.
func (c *Cluster) Pause(t testing.TB, n int32) { t.Helper(); c.run(t, "pause-broker", fmt.Sprint(n)) }

// Resume SIGCONTs broker n.
func (c *Cluster) Resume(t testing.TB, n int32) { t.Helper(); c.run(t, "resume-broker", fmt.Sprint(n)) }

// admin returns an admin client that the caller closes.
func (c *Cluster) admin() (*kadm.Client, func(), error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.Brokers...), kgo.RequestTimeoutOverhead(5*time.Second))
	if err != nil {
		return nil, nil, err
	}
	return kadm.NewClient(cl), cl.Close, nil
}

// withAdmin calls f with an admin client and a context that ends after
// 30 s.
func (c *Cluster) withAdmin(t testing.TB, f func(context.Context, *kadm.Client)) {
	t.Helper()
	adm, done, err := c.admin()
	if err != nil {
		t.Fatal(err)
	}
	defer done()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	f(ctx, adm)
}

// Leaders returns, per broker, how many partitions of the topics it leads.
func (c *Cluster) Leaders(t testing.TB, topics ...string) map[int32]int {
	t.Helper()
	var td kadm.TopicDetails
	c.withAdmin(t, func(ctx context.Context, adm *kadm.Client) {
		var err error
		if td, err = adm.ListTopics(ctx, topics...); err != nil {
			t.Fatalf("metadata of %v: %v", topics, err)
		}
	})
	out := map[int32]int{}
	for _, d := range td {
		for _, p := range d.Partitions {
			if p.Leader >= 0 {
				out[p.Leader]++
			}
		}
	}
	return out
}

// MostLeader returns the broker that leads the most partitions of the
// topics (the lowest ID on a tie).
func (c *Cluster) MostLeader(t testing.TB, topics ...string) int32 {
	t.Helper()
	leaders := c.Leaders(t, topics...)
	ids := make([]int32, 0, len(leaders))
	for id := range leaders {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	best := int32(-1)
	for _, id := range ids {
		if best < 0 || leaders[id] > leaders[best] {
			best = id
		}
	}
	if best < 0 {
		t.Fatalf("no partition of %v has a leader", topics)
	}
	return best
}

// TxnCoordinator returns the broker that coordinates the transactional ID.
func (c *Cluster) TxnCoordinator(t testing.TB, txnID string) int32 {
	t.Helper()
	return c.coordinator(t, "transactional ID", txnID, func(ctx context.Context, adm *kadm.Client) kadm.FindCoordinatorResponses {
		return adm.FindTxnCoordinators(ctx, txnID)
	})
}

// GroupCoordinator returns the broker that coordinates the consumer group.
func (c *Cluster) GroupCoordinator(t testing.TB, group string) int32 {
	t.Helper()
	return c.coordinator(t, "group", group, func(ctx context.Context, adm *kadm.Client) kadm.FindCoordinatorResponses {
		return adm.FindGroupCoordinators(ctx, group)
	})
}

func (c *Cluster) coordinator(t testing.TB, what, name string, find func(context.Context, *kadm.Client) kadm.FindCoordinatorResponses) int32 {
	t.Helper()
	adm, done, err := c.admin()
	if err != nil {
		t.Fatal(err)
	}
	defer done()
	deadline := time.Now().Add(time.Minute)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		resp := find(ctx, adm)
		cancel()
		var last error
		for _, r := range resp {
			if r.Name == name && r.Err == nil {
				return r.NodeID
			}
			if r.Err != nil {
				last = r.Err
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no coordinator for %s %s after a minute: %v", what, name, last)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// WaitHealthy waits until every broker answers metadata that lists every
// broker and in which every partition of every topic, Kafka's internal ones
// included, has a leader and all its replicas in sync, so that the next
// fault takes away one broker of a whole cluster and never a second
// replica. Each broker is asked directly, with a new client each time (no
// cached metadata). It fails the test after d.
func (c *Cluster) WaitHealthy(t testing.TB, d time.Duration) {
	t.Helper()
	start := time.Now()
	for {
		last := c.health()
		if last == "" {
			t.Logf("cluster healthy after %s", time.Since(start).Round(time.Millisecond))
			return
		}
		if time.Since(start) > d {
			t.Fatalf("cluster not healthy after %s: %s", d, last)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// health returns "" for a healthy cluster, else what is wrong.
func (c *Cluster) health() string {
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.Brokers...))
	if err != nil {
		return err.Error()
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	for n := range c.Brokers {
		req := kmsg.NewPtrMetadataRequest()
		req.Topics = nil // every topic
		resp, err := req.RequestWith(ctx, cl.Broker(n+1))
		if err != nil {
			return fmt.Sprintf("broker %d: %v", n+1, err)
		}
		if len(resp.Brokers) != len(c.Brokers) {
			ids := make([]int32, len(resp.Brokers))
			for i, b := range resp.Brokers {
				ids[i] = b.NodeID
			}
			return fmt.Sprintf("broker %d lists brokers %v", n+1, ids)
		}
		for _, tp := range resp.Topics {
			for _, p := range tp.Partitions {
				if p.Leader < 0 || len(p.ISR) < len(p.Replicas) {
					name := ""
					if tp.Topic != nil {
						name = *tp.Topic
					}
					return fmt.Sprintf("broker %d: %s/%d: leader %d, in sync %v of %v", n+1, name, p.Partition, p.Leader, p.ISR, p.Replicas)
				}
			}
		}
	}
	return ""
}

// ActiveController returns the node that is the cluster's active KRaft
// controller (the leader of __cluster_metadata, as DescribeQuorum says):
// each node of the cluster is a broker and a controller, node n broker n.
func (c *Cluster) ActiveController(t testing.TB) int32 {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.Brokers...), kgo.RequestTimeoutOverhead(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	deadline := time.Now().Add(time.Minute)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		req := kmsg.NewPtrDescribeQuorumRequest()
		topic := kmsg.NewDescribeQuorumRequestTopic()
		topic.Topic = "__cluster_metadata"
		topic.Partitions = []kmsg.DescribeQuorumRequestTopicPartition{kmsg.NewDescribeQuorumRequestTopicPartition()}
		req.Topics = append(req.Topics, topic)
		resp, err := req.RequestWith(ctx, cl)
		cancel()
		if err == nil {
			err = kerr.ErrorForCode(resp.ErrorCode)
		}
		if err == nil && (len(resp.Topics) != 1 || len(resp.Topics[0].Partitions) != 1) {
			err = fmt.Errorf("DescribeQuorum answered %d topics", len(resp.Topics))
		}
		if err == nil {
			p := resp.Topics[0].Partitions[0]
			if err = kerr.ErrorForCode(p.ErrorCode); err == nil && p.LeaderID > 0 {
				return p.LeaderID
			}
			if err == nil {
				err = fmt.Errorf("no leader (%d)", p.LeaderID)
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no active controller after a minute: %v", err)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// WarmProducerIDs has every broker allocate a block of producer IDs from
// the active controller now, while every broker answers: it initialises,
// for each broker, a new transactional ID that broker coordinates (each
// must lead a partition of __transaction_state: see
// ElectPreferredCoordinators). A
// broker allocates its first block (Kafka keeps it in memory) for the
// first new producer ID it hands out; were the active controller paused
// then, the broker's request for it would wait controller.socket.timeout.ms
// (30 s) before the broker turned to the new controller
// (docs/operations.md, "One broker paused or killed").
func (c *Cluster) WarmProducerIDs(t testing.TB) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.Brokers...), kgo.RequestTimeoutOverhead(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	start := time.Now()
	for n := int32(1); int(n) <= len(c.Brokers); n++ {
		var txn string
		for i := 0; ; i++ {
			if i == 100 {
				t.Fatalf("no transactional ID of 100 tried is coordinated by broker %d", n)
			}
			if txn = Name(t, fmt.Sprintf("warm-%d", n)); c.TxnCoordinator(t, txn) == n {
				break
			}
		}
		if err := initProducerID(cl, txn, time.Minute); err != nil {
			t.Fatalf("warming broker %d's producer IDs: InitProducerID of %s: %v", n, txn, err)
		}
	}
	t.Logf("every broker holds a block of producer IDs (%s)", time.Since(start).Round(time.Millisecond))
}

// initProducerID initialises the transactional ID txn (InitProducerID,
// retried while its coordinator is loading), failing after d.
func initProducerID(cl *kgo.Client, txn string, d time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	for {
		req := kmsg.NewPtrInitProducerIDRequest()
		req.TransactionalID = &txn
		req.TransactionTimeoutMillis = 60000
		resp, err := req.RequestWith(ctx, cl)
		if err == nil {
			if err = kerr.ErrorForCode(resp.ErrorCode); err == nil {
				return nil
			}
		}
		if !kerr.IsRetriable(err) && !errors.Is(err, kerr.ConcurrentTransactions) || ctx.Err() != nil {
			return err
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// internalTopics are Kafka's topics whose partitions' leaders are the
// group and transaction coordinators.
var internalTopics = []string{"__consumer_offsets", "__transaction_state"}

// ElectPreferredCoordinators creates Kafka's internal topics if they do
// not exist yet (asking for a group's and a transactional ID's
// coordinator does) and elects each of their partitions' preferred
// leader, so that every broker coordinates its share of groups and
// transactional IDs: a broker paused or restarted by an earlier test leads
// none of them until Kafka's leader rebalance moves them back. The
// cluster must be healthy (Cluster.WaitHealthy).
func (c *Cluster) ElectPreferredCoordinators(t testing.TB) {
	t.Helper()
	c.GroupCoordinator(t, Name(t, "elect"))
	c.TxnCoordinator(t, Name(t, "elect"))
	var res kadm.ElectLeadersResults
	c.withAdmin(t, func(ctx context.Context, adm *kadm.Client) {
		td, err := adm.ListTopics(ctx, internalTopics...)
		if err == nil {
			err = td.Error()
		}
		if err != nil {
			t.Fatalf("metadata of %v: %v", internalTopics, err)
		}
		if res, err = adm.ElectLeaders(ctx, kadm.ElectPreferredReplica, td.TopicsSet()); err != nil {
			t.Fatalf("electing the preferred leaders of %v: %v", internalTopics, err)
		}
	})
	moved := 0
	for _, ps := range res {
		for _, r := range ps {
			switch {
			case r.Err == nil:
				moved++
			case !errors.Is(r.Err, kerr.ElectionNotNeeded):
				t.Fatalf("electing the preferred leader of %s/%d: %v %s", r.Topic, r.Partition, r.Err, r.ErrMessage)
			}
		}
	}
	t.Logf("preferred leaders of %v elected: %d partitions moved", internalTopics, moved)
}
