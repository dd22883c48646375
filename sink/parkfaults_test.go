package sink

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap/zaptest"

	"github.com/meterline/meterline/internal/kafka"
	"github.com/meterline/meterline/internal/session"
	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/internal/topics"
)

// parkFaultSink runs a sink on kfake (ClickHouse the real one of
// METERLINE_TEST_CLICKHOUSE) whose input holds rows good rows and one
// record that does not decode, to be parked in usage.rejected, with
// faults on usage.rejected installed before it starts. It returns the
// cluster, the topics, the count of a table, the fault and Run's result.
func parkFaultSink(t *testing.T, rows int, faults ...kfake.Fault) (names topics.Names, count func(string) uint64, h *kfake.FaultHandle, done chan error, reg *prometheus.Registry) {
	conn, db := testenv.ClickHouseDB(t)
	if _, err := Migrate(ctxT(t, time.Minute), conn); err != nil {
		t.Fatal(err)
	}
	c, brokers := testenv.KFake(t)
	names = testenv.Topics(t, brokers, "", testenv.TopicsOpts{Partitions: 1})
	prod, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	var recs []*kgo.Record
	for i := range rows {
		recs = append(recs, deduped(names.DedupedTopic(), 0, i, base.Add(time.Duration(i)*time.Second)))
	}
	recs = append(recs, &kgo.Record{Topic: names.DedupedTopic(), Partition: 0, Value: []byte("not a deduped event")})
	if err := prod.ProduceSync(ctxT(t, 30*time.Second), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	for i := range faults {
		faults[i].Topic = names.RejectedTopic()
	}
	h = c.Fault(faults...)
	reg = prometheus.NewRegistry()
	w, err := New(Config{
		Config: session.Config{Kafka: kafka.Config{Brokers: brokers}, Group: names.Prefix + "sink", InstanceID: "i1",
			SessionTimeout: 6 * time.Second, TransactionTimeout: 3 * time.Second},
		Topics: names, Conn: conn, Database: db, MaxBatchWait: 100 * time.Millisecond, CommitInterval: 300 * time.Millisecond,
		Logger: zaptest.NewLogger(t), Registerer: reg,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done = make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Error("the sink did not stop")
		}
	})
	count = func(table string) uint64 {
		var n uint64
		if err := conn.QueryRow(ctxT(t, 30*time.Second), "SELECT count() FROM "+db+"."+table).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	return names, count, h, done, reg
}

// TestParkUnwrittenThenHealed: the leader of usage.rejected unreachable
// for longer than the transaction timeout (produce requests answered
// NOT_LEADER_FOR_PARTITION, metadata LEADER_NOT_AVAILABLE) fails the
// parked record with that transient error, or leaves the window's end
// unanswered: nothing commits, the sink re-consumes (in a new session)
// and, the leader back, parks it once and writes every row once; it never
// stops.
func TestParkUnwrittenThenHealed(t *testing.T) {
	waitsMostly(t)
	names, count, h, done, reg := parkFaultSink(t, 10,
		kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Err: kerr.NotLeaderForPartition, Count: -1},
		kfake.Fault{Keys: []kmsg.Key{kmsg.Metadata}, Err: kerr.LeaderNotAvailable, Count: -1})
	// Longer than the transaction timeout, twice: each window's end
	// fails and the session is rebuilt; the sink carries on.
	for end := time.Now().Add(12 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		select {
		case err := <-done:
			t.Fatalf("the sink stopped during the outage: %v", err)
		default:
		}
	}
	if n := metric(t, reg, "meterline_sink_transactions_total", "outcome", "committed"); n > 0 {
		t.Fatalf("%v transactions committed while the parked record could not be written", n)
	}
	h.Remove()
	deadline := time.Now().Add(60 * time.Second)
	for count(TableRejected) < 1 {
		select {
		case err := <-done:
			t.Fatalf("the sink stopped: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the record is not parked within 60s of the leader's return")
		}
		time.Sleep(200 * time.Millisecond)
	}
	time.Sleep(2 * time.Second)
	if n := count(TableEvents); n != 10 {
		t.Errorf("%s: %d rows, want 10", TableEvents, n)
	}
	if n := count(TableRejected); n != 1 {
		t.Errorf("%s: %d rows, want the one parked record once", TableRejected, n)
	}
	_ = names
}

// TestParkRefusedForGoodStops: a parked record the broker refuses for
// good (MESSAGE_TOO_LARGE, INVALID_RECORD) would be refused at every
// attempt: the sink stops with an error naming the topic and the broker's
// error, rather than re-consume the window for ever; nothing of the window
// is committed.
func TestParkRefusedForGoodStops(t *testing.T) {
	for _, refusal := range []*kerr.Error{kerr.MessageTooLarge, kerr.InvalidRecord} {
		t.Run(refusal.Message, func(t *testing.T) {
			names, _, _, done, _ := parkFaultSink(t, 3, kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Err: refusal, Count: -1})
			select {
			case err := <-done:
				done <- err // for the cleanup
				if err == nil || !errors.Is(err, refusal) || !strings.Contains(err.Error(), names.RejectedTopic()) {
					t.Fatalf("the sink stopped with %v; want %s naming %s", err, refusal.Message, names.RejectedTopic())
				}
			case <-time.After(30 * time.Second):
				t.Fatalf("the sink still runs 30s after %s refused its parked record", refusal.Message)
			}
		})
	}
}

// TestParkLoginRefusedStops: the connection the sink's producer opens to
// park a record refused its login (the password changed on the cluster;
// the sink reads it at start only) would be refused at every attempt: the
// sink stops with the authentication error docs/operations.md ("Kafka:
// SASL and TLS") names, rather than re-consume the window for ever.
// kfake answers the produce requests SASL_AUTHENTICATION_FAILED, as the
// records of a refused connection fail on a real broker.
func TestParkLoginRefusedStops(t *testing.T) {
	_, _, _, done, _ := parkFaultSink(t, 3, kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Err: kerr.SaslAuthenticationFailed, Count: -1})
	select {
	case err := <-done:
		done <- err // for the cleanup
		if !errors.Is(err, kafka.ErrAuthentication) || !strings.Contains(err.Error(), "read at start") {
			t.Fatalf("the sink stopped with %v; want an authentication error saying the password is read at start only", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the sink still runs 30s after the brokers refused its login")
	}
}
