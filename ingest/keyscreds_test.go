package ingest

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/meterline/meterline/internal/kafka"
	"github.com/meterline/meterline/internal/testenv"
)

// TestKeysStopWhenCredentialsRefused: an ingest whose SASL user or
// password the brokers refuse while it runs (the password changed on the
// cluster; the ingest reads it at start only) stops with an
// authentication error that says so, instead of answering 503 for ever:
// no retry makes its password right. kfake stands in for the refusal by
// answering the listing of the keys topic's ends with
// SASL_AUTHENTICATION_FAILED, as the client reports a connection whose
// authentication the broker refused.
func TestKeysStopWhenCredentialsRefused(t *testing.T) {
	const topic = "meterline.keys"
	cluster, brokers := testenv.KFake(t, kfake.SeedTopics(1, topic))
	var refuse atomic.Bool
	cluster.ControlKey(kmsg.ListOffsets.Int16(), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		cluster.KeepControl()
		if !refuse.Load() {
			return nil, nil, false
		}
		req := kreq.(*kmsg.ListOffsetsRequest)
		resp := req.ResponseKind().(*kmsg.ListOffsetsResponse)
		for _, rt := range req.Topics {
			st := kmsg.NewListOffsetsResponseTopic()
			st.Topic = rt.Topic
			for _, rp := range rt.Partitions {
				sp := kmsg.NewListOffsetsResponseTopicPartition()
				sp.Partition = rp.Partition
				sp.ErrorCode = kerr.SaslAuthenticationFailed.Code
				st.Partitions = append(st.Partitions, sp)
			}
			resp.Topics = append(resp.Topics, st)
		}
		return resp, nil, true
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	keys := NewKeys(topic, nil)
	keys.probe = 200 * time.Millisecond
	done := make(chan error, 1)
	go func() { done <- keys.Follow(ctx, kgo.SeedBrokers(brokers...)) }()
	select {
	case <-keys.Loaded():
	case err := <-done:
		t.Fatalf("Follow ended before the keys were loaded: %v", err)
	case <-ctx.Done():
		t.Fatal("keys not loaded")
	}
	refuse.Store(true)
	select {
	case err := <-done:
		if !errors.Is(err, kafka.ErrAuthentication) || !strings.Contains(err.Error(), "read at start") {
			t.Fatalf("Follow ended with %v; want an authentication error saying the password is read at start", err)
		}
	case <-ctx.Done():
		t.Fatal("Follow went on with credentials the brokers refuse")
	}
}
