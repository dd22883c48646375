package stream

import (
	"context"
	"errors"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/meterline/meterline/internal/testenv"
)

// faultTxnTimeout is the transaction timeout of the broker-fault table's
// instances: every transient condition is held for longer than it.
const faultTxnTimeout = time.Second

// faultRequest is one request the runtime makes, and when: at "run" (a
// stage that owns its partitions and commits) or at "start" (a stage that
// joins the group, initialises its transactional ID and restores from the
// changelog).
type faultRequest struct {
	name string
	key  kmsg.Key
	at   string
	// fault selects the request on the suite's cluster (the suite's own
	// producer and admin client must not match while the fault is held).
	fault func(s *suite) kfake.Fault
	// anyKey faults every request fault selects, not only those of key.
	anyKey bool
	// drop reports whether a request of key is one to drop the connection
	// of; nil: every request of key.
	drop func(s *suite, req kmsg.Request) bool
}

// faultRequests are the requests of dedup's and the aggregator's runtime.
var faultRequests = map[string]faultRequest{
	"Produce": {key: kmsg.Produce, at: "run",
		fault: func(s *suite) kfake.Fault { return kfake.Fault{Topic: s.output} },
		drop:  func(s *suite, r kmsg.Request) bool { return producesTo(r.(*kmsg.ProduceRequest), s.output) }},
	"Metadata":        {key: kmsg.Metadata, at: "start", fault: func(s *suite) kfake.Fault { return kfake.Fault{Topic: s.output} }},
	"TxnOffsetCommit": {key: kmsg.TxnOffsetCommit, at: "run"},
	"EndTxn":          {key: kmsg.EndTxn, at: "run"},
	"InitProducerID":  {key: kmsg.InitProducerID, at: "start"},
	"FindCoordinator": {key: kmsg.FindCoordinator, at: "start"},
	"ListOffsets": {key: kmsg.ListOffsets, at: "start",
		fault: func(s *suite) kfake.Fault { return kfake.Fault{Topic: s.changelog} }},
	"Fetch input": {key: kmsg.Fetch, at: "run",
		fault: func(s *suite) kfake.Fault { return kfake.Fault{Topic: s.input} },
		drop:  func(s *suite, r kmsg.Request) bool { return fetches(r.(*kmsg.FetchRequest), s.input) }},
	"Fetch changelog": {key: kmsg.Fetch, at: "start",
		fault: func(s *suite) kfake.Fault { return kfake.Fault{Topic: s.changelog} },
		drop:  func(s *suite, r kmsg.Request) bool { return fetches(r.(*kmsg.FetchRequest), s.changelog) }},
	"OffsetFetch": {key: kmsg.OffsetFetch, at: "start"},
	"Heartbeat":   {key: kmsg.Heartbeat, at: "run"},
	"JoinGroup":   {key: kmsg.JoinGroup, at: "start"},
	"SyncGroup":   {key: kmsg.SyncGroup, at: "start"},
}

// producesTo reports whether r produces to topic, named by ID from v13.
func producesTo(r *kmsg.ProduceRequest, topic string) bool {
	return slices.ContainsFunc(r.Topics, func(t kmsg.ProduceRequestTopic) bool { return t.Topic == topic || t.TopicID == topicIDs.get(topic) })
}

// fetches reports whether r fetches topic. A fetch names its topics by ID
// (v13+), by name before.
func fetches(r *kmsg.FetchRequest, topic string) bool {
	return slices.ContainsFunc(r.Topics, func(t kmsg.FetchRequestTopic) bool { return t.Topic == topic || t.TopicID == topicIDs.get(topic) })
}

// errDrop is a dropped connection: a control returning an error closes
// the client's connection.
var errDrop = errors.New("connection dropped")

var (
	leaderNotAvailable = kerr.LeaderNotAvailable
	notLeader          = kerr.NotLeaderForPartition
	timedOut           = kerr.RequestTimedOut
	notEnoughReplicas  = kerr.NotEnoughReplicas
	coordNotAvailable  = kerr.CoordinatorNotAvailable
	notCoord           = kerr.NotCoordinator
	coordLoading       = kerr.CoordinatorLoadInProgress
	concurrent         = kerr.ConcurrentTransactions
	dropped            = (*kerr.Error)(nil) // the connection is closed instead
)

// transientFaults are the transient conditions held on each request, the
// ones a broker answers that request with.
var transientFaults = map[string][]*kerr.Error{
	"Produce":         {leaderNotAvailable, notLeader, timedOut, notEnoughReplicas, kerr.NotEnoughReplicasAfterAppend, kerr.KafkaStorageError, kerr.UnknownTopicOrPartition, dropped},
	"Metadata":        {leaderNotAvailable, dropped},
	"TxnOffsetCommit": {coordNotAvailable, notCoord, coordLoading, timedOut, dropped},
	"EndTxn":          {coordNotAvailable, notCoord, coordLoading, concurrent, timedOut, dropped},
	"InitProducerID":  {coordNotAvailable, notCoord, coordLoading, concurrent, timedOut, dropped},
	"FindCoordinator": {coordNotAvailable, dropped},
	"ListOffsets":     {leaderNotAvailable, notLeader, timedOut, dropped},
	"Fetch input":     {notLeader, kerr.UnknownTopicOrPartition, kerr.FencedLeaderEpoch, kerr.KafkaStorageError, dropped},
	"Fetch changelog": {notLeader, kerr.UnknownTopicOrPartition, kerr.FencedLeaderEpoch, kerr.KafkaStorageError, dropped},
	"OffsetFetch":     {coordNotAvailable, notCoord, coordLoading, timedOut, dropped},
	"Heartbeat":       {coordNotAvailable, notCoord, dropped},
	"JoinGroup":       {coordNotAvailable, notCoord, coordLoading, dropped},
	"SyncGroup":       {coordNotAvailable, notCoord, dropped},
}

// shortFaults are the cases go test -short runs: every request, every
// condition, not every pair.
var shortFaults = map[string]bool{
	"Produce/LEADER_NOT_AVAILABLE": true, "Produce/REQUEST_TIMED_OUT": true, "Produce/NOT_ENOUGH_REPLICAS": true, "Produce/dropped": true,
	"Metadata/LEADER_NOT_AVAILABLE": true, "EndTxn/CONCURRENT_TRANSACTIONS": true,
	"EndTxn/NOT_COORDINATOR": true, "TxnOffsetCommit/COORDINATOR_LOAD_IN_PROGRESS": true,
	"EndTxn/COORDINATOR_NOT_AVAILABLE": true, "EndTxn/dropped": true, "InitProducerID/CONCURRENT_TRANSACTIONS": true,
	"FindCoordinator/COORDINATOR_NOT_AVAILABLE": true, "ListOffsets/NOT_LEADER_FOR_PARTITION": true,
	"Fetch input/dropped": true, "Fetch changelog/NOT_LEADER_FOR_PARTITION": true, "OffsetFetch/NOT_COORDINATOR": true,
	"Heartbeat/NOT_COORDINATOR": true, "JoinGroup/COORDINATOR_LOAD_IN_PROGRESS": true, "SyncGroup/dropped": true,
}

func faultName(err *kerr.Error) string {
	if err == nil {
		return "dropped"
	}
	return err.Message
}

// hold installs the condition err (nil: dropped connections) on request
// rq and returns how many requests it answered so far and its removal.
func (s *suite) hold(rq faultRequest, err *kerr.Error) (hits func() int, remove func()) {
	if err == nil {
		var on atomic.Bool
		var n atomic.Int64
		on.Store(true)
		s.cluster.ControlKey(rq.key.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
			if !on.Load() {
				s.cluster.DropControl()
				return nil, nil, false
			}
			s.cluster.KeepControl()
			if rq.drop != nil && !rq.drop(s, req) {
				return nil, nil, false
			}
			n.Add(1)
			return nil, errDrop, true
		})
		return func() int { return int(n.Load()) }, func() { on.Store(false) }
	}
	f := kfake.Fault{}
	if rq.fault != nil {
		f = rq.fault(s)
	}
	f.Err, f.Count = err, -1
	if !rq.anyKey {
		f.Keys = []kmsg.Key{rq.key}
	}
	h := s.cluster.Fault(f)
	return h.Hits, h.Remove
}

// TestTransientBrokerFaultsNeverStopTheStage holds each transient
// condition a broker answers a request of the runtime with for longer than
// the transaction timeout, then removes it: the stage does not stop, and
// afterwards every input is counted once (docs/design.md, Exactly-once,
// 5).
func TestTransientBrokerFaultsNeverStopTheStage(t *testing.T) {
	t.Parallel()
	for _, name := range slices.Sorted(maps.Keys(transientFaults)) {
		for _, err := range transientFaults[name] {
			c := name + "/" + faultName(err)
			t.Run(strings.ReplaceAll(c, " ", "_"), func(t *testing.T) {
				if testing.Short() && !shortFaults[c] {
					t.Skip("go test -short runs a few conditions of each request")
				}
				t.Parallel()
				transientFault(t, faultRequests[name], err)
			})
		}
	}
}

// shortTxn is the broker-fault table's instances' configuration.
func shortTxn(c *Config, _ *countProc) { c.TransactionTimeout = faultTxnTimeout }

// faultWorld starts instance a on fs, which counts 20 inputs, and stops
// it when the condition of rq is to be held at start.
func faultWorld(t *testing.T, rq faultRequest) (s *suite, a *instance, fs vfs.FS) {
	s = newSuite(t, nil, nil)
	s.registerTopicIDs()
	fs = vfs.NewMem()
	a = s.start("a", fs, shortTxn)
	s.send(20)
	s.caughtUp()
	if rq.at == "start" {
		a.shutdown()
	}
	return s, a, fs
}

func transientFault(t *testing.T, rq faultRequest, err *kerr.Error) {
	s, last, fs := faultWorld(t, rq)
	s.send(20)
	hits, remove := s.hold(rq, err)
	if rq.at == "start" {
		fs = vfs.NewMem() // a restore from the changelog
		last = s.start("b", fs, shortTxn)
	}
	s.waitFor("the condition to answer a request", func() bool { return hits() > 0 })
	until := time.Now().Add(faultTxnTimeout + faultTxnTimeout/2)
	s.waitFor("the condition to be held past the transaction timeout", func() bool { return time.Now().After(until) })
	remove()
	s.caughtUp()
	s.finish(last, fs)
}

// TestPermanentBrokerFaultsStopTheStage: a condition no retry repairs
// stops the stage with an error naming it, with nothing of the failed
// transaction committed; started again without it, the stage counts every
// input once.
func TestPermanentBrokerFaultsStopTheStage(t *testing.T) {
	t.Parallel()
	// A principal that loses Write on the transactional ID (or on the
	// output topic) is refused every request naming it.
	txnID := faultRequest{anyKey: true, at: "run", fault: func(s *suite) kfake.Fault { return kfake.Fault{TxnID: s.group + "-a"} }}
	output := faultRequest{anyKey: true, at: "run", fault: func(s *suite) kfake.Fault { return kfake.Fault{Topic: s.output} }}
	for _, c := range []struct {
		request string
		rq      faultRequest
		err     *kerr.Error
	}{
		{"Produce", faultRequests["Produce"], kerr.TopicAuthorizationFailed},
		{"Produce", faultRequests["Produce"], kerr.InvalidRecord},
		{"Produce", faultRequests["Produce"], kerr.MessageTooLarge},
		{"output", output, kerr.TopicAuthorizationFailed},
		{"transactional_ID", txnID, kerr.TransactionalIDAuthorizationFailed},
		{"EndTxn", faultRequests["EndTxn"], kerr.TransactionalIDAuthorizationFailed},
		{"InitProducerID", faultRequests["InitProducerID"], kerr.TransactionalIDAuthorizationFailed},
		{"TxnOffsetCommit", faultRequests["TxnOffsetCommit"], kerr.GroupAuthorizationFailed},
		{"Fetch input", faultRequests["Fetch input"], kerr.TopicAuthorizationFailed},
	} {
		t.Run(strings.ReplaceAll(c.request+"/"+c.err.Message, " ", "_"), func(t *testing.T) {
			t.Parallel()
			permanentFault(t, c.rq, c.err)
		})
	}
}

func permanentFault(t *testing.T, rq faultRequest, err *kerr.Error) {
	s, a, fs := faultWorld(t, rq)
	before := s.committedOutputs()
	// Held before the inputs are sent, or a running stage could commit
	// them first.
	_, remove := s.hold(rq, err)
	s.send(20)
	if rq.at == "start" {
		a = s.start("a", fs, shortTxn)
	}
	got := a.exit()
	if got == nil || !strings.Contains(got.Error(), err.Message) {
		t.Fatalf("Run = %v, want it to stop on %s", got, err.Message)
	}
	remove()
	if after := s.committedOutputs(); after != before {
		t.Errorf("%d outputs committed before the condition, %d after the stage stopped on it; want none committed", before, after)
	}
	a = s.start("a", fs, shortTxn)
	s.caughtUp()
	s.finish(a, fs)
}

// committedOutputs counts the committed output records.
func (s *suite) committedOutputs() int {
	s.t.Helper()
	return len(testenv.ReadAll(s.t, s.brokers, s.output))
}

// topicIDs maps the suites' topic names to their IDs, for the controls
// that select fetches (by ID from v13).
var topicIDs = topicIDMap{m: map[string][16]byte{}}

type topicIDMap struct {
	mu sync.Mutex
	m  map[string][16]byte
}

func (m *topicIDMap) get(topic string) [16]byte {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.m[topic]
}

// registerTopicIDs looks up the suite's topics' IDs.
func (s *suite) registerTopicIDs() {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	td, err := s.adm.ListTopics(ctx, s.input, s.output, s.changelog)
	if err != nil {
		s.t.Fatal(err)
	}
	topicIDs.mu.Lock()
	defer topicIDs.mu.Unlock()
	for _, d := range td {
		topicIDs.m[d.Topic] = d.ID
	}
}

// TestRestoreWaitsOutALeaderlessChangelog: a restore whose changelog
// partition has no leader (its only replica on a broker that is down)
// waits for one for as long as it takes, as a running stage waits for the
// leaders of its outputs, rather than stop the stage after its listings
// ran out; once the leader is back, every input is counted once. Not
// parallel: it shortens listRetry, so that the wait outlasts what were a
// minute of listings in a few seconds.
func TestRestoreWaitsOutALeaderlessChangelog(t *testing.T) {
	defer func(d time.Duration) { listRetry = d }(listRetry)
	listRetry = 5 * time.Millisecond
	s := newSuite(t, nil, nil)
	a := s.start("a", vfs.NewMem())
	s.send(20)
	s.caughtUp()
	a.shutdown()
	s.send(20)
	gone := s.cluster.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.ListOffsets}, Topic: s.changelog, Err: kerr.LeaderNotAvailable, Count: -1})
	fs := vfs.NewMem()
	b := s.start("b", fs)
	// Longer than 240 listings (both partitions' restores list), each
	// answered at once.
	until := time.Now().Add(240*listRetry + 3*time.Second)
	s.waitFor("the changelog's leader to be gone for a while", func() bool { return gone.Hits() > 240 && time.Now().After(until) })
	gone.Remove()
	s.caughtUp()
	s.finish(b, fs)
}
