package bench

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"go.uber.org/zap"

	"github.com/meterline/meterline/internal/kafka"
	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/internal/topics"
	"github.com/meterline/meterline/producer"
)

// watcher is a progress writer that cancels a context once a line
// containing at is written (Ctrl-C at that step).
type watcher struct {
	mu     sync.Mutex
	buf    bytes.Buffer
	at     string
	cancel context.CancelFunc
}

func (w *watcher) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	if w.at != "" && strings.Contains(w.buf.String(), w.at) {
		w.cancel()
	}
	return len(p), nil
}

func testEnv(t *testing.T, brokers []string, progress io.Writer) (*Env, *bytes.Buffer) {
	var out bytes.Buffer
	names := topics.DefaultNames()
	names.Prefix = testenv.Name(t, "bench.")
	return &Env{Kafka: kafka.Config{Brokers: brokers}, Topics: names, Logger: zap.NewNop(), Progress: progress, Out: &out}, &out
}

// leftBehind lists the topics and groups on the cluster whose names start
// with prefix, and whether the state directory is still there.
func leftBehind(t *testing.T, adm *kadm.Client, prefix, stateDir string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var left []string
	tds, err := adm.ListTopics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range tds.Names() {
		if strings.HasPrefix(name, prefix) {
			left = append(left, "topic "+name)
		}
	}
	groups, err := adm.ListGroups(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range groups.Groups() {
		if strings.HasPrefix(g, prefix) {
			left = append(left, "group "+g)
		}
	}
	if _, err := os.Stat(stateDir); !os.IsNotExist(err) {
		left = append(left, "state directory "+stateDir)
	}
	return left
}

func smallStage(stateDir string) StageConfig {
	return StageConfig{Partitions: 2, CommitInterval: 50 * time.Millisecond, LatencyRate: 200, LatencyFor: 100 * time.Millisecond,
		StateDir: stateDir}
}

// TestStageBenchesLeaveNothingBehind runs bench dedup and bench aggregate
// on kfake to the end, stopped by Ctrl-C (a cancelled context) in their
// first round, in their last and in the phases after the rounds, and
// stopped by an error with their last stage up: each time the topics,
// consumer groups and state directories they made are gone when they
// return. With METERLINE_TEST_KAFKA set, the error case runs on the real
// broker too (one round).
func TestStageBenchesLeaveNothingBehind(t *testing.T) {
	benches := []stageBenchCase{
		{"dedup", func(ctx context.Context, env *Env, cfg StageConfig) error {
			return Dedup(ctx, env, DedupConfig{Events: 600, DuplicateRate: 0.1, StageConfig: cfg})
		}},
		{"aggregate", func(ctx context.Context, env *Env, cfg StageConfig) error {
			return Aggregate(ctx, env, AggregateConfig{Events: 600, Customers: 20, StageConfig: cfg})
		}},
	}
	for _, b := range benches {
		stops := []stageBenchStop{
			{name: "to the end"},
			{name: "Ctrl-C in round 1", ctrlC: "round 1 (a) passthrough", failed: true},
			{name: "Ctrl-C at the end of the rounds", ctrlC: "round 2 " + b.name, failed: true},
			{name: "Ctrl-C in the latency phase", ctrlC: "latency:", failed: true},
			// Too short a latency phase to send anything: an error after
			// the rounds, with the last round's stage up.
			{name: "error after the rounds", tweak: func(c *StageConfig) { c.LatencyRate = 1 }, failed: true},
		}
		for _, st := range stops {
			t.Run("kfake/"+b.name+"/"+st.name, func(t *testing.T) {
				t.Parallel() // a cluster each
				_, brokers := testenv.KFake(t)
				b.check(t, brokers, st, 2)
			})
		}
		t.Run("kafka/"+b.name+"/"+stops[4].name, func(t *testing.T) {
			b.check(t, testenv.RealKafka(t), stops[4], 1)
		})
	}
}

type stageBenchCase struct {
	name string
	run  func(ctx context.Context, env *Env, cfg StageConfig) error
}

type stageBenchStop struct {
	name   string
	ctrlC  string // cancel once progress shows this
	tweak  func(*StageConfig)
	failed bool
}

// check runs the benchmark on brokers, stopped as st says, and fails the
// test if it leaves anything behind.
func (b stageBenchCase) check(t *testing.T, brokers []string, st stageBenchStop, rounds int) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w := &watcher{at: st.ctrlC, cancel: cancel}
	env, out := testEnv(t, brokers, w)
	cfg := smallStage(filepath.Join(t.TempDir(), "state"))
	cfg.Rounds = rounds
	if st.tweak != nil {
		st.tweak(&cfg)
	}
	err := b.run(ctx, env, cfg)
	t.Logf("progress:\n%s", w.buf.String())
	if err != nil {
		t.Logf("bench returned: %v", err)
	}
	switch {
	case !st.failed && err != nil:
		t.Fatalf("bench: %v", err)
	case st.failed && err == nil:
		t.Fatal("bench returned no error")
	case !st.failed && !strings.Contains(out.String(), "events/s  ("):
		t.Errorf("no result table:\n%s", out.String())
	}
	// A deleted topic leaves a broker's metadata a moment after
	// DeleteTopics returns: look again for a few seconds before calling it
	// left behind.
	adm := testenv.Admin(t, brokers)
	left := leftBehind(t, adm, env.Topics.Prefix, cfg.StateDir)
	for deadline := time.Now().Add(10 * time.Second); len(left) > 0 && time.Now().Before(deadline); {
		time.Sleep(200 * time.Millisecond)
		left = leftBehind(t, adm, env.Topics.Prefix, cfg.StateDir)
	}
	if len(left) > 0 {
		t.Errorf("left behind: %v", left)
	}
}

// sendEach is a produce path for tests: each event sent and acknowledged
// in turn. With interrupt, it cancels the benchmark's context half-way
// (Ctrl-C during a run) and returns the context's error.
type sendEach struct {
	interrupt context.CancelFunc
}

func (s sendEach) path(ctx context.Context, in io.Reader, p *producer.Producer) (int, time.Duration, error) {
	start := time.Now()
	sc := bufio.NewScanner(in)
	n := 0
	for sc.Scan() {
		e, err := producer.ParseJSON(sc.Bytes())
		if err != nil {
			return 0, 0, err
		}
		if err := p.Send(ctx, e); err != nil {
			return 0, 0, err
		}
		if n++; s.interrupt != nil && n == 10 {
			s.interrupt()
			return 0, 0, ctx.Err()
		}
	}
	return n, time.Since(start), sc.Err()
}

// TestProduceLeavesNothingBehind runs bench produce on kfake to the end and
// stopped by Ctrl-C during the produce path's run: no benchmark topic is
// left either way.
func TestProduceLeavesNothingBehind(t *testing.T) {
	for _, interrupt := range []bool{false, true} {
		t.Run(map[bool]string{false: "to the end", true: "Ctrl-C in a run"}[interrupt], func(t *testing.T) {
			_, brokers := testenv.KFake(t)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var progress bytes.Buffer
			env, out := testEnv(t, brokers, &progress)
			path := sendEach{}
			if interrupt {
				path.interrupt = cancel
			}
			err := Produce(ctx, env, ProduceConfig{Events: 50, Partitions: 2, Rounds: 2, Customers: 5, Path: path.path})
			t.Logf("progress:\n%s", progress.String())
			switch {
			case !interrupt && err != nil:
				t.Fatalf("bench: %v", err)
			case interrupt && !errors.Is(err, context.Canceled):
				t.Fatalf("bench returned %v, want context.Canceled", err)
			case !interrupt && !strings.Contains(out.String(), "meterline produce:     "):
				t.Errorf("no result table:\n%s", out.String())
			}
			_, dir, _ := strings.Cut(progress.String(), "events to ")
			dir, _, _ = strings.Cut(dir, "/events.ndjson")
			if dir == "" {
				t.Fatal("progress does not name the events file")
			}
			if left := leftBehind(t, testenv.Admin(t, brokers), env.Topics.Prefix, dir); len(left) > 0 {
				t.Errorf("left behind: %v", left)
			}
		})
	}
}
