package clustertest

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// clusterOutage is one loss of the whole cluster.
type clusterOutage struct {
	name  string
	stop  bool // SIGTERM to every broker at once (kafka.sh stop), instead of kill -9
	pause bool // SIGSTOP every broker, and SIGCONT after the outage, instead of kill -9
	// restartStage kill -9s an instance of the stage during the outage and
	// starts it again while no broker serves.
	restartStage string
}

// TestRealClusterOutage stops every broker of the cluster at once while the
// load runs, for longer than the stages' sessions (6 s) and transactions
// (10 s) and the brokers' own sessions (9 s), and then starts them again:
// no stage instance may exit by itself, during the outage or after it;
// every one must be ready again once the cluster serves; and every output
// reconciles exactly with the generator's truth. The short version (make
// test) kills the brokers with kill -9 once; the long one (make chaos)
// also stops them with SIGTERM and freezes them with SIGSTOP, for longer,
// and restarts a stage instance while the cluster is down.
func TestRealClusterOutage(t *testing.T) {
	// Down for 11 s, and then for as long as the brokers take to start
	// (20 s on a loaded 2-core machine): longer than every timeout above.
	outages, down, rate, cutoffIn := []clusterOutage{{name: "kill -9"}}, 11*time.Second, 100, 25*time.Second
	if long() {
		outages = []clusterOutage{
			{name: "kill -9", restartStage: "aggregate"},
			{name: "SIGTERM (a controlled shutdown of every broker)", stop: true, restartStage: "dedup"},
			{name: "SIGSTOP (every broker frozen, its connections open)", pause: true, restartStage: "sink"},
		}
		down, rate, cutoffIn = 40*time.Second, 300, 2*time.Minute
	}
	s := newSuite(t, cutoffIn)
	s.startAll()
	g := s.generate(rate)
	s.cluster.WaitHealthy(t, healthyTimeout)
	s.waitReady(time.Minute)
	s.sleep(5 * time.Second) // every stage under load, transactions open

	start := time.Now()
	for i, o := range outages {
		s.note("outage %d: every broker, %s (at %s)", i+1, o.name, time.Since(start).Round(time.Second))
		switch {
		case o.stop:
			s.cluster.StopAll(t)
		case o.pause:
			s.cluster.PauseAll(t)
		default:
			s.cluster.KillAll(t)
		}
		if code, out := s.cluster.Status(t); code != 3 || strings.Count(out, ": running pid=") != 0 {
			t.Errorf("kafka.sh status with every broker down: exit %d, want 3 and none running\n%s", code, out)
		}
		if o.restartStage != "" {
			s.sleep(3 * time.Second)
			s.kill(o.restartStage, "i1")
			s.start(o.restartStage, "i1")
		}
		s.sleep(down) // an exit meanwhile is recorded and restarted (checkAlive)
		if o.pause {
			s.cluster.ResumeAll(t)
		} else {
			s.cluster.StartAll(t)
		}
		back := time.Now()
		if code, out := s.cluster.Status(t); code != 0 || strings.Count(out, ": running pid=") != len(s.brokers) {
			t.Errorf("kafka.sh status after the outage: exit %d\n%s", code, out)
		}
		s.waitReady(2 * time.Minute)
		s.note("outage %d: the cluster serves again after %s, every stage instance ready %s later",
			i+1, time.Since(start).Round(time.Second), time.Since(back).Round(time.Second))
		s.cluster.WaitHealthy(t, healthyTimeout)
		if i < len(outages)-1 {
			s.sleep(5 * time.Second) // under load again before the next
		}
	}
	if wait := time.Until(time.UnixMilli(s.cutoff).Add(10 * time.Second)); wait > 0 {
		s.note("load goes on %s, past P's cutoff", wait.Round(time.Second))
		s.sleep(wait)
	}
	s.note("outages done after %s", time.Since(start).Round(time.Second))
	s.finish(g)
	s.noteWarnings()
}

// noteWarnings notes, per stage, how often each warning and error message
// appears in the logs of all its instances: the ways of recovering the
// outage went through.
func (s *suite) noteWarnings() {
	s.t.Helper()
	files, _ := filepath.Glob(filepath.Join(s.logs, "*-i*-*.log"))
	counts := map[string]int{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		stage, _, _ := strings.Cut(filepath.Base(f), "-")
		for _, line := range strings.Split(string(b), "\n") {
			var l struct{ Level, Msg string }
			if json.Unmarshal([]byte(line), &l) == nil && (l.Level == "warn" || l.Level == "error" || l.Level == "fatal") {
				counts[fmt.Sprintf("%s %s: %s", stage, l.Level, l.Msg)]++
			}
		}
	}
	var lines []string
	for k, n := range counts {
		lines = append(lines, fmt.Sprintf("%dx %s", n, k))
	}
	sort.Strings(lines)
	s.note("warnings and errors of the stages:\n  %s", strings.Join(lines, "\n  "))
}

// waitReady waits until every running stage instance answers /readyz with
// 200, restarting (and recording) the ones that exit meanwhile; after d it
// fails the test naming those that are not ready and why.
func (s *suite) waitReady(d time.Duration) {
	s.t.Helper()
	c := http.Client{Timeout: 2 * time.Second}
	end := time.Now().Add(d)
	for {
		s.checkAlive()
		var notReady []string
		for _, st := range stages {
			for _, id := range s.running(st) {
				if why := ready(&c, s, st, id); why != "" {
					notReady = append(notReady, fmt.Sprintf("%s %s: %s", st, id, why))
				}
			}
		}
		if len(notReady) == 0 {
			return
		}
		if time.Now().After(end) {
			sort.Strings(notReady)
			s.fatalf("every stage instance ready again: after %s still not:\n  %s\nopen transactions: %s", d, strings.Join(notReady, "\n  "),
				s.openTransactions())
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// ready returns why stage/id's /readyz does not answer 200, or "".
func ready(c *http.Client, s *suite, stage, id string) string {
	p := s.proc(stage, id)
	var addr string
	for _, l := range p.Lines("serving metrics and health") {
		addr, _ = l.Fields["addr"].(string)
	}
	if addr == "" {
		return "no metrics address in its log yet"
	}
	resp, err := c.Get("http://" + addr + "/readyz")
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		var b [200]byte
		n, _ := resp.Body.Read(b[:])
		return fmt.Sprintf("%s: %s", resp.Status, strings.TrimSpace(string(b[:n])))
	}
	return ""
}

// openTransactions describes the partitions of the suite's topics whose
// last stable offset is behind their high watermark (a transaction open
// on them holds read_committed readers, a restore among them) and the
// producers with a transaction open there.
func (s *suite) openTransactions() string {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(s.brokers...))
	if err != nil {
		return err.Error()
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	hw, err := adm.ListEndOffsets(ctx, s.topicNames()...)
	if err != nil {
		return err.Error()
	}
	lso, err := adm.ListCommittedOffsets(ctx, s.topicNames()...)
	if err != nil {
		return err.Error()
	}
	var held []string
	set := kadm.TopicsSet{}
	lso.Each(func(o kadm.ListedOffset) {
		if h, ok := hw.Lookup(o.Topic, o.Partition); ok && o.Err == nil && o.Offset < h.Offset {
			held = append(held, fmt.Sprintf("%s/%d: last stable offset %d, high watermark %d", o.Topic, o.Partition, o.Offset, h.Offset))
			set.Add(o.Topic, o.Partition)
		}
	})
	if len(held) == 0 {
		return "none"
	}
	if ps, err := adm.DescribeProducers(ctx, set); err == nil {
		ps.EachProducer(func(p kadm.DescribedProducer) {
			if p.CurrentTxnStartOffset >= 0 {
				held = append(held, fmt.Sprintf("%s/%d: producer %d epoch %d has a transaction open since offset %d, last produced %s",
					p.Topic, p.Partition, p.ProducerID, p.ProducerEpoch, p.CurrentTxnStartOffset, time.UnixMilli(p.LastTimestamp).UTC().Format("15:04:05.000")))
			}
		})
	}
	sort.Strings(held)
	return "\n  " + strings.Join(held, "\n  ")
}
