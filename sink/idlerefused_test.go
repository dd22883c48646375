package sink

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/ClickHouse/clickhouse-go/v2/lib/proto"
	"go.uber.org/zap/zaptest"

	"github.com/meterline/meterline/internal/kafka"
	"github.com/meterline/meterline/internal/session"
	"github.com/meterline/meterline/internal/testenv"
)

// refusingPing is a connection whose health check the server refuses the
// login of once refuse is set (a password changed on the server), while
// its pooled connections still write.
type refusingPing struct {
	driver.Conn
	refuse atomic.Bool
}

func (c *refusingPing) Ping(ctx context.Context) error {
	if c.refuse.Load() {
		return &proto.Exception{Code: 516, Name: "DB::Exception", Message: "sink: Authentication failed: password is incorrect"}
	}
	return c.Conn.Ping(ctx)
}

// TestIdleSinkStopsOnRefusedLogin: a sink with nothing to write whose
// login the health check finds refused stops within a ping interval with
// ErrAuthentication naming the user (docs/operations.md, Security and
// ACLs), not at its next write, which may be hours away; its idle poll
// (CommitInterval, here 25 ping intervals) does not hold it. Kafka is kfake,
// ClickHouse the real one of METERLINE_TEST_CLICKHOUSE.
func TestIdleSinkStopsOnRefusedLogin(t *testing.T) {
	real, db := testenv.ClickHouseDB(t)
	if _, err := Migrate(ctxT(t, time.Minute), real); err != nil {
		t.Fatal(err)
	}
	conn := &refusingPing{Conn: real}
	_, brokers := testenv.KFake(t)
	names := testenv.Topics(t, brokers, "", testenv.TopicsOpts{Partitions: 2})
	w, err := New(Config{
		Config: session.Config{Kafka: kafka.Config{Brokers: brokers}, Group: names.Prefix + "sink", InstanceID: "i1",
			SessionTimeout: 6 * time.Second},
		Topics: names, Conn: conn, Database: db, MaxBatchWait: 100 * time.Millisecond,
		CommitInterval: 5 * time.Second, PingInterval: 200 * time.Millisecond, Logger: zaptest.NewLogger(t),
		ClickHouseServer: Server{Addr: "ch:9440", User: "sink"},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	waitReadyIs(t, w, func(err error) bool { return err == nil }, "ready")
	time.Sleep(300 * time.Millisecond) // in its idle poll
	refused := time.Now()
	conn.refuse.Store(true)
	select {
	case err := <-done:
		if !errors.Is(err, ErrAuthentication) || !strings.Contains(err.Error(), `"sink"`) {
			t.Fatalf("Run = %v, want ErrAuthentication naming user sink", err)
		}
		if d := time.Since(refused); d > 2*time.Second {
			t.Errorf("stopped %s after the refusal, want within about a ping interval (200ms)", d)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the idle sink did not stop within 10 s of its login refused")
	}
}
