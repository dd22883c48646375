package session

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/meterline/meterline/internal/kafka"
	"github.com/meterline/meterline/internal/testenv"
)

// TestConfigValidate: Validate names every bad field as its flag does, at
// once; EnsureDefaults fills the documented defaults, and a config with
// them, brokers, a group and an instance ID is valid.
func TestConfigValidate(t *testing.T) {
	c := Config{SessionTimeout: -time.Second, RebalanceTimeout: -time.Second, TransactionTimeout: -time.Second}
	err := c.Validate()
	if err == nil {
		t.Fatal("an empty config with negative timeouts is valid")
	}
	for _, want := range []string{"kafka: brokers", "session: group: required", "session: instance-id: required",
		"session: session-timeout: must be positive (got -1s)", "session: rebalance-timeout", "session: transaction-timeout"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not say %q:\n%v", want, err)
		}
	}

	c = Config{Kafka: kafka.Config{Brokers: []string{"a:1"}}, Group: "g", InstanceID: "i"}
	c.EnsureDefaults()
	if err := c.Validate(); err != nil {
		t.Fatalf("valid config refused: %v", err)
	}
	want := Config{Kafka: c.Kafka, Group: "g", InstanceID: "i", SessionTimeout: 10 * time.Second,
		RebalanceTimeout: 30 * time.Second, TransactionTimeout: 10 * time.Second, RestartBackoff: time.Second}
	if c.SessionTimeout != want.SessionTimeout || c.RebalanceTimeout != want.RebalanceTimeout ||
		c.TransactionTimeout != want.TransactionTimeout || c.RestartBackoff != want.RestartBackoff {
		t.Errorf("defaults %+v, want %+v", c, want)
	}
	if got := c.TransactionalID(); got != "g-i" {
		t.Errorf("transactional ID %q, want g-i", got)
	}
}

var testNames = Names{RecordsIn: "test_records_in_total", Transactions: "test_transactions_total",
	CommitSeconds: "test_commit_seconds", Restarts: "test_session_restarts_total", Member: "test_group_member",
	RestartReasons: []RestartReason{"test_reason"}}

func counterValue(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		panic(err)
	}
	return m.GetCounter().GetValue()
}

// sumOf returns the sum of c's series.
func sumOf(c *prometheus.CounterVec) float64 {
	ch := make(chan prometheus.Metric, 64)
	c.Collect(ch)
	close(ch)
	var v float64
	for m := range ch {
		var d dto.Metric
		if err := m.Write(&d); err != nil {
			panic(err)
		}
		v += d.GetCounter().GetValue()
	}
	return v
}

func newTestLoop(t *testing.T, backoff time.Duration) (*Loop, *Metrics) {
	t.Helper()
	c := Config{Kafka: kafka.Config{Brokers: []string{"127.0.0.1:1"}}, Group: "g", InstanceID: "i", RestartBackoff: backoff}
	c.EnsureDefaults()
	m := NewMetrics(prometheus.NewRegistry(), testNames, "test records")
	l, err := NewLoop(c, zaptest.NewLogger(t), m, "then nothing")
	if err != nil {
		t.Fatal(err)
	}
	return l, m
}

// TestRunRestarts: a session that ends with ErrRestart is rebuilt, after
// RestartBackoff, and counted under its reason (other without a
// RestartError); any other error ends Run with it.
func TestRunRestarts(t *testing.T) {
	const backoff = 20 * time.Millisecond
	l, m := newTestLoop(t, backoff)
	boom := errors.New("boom")
	ends := []error{
		EndFailed(errors.New("i/o timeout")),
		fmt.Errorf("stage: %w", EndFailed(fmt.Errorf("end: %w", kerr.ProducerFenced))),
		Restart(RestartInitProducerID, nil),
		Restart(RestartFenced, errors.New("x")),
		ErrRestart,
		boom,
	}
	var calls []time.Time
	err := l.Run(context.Background(), func(context.Context) error {
		calls = append(calls, time.Now())
		return ends[len(calls)-1]
	})
	if !errors.Is(err, boom) {
		t.Fatalf("Run returned %v, want boom", err)
	}
	if len(calls) != len(ends) {
		t.Fatalf("%d sessions, want %d", len(calls), len(ends))
	}
	for i := 1; i < len(calls); i++ {
		if d := calls[i].Sub(calls[i-1]); d < backoff {
			t.Errorf("session %d opened %s after the previous one ended, before the restart back-off of %s", i+1, d, backoff)
		}
	}
	want := map[string]float64{"commit_unknown": 1, "fenced": 2, "init_producer_id": 1, "other": 1, "test_reason": 0}
	for r, n := range want {
		if got := counterValue(m.Restarts.WithLabelValues(r)); got != n {
			t.Errorf("test_session_restarts_total{reason=%q} %v, want %v", r, got, n)
		}
	}
	if n := testutil.CollectAndCount(m.Restarts); n != len(want) {
		t.Errorf("test_session_restarts_total has %d series, want %d: %v", n, len(want), want)
	}
}

// TestRestartError: a RestartError is ErrRestart and its cause, and its
// message names its reason.
func TestRestartError(t *testing.T) {
	err := fmt.Errorf("stage: %w", Restart(RestartFenced, kerr.ProducerFenced))
	if !errors.Is(err, ErrRestart) || !errors.Is(err, kerr.ProducerFenced) || !Fenced(err) {
		t.Errorf("%v is not ErrRestart and PRODUCER_FENCED", err)
	}
	if !strings.Contains(err.Error(), "(fenced)") {
		t.Errorf("%q does not name its reason", err)
	}
	if r := restartReason(Restart(RestartInitProducerID, nil)); r != RestartInitProducerID {
		t.Errorf("reason %q, want init_producer_id", r)
	}
	if r := restartReason(fmt.Errorf("x: %w", ErrRestart)); r != RestartOther {
		t.Errorf("reason of a bare ErrRestart %q, want other", r)
	}
}

// TestRunNamesDuplicateInstance: a producer fenced again and again (two
// processes with the same --group and --instance-id fence each other at
// each new session) makes Run log, at error level, that another process
// most likely runs with the same instance ID, naming the transactional ID;
// once per minute at most. Restarts for another cause (an unknown outcome
// without fencing), however many, and fewer fences, do not.
func TestRunNamesDuplicateInstance(t *testing.T) {
	run := func(causes ...error) []observer.LoggedEntry {
		t.Helper()
		core, logs := observer.New(zap.InfoLevel)
		c := Config{Kafka: kafka.Config{Brokers: []string{"127.0.0.1:1"}}, Group: "g", InstanceID: "i", RestartBackoff: time.Millisecond}
		c.EnsureDefaults()
		l, err := NewLoop(c, zap.New(core), NewMetrics(prometheus.NewRegistry(), testNames, "test records"), "then nothing")
		if err != nil {
			t.Fatal(err)
		}
		boom := errors.New("boom")
		n := 0
		if err := l.Run(context.Background(), func(context.Context) error {
			if n++; n <= len(causes) {
				return EndFailed(causes[n-1])
			}
			return boom
		}); !errors.Is(err, boom) {
			t.Fatalf("Run returned %v, want boom", err)
		}
		return logs.FilterMessageSnippet("--instance-id").AllUntimed()
	}
	fenced := fmt.Errorf("end: %w", kerr.ProducerFenced)
	epoch := fmt.Errorf("produce to t/0: %w", kerr.InvalidProducerEpoch)
	unknown := errors.New("i/o timeout")

	hints := run(fenced, unknown, epoch, unknown, fenced, fenced, epoch)
	if len(hints) != 1 {
		t.Fatalf("%d log lines name the instance ID after 5 fences, want 1 (once a minute): %v", len(hints), hints)
	}
	h := hints[0]
	if h.Level != zap.ErrorLevel || !strings.Contains(h.Message, "another process") || !strings.Contains(h.Message, "same --group and --instance-id") {
		t.Errorf("hint %s %q, want an error naming another process with the same instance ID", h.Level, h.Message)
	}
	if f := h.ContextMap(); f["transactional_id"] != "g-i" || f["instance_id"] != "i" || f["fenced"] != int64(3) {
		t.Errorf("hint fields %v, want transactional_id g-i, instance_id i, fenced 3", f)
	}
	if hints := run(unknown, unknown, unknown, unknown, fenced, fenced); len(hints) != 0 {
		t.Errorf("restarts without fencing and 2 fences: %v, want no hint", hints)
	}
}

// TestRunStops: once ctx has ended, a session ending with nil, a
// cancellation or ErrRestart stops Run quietly, and so does the end of ctx
// during the restart back-off; another error is returned.
func TestRunStops(t *testing.T) {
	boom := errors.New("boom")
	for _, tc := range []struct {
		name string
		end  error
		want error
	}{
		{"nil", nil, nil},
		{"canceled", context.Canceled, nil},
		{"restart", ErrRestart, nil},
		{"restart with a reason", Restart(RestartFenced, nil), nil},
		{"error", boom, boom},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, m := newTestLoop(t, time.Hour)
			ctx, cancel := context.WithCancel(context.Background())
			calls := 0
			err := l.Run(ctx, func(context.Context) error {
				calls++
				cancel()
				return tc.end
			})
			if !errors.Is(err, tc.want) || (tc.want == nil && err != nil) {
				t.Fatalf("Run returned %v, want %v", err, tc.want)
			}
			if n := sumOf(m.Restarts); calls != 1 || n != 0 {
				t.Errorf("%d sessions and %v restarts after the context ended, want 1 and 0", calls, n)
			}
		})
	}
	t.Run("during back-off", func(t *testing.T) {
		l, _ := newTestLoop(t, time.Hour)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			done <- l.Run(ctx, func(context.Context) error { return ErrRestart })
		}()
		time.Sleep(50 * time.Millisecond)
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("Run returned %v, want nil", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("Run did not return when its context ended during the restart back-off")
		}
	})
}

// TestOpen runs two sessions of one loop on kfake. The first starts with
// no committed offset: Assigned sees kgo's NoResetOffset and starts the
// partition at its beginning; a transaction commits the offsets of the
// polled records, uncommitted input is not read (read_committed), and
// closing the session revokes the partition. The second session starts
// from the committed offset.
func TestOpen(t *testing.T) {
	_, brokers := testenv.KFake(t)
	topic := testenv.Name(t, "in")
	testenv.CreateTopic(t, brokers, topic, 1, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	// Three committed records, then one of an open transaction.
	txn, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.TransactionalID(testenv.Name(t, "writer")), kgo.DefaultProduceTopic(topic))
	if err != nil {
		t.Fatal(err)
	}
	defer txn.Close()
	for _, commit := range []bool{true, false} {
		if err := txn.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		n := 1
		if commit {
			n = 3
		}
		for range n {
			if err := txn.ProduceSync(ctx, &kgo.Record{Value: []byte("v")}).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
		if commit {
			if err := txn.EndTransaction(ctx, kgo.TryCommit); err != nil {
				t.Fatal(err)
			}
		}
	}

	c := Config{Kafka: kafka.Config{Brokers: brokers}, Group: testenv.Name(t, "group"), InstanceID: "i",
		SessionTimeout: 6 * time.Second}
	c.EnsureDefaults()
	l, err := NewLoop(c, zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel)), NewMetrics(prometheus.NewRegistry(), testNames, "test records"), "")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var assigned []kgo.Offset
	revoked := 0
	hooks := Hooks{
		Assigned: func(_ context.Context, offs map[string]map[int32]kgo.Offset) (map[string]map[int32]kgo.Offset, error) {
			mu.Lock()
			defer mu.Unlock()
			o := offs[topic][0]
			assigned = append(assigned, o)
			if o.EpochOffset().Offset < 0 {
				offs[topic][0] = kgo.NoResetOffset().AtStart()
			}
			return offs, nil
		},
		Revoked: func(_ context.Context, _ *kgo.Client, r map[string][]int32) {
			mu.Lock()
			defer mu.Unlock()
			revoked += len(r[topic])
		},
	}

	sess, err := l.Open([]string{topic}, hooks)
	if err != nil {
		t.Fatal(err)
	}
	var got []int64
	for len(got) < 3 && ctx.Err() == nil {
		sess.PollFetches(ctx).EachRecord(func(r *kgo.Record) { got = append(got, r.Offset) })
	}
	if len(got) != 3 || got[0] != 0 || got[2] != 2 {
		t.Fatalf("first session polled offsets %v, want 0, 1, 2", got)
	}
	if err := sess.Begin(); err != nil {
		t.Fatal(err)
	}
	ectx, ecancel := c.EndContext(ctx)
	committed, err := sess.End(ectx, kgo.TryCommit)
	ecancel()
	if err != nil || !committed {
		t.Fatalf("End: committed %v, %v", committed, err)
	}
	// The open transaction's record is never returned (read_committed).
	pctx, pcancel := context.WithTimeout(ctx, time.Second)
	sess.PollFetches(pctx).EachRecord(func(r *kgo.Record) { t.Errorf("polled offset %d of an open transaction", r.Offset) })
	pcancel()
	sess.Close()

	mu.Lock()
	if len(assigned) != 1 || assigned[0].EpochOffset().Offset >= 0 || revoked != 1 {
		t.Errorf("first session: assigned %v, revoked %d times; want one assignment without a committed offset, one revoke", assigned, revoked)
	}
	mu.Unlock()

	sess, err = l.Open([]string{topic}, hooks)
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	for ctx.Err() == nil {
		mu.Lock()
		n := len(assigned)
		mu.Unlock()
		if n == 2 {
			break
		}
		pctx, pcancel := context.WithTimeout(ctx, 100*time.Millisecond)
		sess.PollFetches(pctx)
		pcancel()
	}
	mu.Lock()
	defer mu.Unlock()
	if len(assigned) != 2 || assigned[1].EpochOffset().Offset != 3 {
		t.Errorf("second session assigned %v, want the committed offset 3", assigned)
	}
}
