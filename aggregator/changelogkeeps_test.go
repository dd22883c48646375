package aggregator

import (
	"errors"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/internal/topics"
)

// TestChangelogUnsafeWhileRunning: New refuses a changelog whose
// cleanup.policy deletes records; an operator may set it so while the
// stage runs, and the brokers then delete state records the next restore
// must read. The running stage reads the policy again every
// ChangelogCheckInterval: meterline_stream_changelog_unsafe goes to 1 with
// one error line when it turns unsafe, back to 0 with an info line when it
// is put back; and a restore while it is unsafe (here: the other instance
// leaves, and the eager rebalance restores every partition) is refused,
// stopping the stage with the *topics.ChangelogRetentionError, as at
// start. On the real broker.
func TestChangelogUnsafeWhileRunning(t *testing.T) {
	brokers := testenv.RealKafka(t)
	h := newAggHarness(t, brokers, 2)
	core, logs := observer.New(zapcore.InfoLevel)
	reg := prometheus.NewRegistry()
	cfg := h.config("a", vfs.NewMem())
	cfg.Stream.ChangelogCheckInterval = 200 * time.Millisecond
	cfg.Stream.Registerer = reg
	cfg.Stream.Logger = zap.New(zapcore.NewTee(zaptest.NewLogger(t).Named("a").Core(), core))
	a := h.start(cfg)
	cfgB := h.config("b", vfs.NewMem())
	regB := prometheus.NewRegistry()
	cfgB.Stream.Registerer = regB
	b := h.start(cfgB)
	changelog := h.names.AggregateChangelogTopic()
	// The group settles first: a partition each, restored.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		na, _ := gaugeOf(reg, "meterline_stream_owned_partitions", "stage", "aggregate")
		nb, _ := gaugeOf(regB, "meterline_stream_owned_partitions", "stage", "aggregate")
		if na == 1 && nb == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("instances own %v and %v partitions, want 1 each", na, nb)
		}
	}

	awaitUnsafe := func(want float64, what string) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			v, ok := gaugeOf(reg, "meterline_stream_changelog_unsafe", "topic", changelog)
			if ok && v == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: meterline_stream_changelog_unsafe{topic=%q} = %v (exported %v), want %v", what, changelog, v, ok, want)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	lines := func(level zapcore.Level, snippet string) int {
		return logs.FilterLevelExact(level).FilterMessageSnippet(snippet).FilterField(zap.String("changelog", changelog)).Len()
	}
	unsafe := map[string]string{"cleanup.policy": "delete", "retention.ms": "3600000"}
	awaitUnsafe(0, "at start")
	testenv.AlterTopicConfigs(t, brokers, changelog, unsafe)
	awaitUnsafe(1, "set to delete")
	time.Sleep(time.Second) // five checks more
	if n := lines(zapcore.ErrorLevel, "deletes state records"); n != 1 {
		t.Errorf("%d error lines about the changelog, want 1 per change", n)
	}
	testenv.AlterTopicConfigs(t, brokers, changelog, map[string]string{"cleanup.policy": "compact"})
	awaitUnsafe(0, "set back to compact")
	if n := lines(zapcore.InfoLevel, "keeps the state records"); n != 1 {
		t.Errorf("%d info lines about the changelog put back, want 1", n)
	}

	testenv.AlterTopicConfigs(t, brokers, changelog, unsafe)
	awaitUnsafe(1, "set to delete again")
	if n := lines(zapcore.ErrorLevel, "deletes state records"); n != 2 {
		t.Errorf("%d error lines about the changelog, want 2 (one per change)", n)
	}
	if err := b.stop(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-a.done:
	case <-time.After(60 * time.Second):
		t.Fatal("the aggregator still runs after a rebalance restored its partitions from a changelog that deletes records")
	}
	var re *topics.ChangelogRetentionError
	if !errors.As(a.err, &re) || re.Topic != changelog || re.Policy != "delete" {
		t.Fatalf("Run = %v, want a *topics.ChangelogRetentionError naming %s", a.err, changelog)
	}
}
