package clustertest

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"

	"github.com/meterline/meterline/internal/kafka"
	"github.com/meterline/meterline/internal/session"
	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/internal/topics"
)

// TestRealClusterSilentSeed pauses a broker (SIGSTOP: its port takes
// connections, nothing is answered), the first of a stage's two seed
// brokers, the coordinator of its consumer group and the cluster's active
// controller, under a session's loop (docs/operations.md, "One broker
// paused or killed"):
//   - closing the session returns within its bounds (session.LeaveTimeout
//     for the LeaveGroup the coordinator never answers, then
//     session.CloseTimeout for the client), not once the coordinator
//     moved;
//   - once the cluster fenced the broker and its partitions' leaders
//     dropped it from their in-sync replicas, three new sessions in a row
//     (of another group), seeded with the paused broker first, each
//     initialise the transactional ID and join the group within seconds,
//     not after the InitProducerID's bound or once the broker is back.
//
// Before the pause, the internal topics' preferred leaders are elected
// (a broker paused by an earlier test may coordinate nothing, the active
// controller included) and every broker allocates a block of producer
// IDs (Cluster.WarmProducerIDs). A broker allocates its first one from the
// active controller when it hands out its first new producer ID, and with
// that controller paused the request waits controller.socket.timeout.ms
// (30 s) before the broker turns to the new controller: a new
// transactional ID coordinated by such a broker is not initialised
// before then, by any client. That is Kafka's, and documented; what this
// test proves is that our client, given brokers that can answer, does
// not wait for the silent one.
//
// It takes about 20 s.
func TestRealClusterSilentSeed(t *testing.T) {
	cluster := testenv.RealCluster(t)
	b := cluster.Brokers
	topic := testenv.Name(t, "silentseed")
	adm := testenv.Admin(t, b)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := adm.CreateTopic(ctx, 1, 3, nil, topic); err != nil {
		t.Fatal(err)
	}
	if err := topics.WaitVisible(ctx, adm, topic); err != nil {
		t.Fatal(err)
	}
	// The broker to pause is the group's coordinator, the first seed and
	// the active controller.
	n := cluster.ActiveController(t)
	cluster.ElectPreferredCoordinators(t)
	group := groupOn(t, cluster, n)
	seeds := []string{b[n-1], b[n%int32(len(b))]}
	cluster.WarmProducerIDs(t)
	l := newLoop(t, seeds, group)
	sess := openJoined(t, l, topic, "before the pause", time.Minute)
	cluster.Pause(t, n)
	paused := time.Now()
	l.Close(sess)
	if took, bound := time.Since(paused), session.LeaveTimeout+session.CloseTimeout+time.Second; took > bound {
		t.Errorf("closing a session whose group coordinator is paused took %s, want at most %s", took.Round(time.Millisecond), bound)
	}

	// The controller fences the broker after broker.session.timeout.ms (9 s)
	// and then lists only the two others.
	waitFenced(t, b, n, paused)
	ask, err := kgo.NewClient(kgo.SeedBrokers(seeds[1]))
	if err != nil {
		t.Fatal(err)
	}
	defer ask.Close()
	// A write to a partition whose in-sync replicas still name the paused
	// broker (InitProducerID's to __transaction_state, the group's to
	// __consumer_offsets) waits until its leader drops it, up to
	// replica.lag.time.max.ms (10 s) after the pause and later on a busy
	// machine: Kafka's timing, which no client can shorten. The sessions
	// are timed once it has.
	waitOutOfISR(t, kadm.NewClient(ask), n, paused, topic, "__consumer_offsets", "__transaction_state")
	// Another group: the first one's member, whose leave the paused
	// coordinator never heard, holds its rebalance for its session
	// timeout.
	after := loopConfig(seeds, testenv.Name(t, "silentseed-after"))
	// And until the cluster names the coordinators of the group and of the
	// transactional ID the sessions use: one that moved off the paused
	// broker is elected and loaded on a live one, and a client retries
	// meanwhile with a growing backoff.
	waitCoordinators(t, kadm.NewClient(ask), paused, after.Group, after.TransactionalID())
	// Its sessions log from info up: should one outlast sessionWithin, the
	// log says which broker it waited for.
	l = newLoopOf(t, after, zap.InfoLevel)
	for i := range 3 {
		l.Close(openJoined(t, l, topic, fmt.Sprintf("session %d with seed broker %d paused", i+1, n), sessionWithin))
	}
	cluster.Resume(t, n)
	cluster.WaitHealthy(t, healthyTimeout)
}

// groupOn returns a new group that broker n coordinates.
func groupOn(t *testing.T, cluster *testenv.Cluster, n int32) string {
	t.Helper()
	for range 100 {
		if group := testenv.Name(t, "silentseed"); cluster.GroupCoordinator(t, group) == n {
			return group
		}
	}
	t.Fatalf("no group of 100 tried is coordinated by broker %d", n)
	return ""
}

// sessionWithin bounds a session's InitProducerID and join once the paused
// broker is out of the cluster's metadata and in-sync replicas: a session
// whose requests still went to it would wait twice kgo's request timeout
// overhead (20 s in plaintext) for each, and InitProducerID's bound is 20 s.
const sessionWithin = 15 * time.Second

// waitOutOfISR waits until no partition of topics has broker n among its
// in-sync replicas, failing the test 45 s after since.
func waitOutOfISR(t *testing.T, adm *kadm.Client, n int32, since time.Time, topics ...string) {
	t.Helper()
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		td, err := adm.ListTopics(ctx, topics...)
		cancel()
		var in []string
		if err == nil {
			err = td.Error()
		}
		for _, d := range td {
			for _, p := range d.Partitions {
				if slices.Contains(p.ISR, n) {
					in = append(in, fmt.Sprintf("%s/%d", d.Topic, p.Partition))
				}
			}
		}
		if err == nil && len(in) == 0 {
			t.Logf("broker %d out of every in-sync replica set %s after the pause", n, time.Since(since).Round(100*time.Millisecond))
			return
		}
		if time.Since(since) > 45*time.Second {
			t.Fatalf("45 s after the pause, broker %d is still in sync on %v (%v)", n, in, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// waitCoordinators waits until the cluster names a coordinator for group
// and for the transactional ID txn, failing the test 45 s after since.
func waitCoordinators(t *testing.T, adm *kadm.Client, since time.Time, group, txn string) {
	t.Helper()
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := adm.FindGroupCoordinators(ctx, group).Error()
		if err == nil {
			err = adm.FindTxnCoordinators(ctx, txn).Error()
		}
		cancel()
		if err == nil {
			t.Logf("coordinators of the group and the transactional ID found %s after the pause", time.Since(since).Round(100*time.Millisecond))
			return
		}
		if time.Since(since) > 45*time.Second {
			t.Fatalf("45 s after the pause, no coordinator for group %s or transactional ID %s: %v", group, txn, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// loopConfig is the session configuration of instance i1 of group,
// seeded with seeds, with the timings of the suite's stages.
func loopConfig(seeds []string, group string) session.Config {
	c := session.Config{Kafka: kafka.Config{Brokers: seeds}, Group: group, InstanceID: "i1",
		SessionTimeout: sessionTimeout, TransactionTimeout: transactionTimeout, RebalanceTimeout: rebalanceTimeout}
	c.EnsureDefaults()
	return c
}

// newLoop returns the session loop of loopConfig(seeds, group).
func newLoop(t *testing.T, seeds []string, group string) *session.Loop {
	t.Helper()
	return newLoopOf(t, loopConfig(seeds, group), zap.WarnLevel)
}

// newLoopOf returns the session loop of c, logging from level up.
func newLoopOf(t *testing.T, c session.Config, level zapcore.Level) *session.Loop {
	t.Helper()
	l, err := session.NewLoop(c, zaptest.NewLogger(t, zaptest.Level(level)),
		session.NewMetrics(prometheus.NewRegistry(), session.Names{RecordsIn: "in_total", Transactions: "txn_total",
			CommitSeconds: "commit_seconds", Restarts: "restarts_total", Member: "member"}, "records"), "")
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// openJoined opens a session of l consuming topic, initialises its
// transactional ID and waits until it is in its group, failing the test
// after within.
func openJoined(t *testing.T, l *session.Loop, topic, what string, within time.Duration) *kgo.GroupTransactSession {
	t.Helper()
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	waits := &brokerWaits{start: start}
	sess, err := l.Open([]string{topic}, session.Hooks{
		Assigned: func(_ context.Context, offs map[string]map[int32]kgo.Offset) (map[string]map[int32]kgo.Offset, error) {
			return offs, nil
		},
		Revoked: func(context.Context, *kgo.Client, map[string][]int32) {},
	}, kgo.WithHooks(waits))
	if err != nil {
		t.Fatal(err)
	}
	err = testenv.InitAndJoin(ctx, func(ctx context.Context) error { return l.InitProducerID(ctx, sess.Client()) }, l.InGroup,
		func(ctx context.Context) { sess.PollFetches(ctx) })
	if err != nil {
		l.Close(sess)
		t.Fatalf("%s: transactional ID initialised and group joined: not after %s: %v; %s", what, time.Since(start).Round(time.Millisecond), err, waits)
	}
	t.Logf("%s: transactional ID initialised and group joined in %s; %s", what, time.Since(start).Round(time.Millisecond), waits)
	return sess
}

// brokerWaits records the connections and requests of a session's client
// that took over slowBroker, with their errors (a kgo hook), so that
// openJoined says which broker a slow session waited for, and for what: a paused
// broker holds each for the dial timeout or kgo's request timeout
// overhead (10 s in plaintext). The session's own log says whether it
// started from the brokers the cluster listed or from its seeds.
type brokerWaits struct {
	start time.Time
	mu    sync.Mutex
	seen  []string
}

// slowBroker is the time above which brokerWaits records a connection or
// a request: an answering broker takes milliseconds, on a busy machine
// too.
const slowBroker = time.Second

var (
	_ kgo.HookBrokerConnect = (*brokerWaits)(nil)
	_ kgo.HookBrokerE2E     = (*brokerWaits)(nil)
)

func (w *brokerWaits) OnBrokerConnect(meta kgo.BrokerMetadata, dial time.Duration, _ net.Conn, err error) {
	if dial > slowBroker {
		w.add(meta, "connection", dial, err)
	}
}

func (w *brokerWaits) OnBrokerE2E(meta kgo.BrokerMetadata, key int16, e2e kgo.BrokerE2E) {
	if took := e2e.DurationE2E(); took > slowBroker {
		w.add(meta, kmsg.NameForKey(key), took, e2e.Err())
	}
}

// add records what (a request's name, or a connection) to the broker of
// meta, which took took and ended with err, with the time since the
// session opened.
func (w *brokerWaits) add(meta kgo.BrokerMetadata, what string, took time.Duration, err error) {
	broker := "seed " + net.JoinHostPort(meta.Host, strconv.Itoa(int(meta.Port)))
	if meta.NodeID >= 0 {
		broker = fmt.Sprintf("broker %d (%s)", meta.NodeID, net.JoinHostPort(meta.Host, strconv.Itoa(int(meta.Port))))
	}
	line := fmt.Sprintf("at +%s %s to %s took %s", time.Since(w.start).Round(time.Millisecond), what, broker, took.Round(time.Millisecond))
	if err != nil {
		line += ": " + err.Error()
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.seen = append(w.seen, line)
}

func (w *brokerWaits) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.seen) == 0 {
		return fmt.Sprintf("no connection or request over %s", slowBroker)
	}
	return fmt.Sprintf("connections and requests over %s: %s", slowBroker, strings.Join(w.seen, "; "))
}
