package topics

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"go.uber.org/zap"

	"github.com/meterline/meterline/internal/kafka"
)

// LogAppendTime is the message.timestamp.type of a topic whose record
// timestamps are arrival times: the broker stamps each record when it
// accepts it (docs/design.md, Time).
const LogAppendTime = "LogAppendTime"

// TimestampTypeError is returned by CheckArrivalTimestamps when a topic
// whose record timestamps a stage takes as arrival times does not use
// LogAppendTime, and the stage was not told to allow it.
//
// A stage also returns it, with Record set, when a record of such a topic
// has a CreateTime timestamp after one with LogAppendTime: the topic's
// setting was changed while the stage ran.
type TimestampTypeError struct {
	Stage  string // the stage that refused to start or stopped: "dedup", "aggregator"
	Topic  string
	Have   string // the topic's message.timestamp.type
	Record string // empty at start; else the record, "partition 3 offset 42"
}

func (e *TimestampTypeError) Error() string {
	at := ""
	if e.Record != "" {
		at = fmt.Sprintf(" (its %s has a CreateTime timestamp after records with LogAppendTime: the setting was changed while %s ran)", e.Record, e.Stage)
	}
	return fmt.Sprintf("%s: topic %s has message.timestamp.type=%s%s, so its record timestamps are the producers' clocks, "+
		"yet %s takes them as arrival times (docs/operations.md, Arrival time): every producer could choose its records' arrival. "+
		"Set it to LogAppendTime (kafka-configs.sh --alter --entity-type topics --entity-name %s --add-config message.timestamp.type=LogAppendTime; "+
		"meterline topics check reports it), or, for tests and replays only, start with --allow-create-time",
		e.Stage, e.Topic, e.Have, at, e.Stage, e.Topic)
}

// CheckArrivalTimestamps reads, in one request at a stage's start, the
// message.timestamp.type of each named topic: those whose record
// timestamps stage takes as arrival times. A topic without LogAppendTime
// is a *TimestampTypeError, unless allow is set: then log gets a warning
// naming it, and there is no error.
func CheckArrivalTimestamps(ctx context.Context, conn kafka.Config, stage string, allow bool, log *zap.Logger, names ...string) error {
	describeErr := func(what any, err error) error {
		if errors.Is(err, kerr.TopicAuthorizationFailed) {
			return fmt.Errorf("%s: describe the configs of %v, to check that it uses LogAppendTime: %w (%s needs DescribeConfigs on the topic: docs/operations.md, Security and ACLs)", stage, what, err, conn.Principal())
		}
		return fmt.Errorf("%s: describe the configs of %v: %w", stage, what, err)
	}
	rcs, err := describeConfigs(ctx, conn, names...)
	if err != nil {
		return describeErr(names, err)
	}
	for _, name := range names {
		rc, err := rcs.On(name, nil)
		if err == nil {
			err = rc.Err
		}
		if err != nil {
			return describeErr(name, err)
		}
		have := "(unset)"
		for _, c := range rc.Configs {
			if c.Key == "message.timestamp.type" && c.Value != nil {
				have = *c.Value
			}
		}
		if have == LogAppendTime {
			continue
		}
		if !allow {
			return &TimestampTypeError{Stage: stage, Topic: name, Have: have}
		}
		log.Warn("record timestamps taken as arrival times are the producers' clocks: the topic does not use LogAppendTime, allowed by --allow-create-time (tests and replays only)",
			zap.String("topic", name), zap.String("message.timestamp.type", have))
	}
	return nil
}

// ChangelogRetentionError is returned by CheckChangelogKeeps when a
// changelog's cleanup policy deletes records sooner than its stage may
// need them on a restore.
type ChangelogRetentionError struct {
	Stage  string // the stage that refused to start or to restore: "dedup", "aggregator"
	Topic  string
	Policy string        // the topic's cleanup.policy
	Have   time.Duration // its retention.ms
	Need   time.Duration // the least retention.ms; 0: records must be kept for ever
}

func (e *ChangelogRetentionError) Error() string {
	need, set := "for ever", "cleanup.policy=compact"
	if e.Need > 0 {
		need = "for at least " + e.Need.String()
		set = fmt.Sprintf("retention.ms=%d", e.Need.Milliseconds())
	}
	return fmt.Sprintf("%s: changelog %s has cleanup.policy=%s and retention.ms=%d (%s), so the brokers delete its records after that; "+
		"a restore must read them %s, or it loses state the running stage still holds (docs/operations.md, Topics). "+
		"Set it (kafka-configs.sh --alter --entity-type topics --entity-name %s --add-config %s; meterline topics check reports it)",
		e.Stage, e.Topic, e.Policy, e.Have.Milliseconds(), e.Have, need, e.Topic, set)
}

// CheckChangelogKeeps reads, at a stage's start, the cleanup.policy and
// retention.ms of its changelog topic and judges them (ChangelogKeeps). The
// stage's restores read the topic's delete.retention.ms with the same
// DescribeConfigs; without that ACL, or with a topic the brokers do not
// describe, log gets a warning and there is no error.
func CheckChangelogKeeps(ctx context.Context, conn kafka.Config, stage string, log *zap.Logger, topic string, need time.Duration) error {
	cfg, err := topicConfigs(ctx, conn, topic)
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("%s: describe the configs of changelog %s: %w", stage, topic, err)
		}
		log.Warn("cannot read the changelog's cleanup.policy and retention.ms to check that it keeps the state a restore reads (grant DescribeConfigs on the topic)",
			zap.String("changelog", topic), zap.Error(err))
		return nil
	}
	return ChangelogKeeps(stage, topic, cfg, need)
}

// ReadChangelogKeeps reads the changelog's configs with adm and judges them
// (ChangelogKeeps): keeps is what ChangelogKeeps returns, err an error
// reading them. A running stage's re-check (internal/stream).
func ReadChangelogKeeps(ctx context.Context, adm *kadm.Client, stage, topic string, need time.Duration) (keeps, err error) {
	rcs, err := adm.DescribeTopicConfigs(ctx, topic)
	if err != nil {
		return nil, err
	}
	cfg, err := configsOf(rcs, topic)
	if err != nil {
		return nil, err
	}
	return ChangelogKeeps(stage, topic, cfg, need), nil
}

// ChangelogKeeps judges a changelog's configs (cleanup.policy and
// retention.ms, as topicConfigs gives them): a policy with delete and a
// finite retention shorter than need (need 0: any finite retention) is a
// *ChangelogRetentionError; a retention.ms that is no number another
// error; else nil.
func ChangelogKeeps(stage, topic string, cfg map[string]string, need time.Duration) error {
	policy, retention := cfg["cleanup.policy"], cfg["retention.ms"]
	if !strings.Contains(policy, "delete") {
		return nil
	}
	ms, err := strconv.ParseInt(retention, 10, 64)
	if err != nil {
		return fmt.Errorf("%s: changelog %s: retention.ms %q is not a number of ms", stage, topic, retention)
	}
	if ms < 0 || ms > math.MaxInt64/int64(time.Millisecond) || need > 0 && time.Duration(ms)*time.Millisecond >= need {
		return nil
	}
	return &ChangelogRetentionError{Stage: stage, Topic: topic, Policy: policy, Have: time.Duration(ms) * time.Millisecond, Need: need}
}

// describeConfigs describes the configs of the named topics with a client
// of its own, within 30 s, seeded with the brokers the cluster lists
// (kafka.NewListedClient): a stage's checks at start do not wait on a
// seed broker that does not answer.
func describeConfigs(ctx context.Context, conn kafka.Config, names ...string) (kadm.ResourceConfigs, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cl, err := kafka.NewListedClient(ctx, conn)
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	return kadm.NewClient(cl).DescribeTopicConfigs(ctx, names...)
}

// topicConfigs returns the configs of one topic (describeConfigs), each
// value "(unset)" when the brokers give none.
func topicConfigs(ctx context.Context, conn kafka.Config, topic string) (map[string]string, error) {
	rcs, err := describeConfigs(ctx, conn, topic)
	if err != nil {
		return nil, err
	}
	return configsOf(rcs, topic)
}

// configsOf returns the configs of topic in rcs, each value "(unset)"
// when the brokers give none.
func configsOf(rcs kadm.ResourceConfigs, topic string) (map[string]string, error) {
	rc, err := rcs.On(topic, nil)
	if err == nil {
		err = rc.Err
	}
	if err != nil {
		return nil, err
	}
	out := map[string]string{"cleanup.policy": "(unset)", "retention.ms": "(unset)"}
	for _, c := range rc.Configs {
		if c.Value != nil {
			out[c.Key] = *c.Value
		}
	}
	return out, nil
}

// CompactedEventLogError is returned by CheckEventLog when a topic whose
// every record a stage must read (usage.events for dedup, usage.deduped for
// the aggregator) has compaction in its cleanup.policy: the brokers keep
// only the last record of each key there, so a stage that lags, or reads
// the topic again after a reset, never sees the others.
type CompactedEventLogError struct {
	Stage  string // the stage that refused to start: "dedup", "aggregator"
	Topic  string
	Policy string // the topic's cleanup.policy
}

func (e *CompactedEventLogError) Error() string {
	return fmt.Sprintf("%s: topic %s has cleanup.policy=%s, so the brokers keep only the last record of each key there and drop the others "+
		"(events of one customer or copies of one identity) before %s reads them: events would be lost from the bills "+
		"(docs/operations.md, Topics). Set it (kafka-configs.sh --alter --entity-type topics --entity-name %s --add-config cleanup.policy=delete; "+
		"meterline topics check reports it)",
		e.Stage, e.Topic, e.Policy, e.Stage, e.Topic)
}

// CheckEventLog reads, at a stage's start, the cleanup.policy of a topic
// whose every record the stage must read: one with compact in it is a
// *CompactedEventLogError. Without DescribeConfigs on the topic, or with
// a topic the brokers do not describe, log gets a warning and there is no
// error.
func CheckEventLog(ctx context.Context, conn kafka.Config, stage string, log *zap.Logger, topic string) error {
	cfg, err := topicConfigs(ctx, conn, topic)
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("%s: describe the configs of %s: %w", stage, topic, err)
		}
		log.Warn("cannot read the topic's cleanup.policy to check that it keeps every record (grant DescribeConfigs on the topic)",
			zap.String("topic", topic), zap.Error(err))
		return nil
	}
	if policy := cfg["cleanup.policy"]; strings.Contains(policy, "compact") {
		return &CompactedEventLogError{Stage: stage, Topic: topic, Policy: policy}
	}
	return nil
}
