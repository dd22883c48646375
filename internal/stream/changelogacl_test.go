package stream

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// TestChangelogReadNotAuthorizedNamesACL: a restore refused the changelog
// (its principal lacks Read on it) stops the stage with an error naming
// the changelog topic and the ACL.
func TestChangelogReadNotAuthorizedNamesACL(t *testing.T) {
	t.Parallel()
	s := newSuite(t, nil, nil)
	a := s.start("a", vfs.NewMem())
	s.send(20)
	s.caughtUp()
	a.shutdown()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	td, err := s.adm.ListTopics(ctx, s.changelog)
	if err != nil {
		t.Fatal(err)
	}
	id := td[s.changelog].ID
	s.cluster.ControlKey(kmsg.Fetch.Int16(), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		s.cluster.KeepControl()
		req := kreq.(*kmsg.FetchRequest)
		resp := req.ResponseKind().(*kmsg.FetchResponse)
		refused := false
		for _, rt := range req.Topics {
			if rt.Topic != s.changelog && rt.TopicID != id {
				continue
			}
			refused = true
			st := kmsg.NewFetchResponseTopic()
			st.Topic, st.TopicID = rt.Topic, rt.TopicID
			for _, rp := range rt.Partitions {
				sp := kmsg.NewFetchResponseTopicPartition()
				sp.Partition = rp.Partition
				sp.ErrorCode = kerr.TopicAuthorizationFailed.Code
				st.Partitions = append(st.Partitions, sp)
			}
			resp.Topics = append(resp.Topics, st)
		}
		if !refused {
			return nil, nil, false
		}
		return resp, nil, true
	})
	b := s.start("b", vfs.NewMem())
	err = b.exit()
	if err == nil || !strings.Contains(err.Error(), "TOPIC_AUTHORIZATION_FAILED") {
		t.Fatalf("Run = %v, want it to stop on TOPIC_AUTHORIZATION_FAILED", err)
	}
	for _, want := range []string{"Read on topic " + s.changelog, "Security and ACLs"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
}
