package sink

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"go.uber.org/zap/zaptest"

	"github.com/meterline/meterline/internal/kafka"
	"github.com/meterline/meterline/internal/session"
	"github.com/meterline/meterline/internal/testenv"
)

// progressGate is a ClickHouse connection whose reads of sink_progress
// fail with fail while it is set, and wait for open to be closed.
type progressGate struct {
	driver.Conn
	fail atomic.Pointer[error]
	open chan struct{}
}

func (g *progressGate) Query(ctx context.Context, q string, args ...any) (driver.Rows, error) {
	if strings.Contains(q, ProgressTable) {
		if err := g.fail.Load(); err != nil {
			return nil, *err
		}
		select {
		case <-g.open:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return g.Conn.Query(ctx, q, args...)
}

// TestNotReadyWhileCheckingAssigned: the sink is not ready while the
// partitions it was assigned are not checked against the progress
// recorded in ClickHouse (checkAssigned: nothing of theirs is inserted
// before), across the check's failed attempts, with why on /readyz and
// the status page; it is ready once the check is done. Kafka is kfake,
// ClickHouse the real one of METERLINE_TEST_CLICKHOUSE.
func TestNotReadyWhileCheckingAssigned(t *testing.T) {
	conn, db := testenv.ClickHouseDB(t)
	if _, err := Migrate(ctxT(t, time.Minute), conn); err != nil {
		t.Fatal(err)
	}
	_, brokers := testenv.KFake(t)
	names := testenv.Topics(t, brokers, "", testenv.TopicsOpts{Partitions: 2})
	gate := &progressGate{Conn: conn, open: make(chan struct{})}
	failure := errors.New("progress read refused by the test")
	gate.fail.Store(&failure)
	w, err := New(Config{
		Config: session.Config{Kafka: kafka.Config{Brokers: brokers}, Group: names.Prefix + "sink", InstanceID: "i1",
			SessionTimeout: 6 * time.Second},
		Topics: names, Conn: gate, Database: db, QueryTimeout: 2 * time.Second,
		MaxBatchWait: 100 * time.Millisecond, CommitInterval: 200 * time.Millisecond, PingInterval: 100 * time.Millisecond,
		Logger: zaptest.NewLogger(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	// Joined, ClickHouse up, the check failing: not ready, saying why.
	waitReadyIs(t, w, func(err error) bool {
		return err != nil && strings.Contains(err.Error(), "checking") && strings.Contains(err.Error(), failure.Error())
	}, "not ready while checking, naming the failed attempt")
	// It stays so: no ready between two attempts.
	notReadyFor(t, w, 2*time.Second)
	// The check's read succeeds but answers slowly: still not ready.
	gate.fail.Store(nil)
	notReadyFor(t, w, time.Second)
	close(gate.open)
	waitReadyIs(t, w, func(err error) bool { return err == nil }, "ready once the check is done")
}

// waitReadyIs waits up to 20 s until ok(w.Ready()).
func waitReadyIs(t *testing.T, w *Writer, ok func(error) bool, what string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !ok(w.Ready()) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 20s; Ready() = %v", what, w.Ready())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// notReadyFor fails the test if w is ready at any moment within d.
func notReadyFor(t *testing.T, w *Writer, d time.Duration) {
	t.Helper()
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if err := w.Ready(); err == nil {
			t.Fatal("ready while the assigned partitions are not checked")
		} else if !strings.Contains(err.Error(), "checking") {
			t.Fatalf("not ready for another reason: %v", err)
		}
	}
}
