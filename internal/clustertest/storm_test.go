package clustertest

import (
	"math/rand"
	"testing"
	"time"
)

// TestRealClusterRebalanceStorm makes instances of every stage join and
// leave every few seconds, for a minute in the long version (make chaos)
// and 25 seconds in the short one (make test), with the pipeline under
// load on the three-broker cluster: some leave with SIGTERM, others with
// kill -9, and every stage keeps one to three instances. Afterwards every
// partition catches up (none is stuck) and every output reconciles exactly
// with the generator's truth (no double counting).
func TestRealClusterRebalanceStorm(t *testing.T) {
	storm, rate, cutoffIn := 25*time.Second, 150, 20*time.Second
	if long() {
		storm, rate, cutoffIn = 70*time.Second, 300, 40*time.Second
	}
	s := newSuite(t, cutoffIn)
	s.startAll()
	g := s.generate(rate)
	s.sleep(5 * time.Second)

	rng := rand.New(rand.NewSource(time.Now().UnixNano()))
	ids := []string{"i1", "i2", "i3"}
	start := time.Now()
	changes := 0
	for time.Since(start) < storm {
		st := stages[rng.Intn(len(stages))]
		run := s.running(st)
		join := len(run) == 1 || (len(run) < len(ids) && rng.Intn(2) == 0)
		switch {
		case join:
			for _, id := range ids {
				if p := s.proc(st, id); p == nil || p.Exited() {
					s.note("storm: %s %s joins", st, id)
					s.start(st, id)
					break
				}
			}
		case rng.Intn(2) == 0:
			id := run[rng.Intn(len(run))]
			s.note("storm: %s %s leaves (SIGTERM)", st, id)
			s.stop(st, id)
		default:
			id := run[rng.Intn(len(run))]
			s.note("storm: %s %s dies (kill -9)", st, id)
			s.kill(st, id)
		}
		changes++
		s.sleep(time.Duration(2000+rng.Intn(2000)) * time.Millisecond)
	}
	s.note("storm: %d joins and leaves in %s", changes, time.Since(start).Round(time.Second))
	if wait := time.Until(time.UnixMilli(s.cutoff).Add(10 * time.Second)); wait > 0 {
		s.sleep(wait)
	}
	s.finish(g)
}
