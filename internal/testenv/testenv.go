// Package testenv gives tests their Kafka and ClickHouse: an in-process
// kfake cluster for fast unit tests, or the real services named by
// METERLINE_TEST_KAFKA and METERLINE_TEST_CLICKHOUSE for integration tests.
// `make test` starts the real services and sets both variables.
package testenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/internal/topics"
)

// Environment variables naming the real services.
const (
	EnvKafka      = "METERLINE_TEST_KAFKA"
	EnvClickHouse = "METERLINE_TEST_CLICKHOUSE"
)

// RealKafka returns the seed brokers of the real test broker, or skips the
// test, saying so plainly, when METERLINE_TEST_KAFKA is not set. With -short
// it always skips.
func RealKafka(t testing.TB) []string {
	t.Helper()
	v := os.Getenv(EnvKafka)
	if v == "" || testing.Short() {
		t.Skipf("SKIP: real Kafka integration test; set %s=host:port (make test does) and drop -short", EnvKafka)
	}
	return strings.Split(v, ",")
}

// RealClickHouse returns the native address of the real test ClickHouse,
// or skips the test when METERLINE_TEST_CLICKHOUSE is not set.
func RealClickHouse(t testing.TB) string {
	t.Helper()
	v := os.Getenv(EnvClickHouse)
	if v == "" || testing.Short() {
		t.Skipf("SKIP: real ClickHouse integration test; set %s=host:port (make test does) and drop -short", EnvClickHouse)
	}
	return v
}

// KFake starts an in-process kfake cluster for the test and returns its
// seed brokers. It is closed when the test ends.
func KFake(t testing.TB, opts ...kfake.Opt) (*kfake.Cluster, []string) {
	t.Helper()
	opts = append([]kfake.Opt{kfake.NumBrokers(1)}, opts...)
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		t.Fatalf("kfake: %v", err)
	}
	t.Cleanup(c.Close)
	return c, c.ListenAddrs()
}

var seq atomic.Int64

// Name returns a name unique to this test run and test, for topics and
// groups, so tests can share one broker: "t<pid>-<n>-<base>".
func Name(t testing.TB, base string) string {
	n := seq.Add(1)
	return fmt.Sprintf("t%d-%d-%s", os.Getpid(), n, base)
}

// Admin returns an admin client on the brokers, closed when the test ends.
func Admin(t testing.TB, brokers []string) *kadm.Client {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return kadm.NewClient(cl)
}

// CreateTopic creates a topic and deletes it when the test ends. configs
// may be nil.
func CreateTopic(t testing.TB, brokers []string, name string, partitions int32, configs map[string]*string) {
	t.Helper()
	adm := Admin(t, brokers)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := adm.CreateTopic(ctx, partitions, 1, configs, name)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		t.Fatalf("create topic %s: %v", name, err)
	}
	if err := topics.WaitVisible(ctx, adm, name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = adm.DeleteTopics(ctx, name)
	})
}

// ReadAll reads every committed record of the topic, read_committed, up
// to the last stable offsets read when it is called. Only committed
// records are returned, so callers that expect more must wait for the
// producing stage first.
//
// Transaction markers occupy offsets after the last record, so a
// partition can end below its LSO with no record left to see. ReadAll
// therefore stops when every partition reached its LSO, or when nothing
// new arrived for quiet (the broker is local; every committed record below
// the LSO is fetchable at once).
func ReadAll(t testing.TB, brokers []string, topic string) []*kgo.Record {
	t.Helper()
	const quiet = 2 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	adm := Admin(t, brokers)
	ends, err := adm.ListCommittedOffsets(ctx, topic) // read_committed end = LSO
	if err != nil {
		t.Fatalf("end offsets of %s: %v", topic, err)
	}
	want := map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) {
		if o.Offset > 0 {
			want[o.Partition] = o.Offset
		}
	})
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var out []*kgo.Record
	for len(want) > 0 {
		pctx, pcancel := context.WithTimeout(ctx, quiet)
		fs := cl.PollFetches(pctx)
		pcancel()
		if ctx.Err() != nil {
			t.Fatalf("reading %s: %v (still waiting on %v)", topic, ctx.Err(), want)
		}
		n := 0
		fs.EachError(func(_ string, p int32, err error) {
			if pctx.Err() == nil || !(errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)) {
				t.Fatalf("fetch %s/%d: %v", topic, p, err)
			}
		})
		fs.EachRecord(func(r *kgo.Record) {
			n++
			out = append(out, r)
			if end, ok := want[r.Partition]; ok && r.Offset+1 >= end {
				delete(want, r.Partition)
			}
		})
		if n == 0 {
			break // quiet: the rest of each partition is markers or aborted records
		}
	}
	return out
}
