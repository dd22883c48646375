// Package testenv gives tests their Kafka and ClickHouse: an in-process
// kfake cluster for fast unit tests, or the real services named by
// METERLINE_TEST_KAFKA and METERLINE_TEST_CLICKHOUSE for integration tests.
// `make test` starts the real services and sets both variables.
package testenv

import (
	"context"
	"fmt"
	"maps"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/internal/kafka"
	"github.com/meterline/meterline/internal/topics"
)

// Environment variables naming the real services.
const (
	EnvKafka      = "METERLINE_TEST_KAFKA"
	EnvClickHouse = "METERLINE_TEST_CLICKHOUSE"
	// EnvChdb names the python of scripts/chdb-venv.sh, whose chdb embeds
	// a current ClickHouse (26.x): the second version the migrations and
	// the documented queries are checked on.
	EnvChdb = "METERLINE_TEST_CHDB"
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

// PortAbove returns the port n above that of addr (host:port). A test
// that starts a server of its own (with a deploy/local script) takes its
// ports at fixed offsets above a real test service's, from the block of
// ports that service's runner owns.
func PortAbove(t testing.TB, addr string, n int) string {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	port, err := strconv.Atoi(p)
	if err != nil {
		t.Fatalf("port of %s: %v", addr, err)
	}
	return strconv.Itoa(port + n)
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

// Chdb returns the python that runs scripts/chdb-run.py, or skips the test
// when METERLINE_TEST_CHDB is not set. With -short it always skips.
func Chdb(t testing.TB) string {
	t.Helper()
	v := os.Getenv(EnvChdb)
	if v == "" || testing.Short() {
		t.Skipf("SKIP: real ClickHouse 26 (chdb) integration test; set %s=$(scripts/chdb-venv.sh) (make test does) and drop -short", EnvChdb)
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
	// Test records often carry fixed timestamps months in the past. With
	// the broker's default retention (7 days, checked every 5 minutes) a
	// check during the test would delete every segment, active one
	// included, and a reader behind it would meet OFFSET_OUT_OF_RANGE. Test
	// topics keep everything unless the test says otherwise.
	if _, ok := configs["retention.ms"]; !ok {
		configs = maps.Clone(configs)
		if configs == nil {
			configs = map[string]*string{}
		}
		keep := "-1"
		configs["retention.ms"] = &keep
	}
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
// to the high watermarks read when it is called. A transaction still open
// below them holds the read until it ends (the test fails after 3 minutes).
// Transaction markers are read too (and not returned), so the end of each
// partition is recognised exactly.
func ReadAll(t testing.TB, brokers []string, topic string) []*kgo.Record {
	t.Helper()
	recs, err := readRange(brokers, topic, nil)
	if err != nil {
		t.Fatalf("reading %s: %v", topic, err)
	}
	return recs
}

// ReadAllMarkers is ReadAll with the transaction markers below the
// watermarks (control records) in their places among the records.
func ReadAllMarkers(t testing.TB, brokers []string, topic string) []*kgo.Record {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var recs []*kgo.Record
	if err := topics.ScanCommittedMarkersAs(ctx, kafka.Config{Brokers: brokers}, topic, nil, func(r *kgo.Record) { recs = append(recs, r) }); err != nil {
		t.Fatalf("reading %s: %v", topic, err)
	}
	return recs
}

func readRange(brokers []string, topic string, from map[int32]int64) ([]*kgo.Record, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	return topics.ReadCommitted(ctx, brokers, topic, from)
}

// CaughtUp reports whether the group has processed the topic
// (docs/operations.md, Lag): a read_committed read from the group's
// committed offsets returns no data records. Committed offsets are not
// compared with high watermarks: transaction markers sit after the last
// record.
func CaughtUp(brokers []string, group, topic string) (bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	from, err := Committed(ctx, brokers, group, topic)
	if err != nil {
		return false, err
	}
	recs, err := readRange(brokers, topic, from)
	if err != nil {
		return false, err
	}
	return len(recs) == 0, nil
}

// Committed returns the group's committed offsets of topic, by partition
// (partitions without a commit are absent).
func Committed(ctx context.Context, brokers []string, group, topic string) (map[int32]int64, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	offs, err := kadm.NewClient(cl).FetchOffsets(ctx, group)
	if err != nil {
		return nil, err
	}
	from := map[int32]int64{}
	offs.Each(func(o kadm.OffsetResponse) {
		if o.Topic == topic && o.Err == nil {
			from[o.Partition] = o.At
		}
	})
	return from, nil
}

// WaitCaughtUp waits until CaughtUp holds, or fails the test after d.
func WaitCaughtUp(t testing.TB, brokers []string, group, topic string, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		ok, err := CaughtUp(brokers, group, topic)
		if err == nil && ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("group %s not caught up on %s after %s (last error: %v)", group, topic, d, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// GroupAssignment returns the partitions of topic the broker assigned to
// the group's members, sorted.
func GroupAssignment(t testing.TB, adm *kadm.Client, group, topic string) []int32 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dg, err := adm.DescribeGroups(ctx, group)
	if err != nil {
		t.Fatalf("describe group %s: %v", group, err)
	}
	var out []int32
	for _, m := range dg[group].Members {
		if ca, ok := m.Assigned.AsConsumer(); ok {
			for _, tp := range ca.Topics {
				if tp.Topic == topic {
					out = append(out, tp.Partitions...)
				}
			}
		}
	}
	slices.Sort(out)
	return out
}

// ClearMeterlineEnv unsets every METERLINE_ variable for the rest of the
// test (they are restored after it), so that only what the test sets
// configures meterline's flag parser.
func ClearMeterlineEnv(t testing.TB) {
	t.Helper()
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "METERLINE_") {
			t.Setenv(k, "") // restored after the test
			os.Unsetenv(k)
		}
	}
}

// Beside runs t beside the other tests of its package that call Beside
// with the same slots, after the package's other tests: t.Parallel, then
// one of slots' places, so that at most cap(slots) run at once whatever
// -parallel is. The place is freed after t's cleanups, once everything the
// test started has stopped; call it first in the test.
func Beside(t *testing.T, slots chan struct{}) {
	t.Helper()
	t.Parallel()
	slots <- struct{}{}
	t.Cleanup(func() { <-slots })
}

// InitAndJoin is a test's wait for a new group session: it calls init
// (the session's InitProducerID) under ctx, then polls the session (poll,
// 100 ms at a time: kgo joins in the background) until joined (the loop's
// InGroup) returns nil or ctx ends. It returns init's error, else joined's
// last.
func InitAndJoin(ctx context.Context, init func(context.Context) error, joined func() error, poll func(context.Context)) error {
	if err := init(ctx); err != nil {
		return err
	}
	for joined() != nil && ctx.Err() == nil {
		pctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		poll(pctx)
		cancel()
	}
	return joined()
}
