package clustertest

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/meterline/meterline/internal/topics"
)

// brokerFault is one failure of one broker.
type brokerFault struct {
	name   string
	target func(s *suite) int32 // the broker to hit, chosen at that moment
	pause  bool                 // SIGSTOP for longer than the session timeouts, instead of kill -9
	stop   bool                 // SIGTERM (stop-broker), instead of kill -9
}

// The faults of docs/operations.md, Replication: the pipeline survives the
// loss of any one broker, the transaction and group coordinators included.
var brokerFaults = []brokerFault{
	{name: "the broker leading the most partitions", target: func(s *suite) int32 {
		return s.cluster.MostLeader(s.t, s.topicNames()...)
	}},
	{name: "the transaction coordinator of dedup i1", target: func(s *suite) int32 {
		return s.cluster.TxnCoordinator(s.t, s.txnID("dedup", "i1"))
	}},
	{name: "the group coordinator of the aggregator", target: func(s *suite) int32 {
		return s.cluster.GroupCoordinator(s.t, s.group("aggregate"))
	}},
	{name: "the transaction coordinator of sink i2", target: func(s *suite) int32 {
		return s.cluster.TxnCoordinator(s.t, s.txnID("sink", "i2"))
	}},
	{name: "the broker leading the most partitions, stopped (a controlled shutdown)", stop: true, target: func(s *suite) int32 {
		return s.cluster.MostLeader(s.t, s.topicNames()...)
	}},
	{name: "the group coordinator of dedup, paused", pause: true, target: func(s *suite) int32 {
		return s.cluster.GroupCoordinator(s.t, s.group("dedup"))
	}},
}

// topicNames are the suite's topics, every one of topics.Specs.
func (s *suite) topicNames() []string {
	var ns []string
	for _, sp := range topics.Specs(s.names, topics.DefaultLayout()) {
		ns = append(ns, sp.Name)
	}
	return ns
}

// TestRealClusterBrokerFailures runs the pipeline under load on the
// three-broker cluster and takes one broker away at a time: kill -9 and
// restart the broker that leads the most partitions, the transaction
// coordinator of a stage's transactional ID, the group coordinator, and
// SIGSTOP a broker for longer than the session timeouts; meanwhile it
// kill -9s stage instances and restarts them. Afterwards every output
// reconciles exactly with the generator's truth. The short version (make
// test) goes through each fault once; the long one (make chaos) three
// times at a higher rate.
func TestRealClusterBrokerFailures(t *testing.T) {
	// The short version: the broker leading the most partitions killed
	// and restarted, a group coordinator paused (a broker restart costs
	// about a minute on a loaded 2-core machine).
	rounds, rate, cutoffIn, faults := 1, 100, 40*time.Second, []brokerFault{brokerFaults[0], brokerFaults[len(brokerFaults)-1]}
	if long() {
		rounds, rate, cutoffIn, faults = 3, 300, 4*time.Minute, brokerFaults
	}
	s := newSuite(t, cutoffIn)
	s.startAll()
	g := s.generate(rate)
	s.cluster.WaitHealthy(t, healthyTimeout)
	s.sleep(5 * time.Second) // every stage under load before the first fault

	victim := 0
	nextStage := func() (string, string) {
		st, id := stages[victim%len(stages)], []string{"i1", "i2"}[(victim/len(stages))%2]
		victim++
		return st, id
	}
	start := time.Now()
	checked := false
	for round := 0; round < rounds; round++ {
		for _, f := range faults {
			b := f.target(s)
			s.note("round %d: %s is broker %d (at %s)", round+1, f.name, b, time.Since(start).Round(time.Second))
			switch {
			case f.pause:
				s.cluster.Pause(t, b)
			case f.stop:
				s.cluster.Stop(t, b)
			default:
				s.cluster.Kill(t, b)
			}
			// While the broker is away: kill -9 a stage instance and
			// restart it at once (the same instance ID, so its
			// transactional ID fences the dead one).
			s.sleep(2 * time.Second)
			if code, out := s.cluster.Status(t); code != 3 || !strings.Contains(out, fmt.Sprintf("broker %d: %s", b, map[bool]string{true: "paused", false: "stopped"}[f.pause])) {
				t.Errorf("kafka.sh status with broker %d down: exit %d, want 3 and it named\n%s", b, code, out)
			}
			if !f.pause && !checked {
				// An operator sees it: topics check reports the
				// partitions that lost a replica.
				// The controller takes the dead broker out of the
				// ISRs once its session (9 s) expires.
				checked = true
				var code int
				var out string
				for end := time.Now().Add(45 * time.Second); time.Now().Before(end); s.sleep(2 * time.Second) {
					if code, out = s.topicsCheck(); code == 1 && strings.Contains(out, "under-replicated partitions is ") {
						break
					}
				}
				if code != 1 || !strings.Contains(out, "under-replicated partitions is ") {
					t.Errorf("topics check with broker %d down: exit %d, want 1 and under-replicated partitions:\n%s", b, code, out)
				}
			}
			st, id := nextStage()
			s.kill(st, id)
			s.start(st, id)
			if f.pause {
				// Longer than the brokers' session (9 s) and the
				// stages' (6 s): the paused broker is fenced and its
				// members' sessions on it expire.
				s.sleep(15 * time.Second)
				s.cluster.Resume(t, b)
			} else {
				s.sleep(3 * time.Second)
				s.cluster.Start(t, b)
			}
			if code, out := s.cluster.Status(t); code != 0 || strings.Count(out, ": running pid=") != len(s.brokers) {
				t.Errorf("kafka.sh status after broker %d returned: exit %d\n%s", b, code, out)
			}
			s.checkAlive()
			// One broker at a time: the next fault waits until every
			// replica is back in sync.
			s.cluster.WaitHealthy(t, healthyTimeout)
		}
	}
	// A last instance of each stage dies with the pipeline under load.
	for range stages {
		st, id := nextStage()
		s.kill(st, id)
		s.start(st, id)
	}
	if wait := time.Until(time.UnixMilli(s.cutoff).Add(10 * time.Second)); wait > 0 {
		s.note("load goes on %s, past P's cutoff", wait.Round(time.Second))
		s.sleep(wait)
	}
	s.note("faults done after %s", time.Since(start).Round(time.Second))
	if code, out := s.topicsCheck(); code != 0 {
		t.Errorf("topics check on the healed cluster: exit %d\n%s", code, out)
	}
	s.finish(g)
}
