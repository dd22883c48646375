package topics

import (
	"context"
	"errors"
	"fmt"
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
type TimestampTypeError struct {
	Stage string // the stage that refused to start: "dedup", "aggregator"
	Topic string
	Have  string // the topic's message.timestamp.type
}

func (e *TimestampTypeError) Error() string {
	return fmt.Sprintf("%s: topic %s has message.timestamp.type=%s, so its record timestamps are the producers' clocks, "+
		"yet %s takes them as arrival times (docs/operations.md, Arrival time): every producer could choose its records' arrival. "+
		"Set it to LogAppendTime (kafka-configs.sh --alter --entity-type topics --entity-name %s --add-config message.timestamp.type=LogAppendTime; "+
		"meterline topics check reports it), or, for tests and replays only, start with --allow-create-time",
		e.Stage, e.Topic, e.Have, e.Stage, e.Topic)
}

// CheckArrivalTimestamps reads, in one request at a stage's start, the
// message.timestamp.type of each named topic: those whose record
// timestamps stage takes as arrival times. A topic without LogAppendTime
// is a *TimestampTypeError, unless allow is set: then log gets a warning
// naming it, and there is no error.
func CheckArrivalTimestamps(ctx context.Context, conn kafka.Config, stage string, allow bool, log *zap.Logger, names ...string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cl, err := kafka.NewClient(conn)
	if err != nil {
		return err
	}
	defer cl.Close()
	describeErr := func(what any, err error) error {
		if errors.Is(err, kerr.TopicAuthorizationFailed) {
			return fmt.Errorf("%s: describe the configs of %v, to check that it uses LogAppendTime: %w (the principal needs DescribeConfigs on the topic: docs/operations.md, Security and ACLs)", stage, what, err)
		}
		return fmt.Errorf("%s: describe the configs of %v: %w", stage, what, err)
	}
	rcs, err := kadm.NewClient(cl).DescribeTopicConfigs(ctx, names...)
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
