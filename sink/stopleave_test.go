package sink

import (
	"context"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/meterline/meterline/internal/kafka"
	"github.com/meterline/meterline/internal/session"
	"github.com/meterline/meterline/internal/testenv"
)

// TestStopBoundedWhenLeaveHangs: the sink told to stop while the group's
// coordinator does not answer returns within session.LeaveTimeout of its
// LeaveGroup, as dedup and the aggregator do (the stream package's test of
// the same name). Kafka is kfake, ClickHouse the real one of
// METERLINE_TEST_CLICKHOUSE.
func TestStopBoundedWhenLeaveHangs(t *testing.T) {
	conn, db := testenv.ClickHouseDB(t)
	if _, err := Migrate(ctxT(t, time.Minute), conn); err != nil {
		t.Fatal(err)
	}
	cluster, brokers := testenv.KFake(t)
	names := testenv.Topics(t, brokers, "", testenv.TopicsOpts{Partitions: 2})
	hang := testenv.HangLeaveGroup(t, cluster)
	w, err := New(Config{
		Config: session.Config{Kafka: kafka.Config{Brokers: brokers}, Group: names.Prefix + "sink", InstanceID: "i1",
			SessionTimeout: 6 * time.Second},
		Topics: names, Conn: conn, Database: db, MaxBatchWait: 100 * time.Millisecond,
		CommitInterval: 200 * time.Millisecond, PingInterval: 100 * time.Millisecond, Logger: zaptest.NewLogger(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	waitReadyIs(t, w, func(err error) bool { return err == nil }, "ready")
	hang()
	testenv.StopsWithin(t, cancel, done, session.LeaveTimeout+5*time.Second)
}
