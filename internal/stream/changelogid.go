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
//
// The store is held to the topic ID of each input topic too
// (Store.BindInputID): its input offsets are offsets of those logs.
func (rt *Runtime) checkChangelogID(ctx context.Context, cl *kgo.Client, log *zap.Logger) error {
	adm := kadm.NewClient(cl)
	id, err := readTopicID(ctx, adm, rt.cfg.ChangelogTopic, log)
	if err != nil {
		return err
	}
	if err := rt.store.BindChangelogID(rt.cfg.ChangelogTopic, id, rt.cfg.StateDir); err != nil {
		return err
	}
	for _, topic := range rt.cfg.inputs() {
		id, err := readTopicID(ctx, adm, topic, log)
		if err != nil {
			return err
		}
		if err := rt.store.BindInputID(topic, id, rt.cfg.StateDir); err != nil {
			return err
		}
	}
	return nil
}

// readTopicID reads the topic ID of topic, retrying as checkChangelogID
// says.
func readTopicID(ctx context.Context, adm *kadm.Client, topic string, log *zap.Logger) (kadm.TopicID, error) {
	const attempts = 20
	for attempt := 1; ; attempt++ {
		id, err := topicID(ctx, adm, topic)
		if err == nil {
			return id, nil
		}
		unknown := errors.Is(err, kerr.UnknownTopicOrPartition) || errors.Is(err, kerr.UnknownTopicID)
		var ke *kerr.Error // a broker's answer; other errors (connections) are retried
		switch {
		case ctx.Err() != nil:
			return kadm.TopicID{}, ctx.Err()
		case errors.As(err, &ke) && !ke.Retriable, unknown && attempt >= attempts:
			return kadm.TopicID{}, fmt.Errorf("stream: read the topic ID of %s, %d attempts: %w", topic, attempt, err)
		case attempt%attempts == 0:
			log.Warn("waiting to read a topic's ID", zap.String("topic", topic), zap.Int("attempts", attempt), zap.Error(err))
		}
		select {
		case <-ctx.Done():
			return kadm.TopicID{}, ctx.Err()
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
