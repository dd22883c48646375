package session

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/meterline/meterline/internal/kafka"
	"github.com/meterline/meterline/internal/testenv"
)

// TestOpenAroundSilentSeed: the first of the stage's seed brokers accepts
// connections and never answers (paused, its host cut off; the cluster
// fenced it and lists only the broker that serves). Each new session
// initialises its transactional ID and joins its group within seconds,
// session after session: a new client's first requests that may go to
// any broker went to its seeds in turn, and the one that picked the
// silent seed waited for kgo's request timeout overhead twice, longer
// than InitProducerID's bound, so that sessions were rebuilt until the
// broker was back (docs/operations.md, "One broker paused or killed").
// Once initialised, the session's seeds are those of --brokers the
// cluster listed.
func TestOpenAroundSilentSeed(t *testing.T) {
	_, brokers := testenv.KFake(t)
	topic := testenv.Name(t, "in")
	testenv.CreateTopic(t, brokers, topic, 1, nil)
	silent := testenv.NewProxy(t, brokers[0])
	silent.Silence()

	c := Config{Kafka: kafka.Config{Brokers: append([]string{silent.Addr()}, brokers...)}, Group: testenv.Name(t, "group"),
		InstanceID: "i", SessionTimeout: 6 * time.Second}
	c.EnsureDefaults()
	l, err := NewLoop(c, zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)), NewMetrics(prometheus.NewRegistry(), testNames, "test records"), "")
	if err != nil {
		t.Fatal(err)
	}
	hooks := Hooks{
		Assigned: func(_ context.Context, offs map[string]map[int32]kgo.Offset) (map[string]map[int32]kgo.Offset, error) {
			return offs, nil
		},
		Revoked: func(context.Context, *kgo.Client, map[string][]int32) {},
	}
	const within = 5 * time.Second
	for i := range 3 {
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), within)
		sess, err := l.Open([]string{topic}, hooks)
		if err != nil {
			t.Fatal(err)
		}
		err = testenv.InitAndJoin(ctx, func(ctx context.Context) error { return l.InitProducerID(ctx, sess.Client()) }, l.InGroup,
			func(ctx context.Context) { sess.PollFetches(ctx) })
		cancel()
		// Its seeds are --brokers again, but only the one the cluster
		// lists: the silent one would be picked now and then.
		seeds := len(sess.Client().SeedBrokers())
		l.Close(sess)
		if err == nil && seeds != 1 {
			t.Fatalf("session %d: %d seed brokers once initialised, want 1 (the silent seed dropped)", i+1, seeds)
		}
		if err != nil {
			t.Fatalf("session %d with a silent seed broker: after %s: %v", i+1, time.Since(start).Round(time.Millisecond), err)
		}
		t.Logf("session %d initialised and joined in %s", i+1, time.Since(start).Round(time.Millisecond))
	}
}
