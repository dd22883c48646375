// Package crash is the scaffolding of the real-binary crash suites
// (docs/design.md, Exactly-once, "Crash windows"; docs/testing.md, Crash
// tests): it runs the real meterline binary as child processes with a fault
// point armed (METERLINE_FAULT), kills and restarts them, and waits for
// their consumer group to catch up, so that the suite can count the
// outputs.
//
// A Suite is one test's world on the real broker named by
// METERLINE_TEST_KAFKA: its own topics (testenv.Topics), groups, state and
// log directories, and children. Children alone starts and records child
// processes, for a suite whose world is made otherwise (the sink's, with
// its ClickHouse database). What a suite counts, and against which model,
// stays in its package: exactly once per identity for dedup, the bill
// (testenv/oracle) for the aggregator, an uninterrupted run's rows for the
// sink.
package crash

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/internal/topics"
	"github.com/meterline/meterline/schemas"
)

// Timings of every child a Suite starts: short, so that takeovers and
// aborts of dead instances' transactions happen within seconds.
const (
	Partitions         = 4 // of every topic of a Suite
	SessionTimeout     = 3 * time.Second
	TransactionTimeout = 5 * time.Second
	RebalanceTimeout   = 10 * time.Second
	CommitInterval     = 50 * time.Millisecond
	TickInterval       = 500 * time.Millisecond // dedup's

	// CaughtUpTimeout bounds every wait for a group to catch up.
	CaughtUpTimeout = 2 * time.Minute
	// ExitTimeout bounds every wait for a child to exit.
	ExitTimeout = 90 * time.Second
)

// Children starts the meterline binary as child processes of a test and
// keeps them: each run of an instance gets its own log file (kept if the
// test fails) and name ("<id>#<run>"), and is SIGKILLed when the test
// ends if it still runs (a child of a crash test may die at any time).
type Children struct {
	t    *testing.T
	bin  string
	logs string

	mu     sync.Mutex
	procs  []*testenv.Process
	starts map[string]int // instance → runs started
}

// NewChildren builds the binary (testenv.Meterline: the package's TestMain
// must be testenv.Main) and a log directory named after logs.
func NewChildren(t *testing.T, logs string) *Children {
	t.Helper()
	return &Children{t: t, bin: testenv.Meterline(t), logs: testenv.LogDir(t, logs+"-"), starts: map[string]int{}}
}

// StartOpts are the options of one child's run.
type StartOpts struct {
	// Fault arms a fault point ("point" or "point@n"; "" none).
	Fault string
	// TailSkip leaves log lines containing it (a frequent message that says
	// little) out of the tail printed when the test fails.
	TailSkip string
}

// Start runs `meterline <args>` as a run of instance id.
func (c *Children) Start(id string, o StartOpts, args ...string) *testenv.Process {
	c.t.Helper()
	c.mu.Lock()
	c.starts[id]++
	run := c.starts[id]
	c.mu.Unlock()
	p := testenv.StartProcessOpts(c.t, testenv.ProcessOpts{Fault: o.Fault, MayDie: true, TailSkip: o.TailSkip, ExitTimeout: ExitTimeout},
		fmt.Sprintf("%s#%d", id, run), filepath.Join(c.logs, fmt.Sprintf("%s-%d.log", id, run)), c.bin, args...)
	c.mu.Lock()
	c.procs = append(c.procs, p)
	c.mu.Unlock()
	return p
}

// Procs returns every child started so far, in start order.
func (c *Children) Procs() []*testenv.Process {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]*testenv.Process(nil), c.procs...)
}

// Suite is one crash test's world: topics under a prefix of its own (every
// topic of docs/design.md, Topics, with Partitions each, usage.events with
// LogAppendTime), groups named Prefix + stage, a state directory and the
// children. The topics and groups are deleted when the test ends.
type Suite struct {
	*Children
	T       *testing.T
	Brokers []string
	Names   topics.Names
	// Dir is the test's temporary directory, for state directories and
	// input files.
	Dir string

	keysOnce sync.Once
	keys     string // dedup's key file, shared by every dedup instance
	// createTime: usage.events and usage.entitlements use CreateTime,
	// which Stage allows (--allow-create-time).
	createTime bool
}

// New makes the suite of the test, named name (topic prefix, log
// directory), or skips the test when no real broker is configured
// (testenv.RealKafka).
func New(t *testing.T, name string) *Suite {
	t.Helper()
	return NewWith(t, name, testenv.TopicsOpts{})
}

// NewWith is New with the topics shaped by o (its Partitions is always
// Partitions): a test that chooses broker times takes CreateTime
// (EventsTimestamp), which usage.events, usage.deduped, usage.entitlements
// and usage.balances then have.
func NewWith(t *testing.T, name string, o testenv.TopicsOpts) *Suite {
	t.Helper()
	brokers := testenv.RealKafka(t)
	s := &Suite{T: t, Brokers: brokers, Dir: t.TempDir()}
	s.Children = NewChildren(t, "meterline-"+name+"-logs")
	o.Partitions = Partitions
	s.Names = testenv.Topics(t, brokers, name, o)
	s.createTime = o.EventsTimestamp == "CreateTime"
	return s
}

// Group is the consumer group of a stage's instances: Prefix + stage.
func (s *Suite) Group(stage string) string { return s.Names.Prefix + stage }

// StageOpts are the options of one run of a stage.
type StageOpts struct {
	Fault string // fault point armed in the run
	// TransactionTimeout replaces TransactionTimeout.
	TransactionTimeout time.Duration
	// Args are more flags.
	Args []string
}

// tailSkip is each stage's frequent log line that says little.
var tailSkip = map[string]string{
	"dedup":     `"msg":"duplicate dropped"`,
	"aggregate": `"msg":"late event booked as an adjustment"`,
}

// Stage runs `meterline <stage>` (dedup or aggregate) as instance id, in
// the stage's group, with its Pebble state under stateDir, the suite's
// timings and JSON logs at info level; dedup with the suite's key file and
// TickInterval; with --allow-create-time when the suite's topics use
// CreateTime (NewWith).
func (s *Suite) Stage(stage, id, stateDir string, o StageOpts) *testenv.Process {
	s.T.Helper()
	txt := TransactionTimeout
	if o.TransactionTimeout > 0 {
		txt = o.TransactionTimeout
	}
	args := []string{stage,
		"--brokers", strings.Join(s.Brokers, ","),
		"--topic-prefix", s.Names.Prefix,
		"--group", s.Group(stage),
		"--instance-id", id,
		"--state-dir", stateDir,
		"--metrics-addr", "127.0.0.1:0",
		"--commit-interval", CommitInterval.String(),
		"--session-timeout", SessionTimeout.String(),
		"--transaction-timeout", txt.String(),
		"--rebalance-timeout", RebalanceTimeout.String(),
		"--log-level", "info",
	}
	if stage == "dedup" {
		s.keysOnce.Do(func() { s.keys = testenv.DedupKeysFile(s.T) })
		args = append(args, "--tick-interval", TickInterval.String(), "--dedup-keys-file", s.keys)
	}
	if s.createTime {
		args = append(args, "--allow-create-time")
	}
	return s.Start(id, StartOpts{Fault: o.Fault, TailSkip: tailSkip[stage]}, append(args, o.Args...)...)
}

// WaitCaughtUp waits until the group is caught up on topic (CaughtUp),
// failing at once if one of the live children exits, and after
// CaughtUpTimeout with a report of the group's lag.
func (s *Suite) WaitCaughtUp(group, topic string, live ...*testenv.Process) {
	s.T.Helper()
	start := time.Now()
	var lastErr error
	for {
		for _, p := range live {
			if p.Exited() {
				s.T.Fatalf("%s exited (%s) while waiting for %s to catch up on %s\n%s", p.Name(), p.ExitString(), group, topic, p.Tail(30))
			}
		}
		ok, err := CaughtUp(s.Brokers, group, topic)
		if err == nil && ok {
			s.T.Logf("%s caught up on %s after %s", group, topic, time.Since(start).Round(time.Millisecond))
			return
		}
		lastErr = err
		if time.Since(start) > CaughtUpTimeout {
			s.T.Fatalf("group %s not caught up on %s after %s (last error: %v)\n%s", group, topic, CaughtUpTimeout, lastErr, LagReport(s.Brokers, group, topic))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// CaughtUp reports whether a read_committed read of topic from the group's
// committed offsets returns no records (docs/operations.md, Lag) other than
// ticks.
//
// Each dedup instance appends a tick to each partition of usage.events it
// owns every tick interval, and the broker answers a read_committed fetch
// waiting on a partition only at the fetch's max wait (500 ms) after the
// tick's commit marker, so a partition's last tick is unconsumed about
// half of the time. With one instance all its partitions clear together;
// with several, at phases of their own, a moment with no tick pending
// anywhere may never come. A tick carries no usage: every event below the
// high watermark is processed and committed when only ticks remain.
func CaughtUp(brokers []string, group, topic string) (bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	from, err := testenv.Committed(ctx, brokers, group, topic)
	if err != nil {
		return false, err
	}
	recs, err := topics.ReadCommitted(ctx, brokers, topic, from)
	if err != nil {
		return false, err
	}
	for _, r := range recs {
		if k, err := schemas.PeekKind(r.Value); err != nil || k != schemas.KindTick {
			return false, nil
		}
	}
	return true, nil
}

// LagReport describes, per partition of topic, the group's committed
// offset, the last stable offset and high watermark, and the first
// records after the committed offset: for a failed wait.
func LagReport(brokers []string, group, topic string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		return err.Error()
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	offs, err := adm.FetchOffsets(ctx, group)
	if err != nil {
		return "fetch offsets: " + err.Error()
	}
	lso, _ := adm.ListCommittedOffsets(ctx, topic)
	hw, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		return "list end offsets: " + err.Error()
	}
	from := map[int32]int64{}
	var b strings.Builder
	var parts []int32
	hw.Each(func(h kadm.ListedOffset) { parts = append(parts, h.Partition) })
	slices.Sort(parts)
	for _, p := range parts {
		o, _ := offs.Lookup(topic, p)
		l, _ := lso.Lookup(topic, p)
		h, _ := hw.Lookup(topic, p)
		from[p] = o.At
		fmt.Fprintf(&b, "partition %d: committed %d (err %v), last stable %d, high watermark %d\n", p, o.At, o.Err, l.Offset, h.Offset)
	}
	recs, err := topics.ReadCommitted(ctx, brokers, topic, from)
	if err != nil {
		fmt.Fprintf(&b, "reading after the committed offsets: %v\n", err)
	}
	for i, r := range recs {
		if i == 20 {
			fmt.Fprintf(&b, "... %d records in all\n", len(recs))
			break
		}
		k, _ := schemas.PeekKind(r.Value)
		fmt.Fprintf(&b, "  %d/%d %s producer %d/%d ts %s key %q\n", r.Partition, r.Offset, k, r.ProducerID, r.ProducerEpoch, r.Timestamp.Format(time.RFC3339Nano), r.Key)
	}
	return b.String()
}
