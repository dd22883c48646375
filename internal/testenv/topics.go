package testenv

import (
	"context"
	"errors"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/meterline/meterline/internal/topics"
)

// TopicsOpts shape the topics Topics creates. The zero value is the
// production layout (topics.DefaultLayout) with 4 partitions.
type TopicsOpts struct {
	// Partitions of every topic; default 4.
	Partitions int32
	// Sources, when set, is the partition count of usage.events and of the
	// dedup changelog: the dedup source partitions whose watermarks the
	// aggregator waits for, when a test wants it to differ from
	// Partitions.
	Sources int32
	// EventsTimestamp is the message.timestamp.type of usage.events,
	// usage.deduped, usage.entitlements and usage.balances (the layout's
	// EventsTimestamp): LogAppendTime (the default, as in production:
	// their timestamps are the broker's clock) or CreateTime (tests that
	// choose broker times).
	EventsTimestamp string
}

// Topics creates every topic of docs/design.md, Topics (topics.Specs of the
// layout that o describes) under a prefix unique to the test, "<Name(t,
// base)>.", and returns their names. The topics, and every consumer group
// whose name starts with the prefix (name the test's groups Prefix +
// "dedup", …), are deleted when the test ends.
//
// Test topics keep every record: retention.ms is -1 on every topic whose
// cleanup policy deletes (see CreateTopic: test records often carry
// timestamps months in the past, which the production retention would
// delete at the broker's next check, in the middle of the test), and a
// compacted topic whose timestamps the test chooses (EventsTimestamp
// CreateTime: usage.entitlements, usage.balances) is never compacted:
// min.compaction.lag.ms counts record time too, so every record of the
// test would be old enough at once, and the broker rolls a segment by
// record time (segment.ms), so a test spanning a week of broker time
// would see the records a later one superseded vanish while it runs.
func Topics(t testing.TB, brokers []string, base string, o TopicsOpts) topics.Names {
	t.Helper()
	names := topics.DefaultNames()
	names.Prefix = Name(t, base) + "."
	layout := topics.DefaultLayout()
	layout.Partitions = 4
	if o.Partitions > 0 {
		layout.Partitions = o.Partitions
	}
	if o.EventsTimestamp != "" {
		layout.EventsTimestamp = o.EventsTimestamp
	}
	specs := topics.Specs(names, layout)
	for i := range specs {
		sp := &specs[i]
		if o.Sources > 0 && (sp.Name == names.EventsTopic() || sp.PartitionsOf == names.EventsTopic()) {
			sp.Partitions = o.Sources
		}
		if strings.Contains(sp.Configs["cleanup.policy"], "delete") {
			sp.Configs["retention.ms"] = "-1"
		}
		if sp.Configs["message.timestamp.type"] == "CreateTime" && strings.Contains(sp.Configs["cleanup.policy"], "compact") {
			sp.Configs["min.compaction.lag.ms"] = strconv.FormatInt(math.MaxInt64, 10)
		}
	}
	adm := Admin(t, brokers)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := topics.Create(ctx, adm, specs, -1); err != nil {
		t.Fatalf("creating the topics under %s: %v", names.Prefix, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if gs, err := adm.ListGroups(ctx); err == nil {
			var ours []string
			for _, g := range gs.Groups() {
				if strings.HasPrefix(g, names.Prefix) {
					ours = append(ours, g)
				}
			}
			if len(ours) > 0 {
				_, _ = adm.DeleteGroups(ctx, ours...)
			}
		}
		ns := make([]string, len(specs))
		for i, sp := range specs {
			ns[i] = sp.Name
		}
		_, _ = adm.DeleteTopics(ctx, ns...)
	})
	return names
}

// CreateTimeRefused checks a stage's start on topic, whose record
// timestamps the stage takes as arrival times and whose
// message.timestamp.type is CreateTime: start(false, log) must fail with a
// *topics.TimestampTypeError that names the topic, the setting and the
// fix, and start(true, log), the stage allowing CreateTime, must succeed
// and log one warning naming the topic.
func CreateTimeRefused(t testing.TB, topic string, start func(allow bool, log *zap.Logger) error) {
	t.Helper()
	err := start(false, zap.NewNop())
	var te *topics.TimestampTypeError
	if !errors.As(err, &te) || te.Topic != topic || te.Have != "CreateTime" {
		t.Fatalf("start on CreateTime topic %s: %v, want a *topics.TimestampTypeError naming it", topic, err)
	}
	for _, want := range []string{topic, "message.timestamp.type=CreateTime", "LogAppendTime", "--allow-create-time"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	core, logs := observer.New(zap.WarnLevel)
	if err := start(true, zap.New(core)); err != nil {
		t.Fatalf("start allowing CreateTime: %v", err)
	}
	if n := logs.FilterField(zap.String("topic", topic)).FilterMessageSnippet("LogAppendTime").Len(); n != 1 {
		t.Errorf("%d warnings naming %s, want 1: %v", n, topic, logs.All())
	}
}

// ShortChangelogRefused sets the changelog topic's cleanup.policy to
// compact,delete with a retention.ms of one hour on brokers, and checks
// that start fails with a *topics.ChangelogRetentionError naming the
// topic; after the retention is set back to need (0: -1, infinite),
// start must succeed.
func ShortChangelogRefused(t testing.TB, brokers []string, topic string, need time.Duration, start func() error) {
	t.Helper()
	set := func(retention time.Duration) {
		t.Helper()
		ms := int64(-1)
		if retention > 0 {
			ms = retention.Milliseconds()
		}
		AlterTopicConfigs(t, brokers, topic, map[string]string{"cleanup.policy": "compact,delete", "retention.ms": strconv.FormatInt(ms, 10)})
	}
	set(time.Hour)
	err := start()
	var ce *topics.ChangelogRetentionError
	if !errors.As(err, &ce) || ce.Topic != topic || ce.Have != time.Hour || ce.Need != need {
		t.Fatalf("start with changelog %s kept 1h: %v, want a *topics.ChangelogRetentionError naming it, 1h and %s", topic, err, need)
	}
	set(need)
	if err := start(); err != nil {
		t.Fatalf("start with changelog %s kept %s: %v", topic, need, err)
	}
}

// AlterTopicConfigs sets configs of topic on brokers.
func AlterTopicConfigs(t testing.TB, brokers []string, topic string, configs map[string]string) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var alters []kadm.AlterConfig
	for k, v := range configs {
		alters = append(alters, kadm.AlterConfig{Op: kadm.SetConfig, Name: k, Value: kadm.StringPtr(v)})
	}
	rs, err := kadm.NewClient(cl).AlterTopicConfigs(ctx, alters, topic)
	if err == nil {
		for _, r := range rs {
			if r.Err != nil {
				err = r.Err
			}
		}
	}
	if err != nil {
		t.Fatalf("alter the configs of %s: %v", topic, err)
	}
	// A broker applies the change when the controller's record reaches it:
	// a DescribeConfigs just after the answer can still read the old
	// values. Wait until it reads the new ones.
	adm := kadm.NewClient(cl)
	for {
		rcs, err := adm.DescribeTopicConfigs(ctx, topic)
		if err == nil && configsHave(rcs, configs) {
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("the configs of %s do not read %v after the change: %v", topic, configs, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// configsHave reports whether rcs, the configs of one topic, hold want.
func configsHave(rcs kadm.ResourceConfigs, want map[string]string) bool {
	if len(rcs) != 1 || rcs[0].Err != nil {
		return false
	}
	have := map[string]string{}
	for _, c := range rcs[0].Configs {
		have[c.Key] = c.MaybeValue()
	}
	for k, v := range want {
		if have[k] != v {
			return false
		}
	}
	return true
}
