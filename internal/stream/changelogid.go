package stream

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"
)

// checkChangelogID reads the topic ID of the changelog from the brokers
// and holds the store to it (Store.BindChangelogID) before a restore or a
// standby tail copies the changelog into the store. A changelog deleted
// and created again under its name (a broker's data wiped, a new
// deployment on the same topics) is another log: the store's checkpoints
// are offsets of the old one, and once the new one has grown past them a
// copy would replay its tail onto the old state, with nothing else to
// notice (the group's offsets agree with the new log). Errors other than
// a broker's permanent answer (authorization) are retried until ctx ends,
// as the restore's listings are; a changelog that stays unknown is an
// error.
func (rt *Runtime) checkChangelogID(ctx context.Context, cl *kgo.Client, log *zap.Logger) error {
	adm := kadm.NewClient(cl)
	topic := rt.cfg.ChangelogTopic
	const attempts = 20
	for attempt := 1; ; attempt++ {
		id, err := topicID(ctx, adm, topic)
		if err == nil {
			return rt.store.BindChangelogID(topic, id, rt.cfg.StateDir)
		}
		unknown := errors.Is(err, kerr.UnknownTopicOrPartition) || errors.Is(err, kerr.UnknownTopicID)
		var ke *kerr.Error // a broker's answer; other errors (connections) are retried
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case errors.As(err, &ke) && !ke.Retriable, unknown && attempt >= attempts:
			return fmt.Errorf("stream: read the topic ID of changelog %s, %d attempts: %w", topic, attempt, err)
		case attempt%attempts == 0:
			log.Warn("waiting to read the changelog's topic ID", zap.String("changelog", topic), zap.Int("attempts", attempt), zap.Error(err))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(listRetry):
		}
	}
}

// topicID returns the topic ID of topic (all zeros from a broker without
// topic IDs).
func topicID(ctx context.Context, adm *kadm.Client, topic string) (kadm.TopicID, error) {
	tds, err := adm.ListTopics(ctx, topic)
	if err != nil {
		return kadm.TopicID{}, err
	}
	td, ok := tds[topic]
	if !ok {
		return kadm.TopicID{}, kerr.UnknownTopicOrPartition
	}
	return td.ID, td.Err
}
