package stream

import (
	"errors"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// TestWriteNotAuthorizedNamesACL: a stage whose principal may not write
// one of the topics of its transactions (an output, the changelog) stops
// with an error naming the topic and the ACL it lacks, as a refused read,
// group or transactional ID does (docs/operations.md, ACLs).
func TestWriteNotAuthorizedNamesACL(t *testing.T) {
	t.Parallel()
	for _, which := range []string{"output", "changelog"} {
		t.Run(which, func(t *testing.T) {
			t.Parallel()
			s := newSuite(t, nil, nil)
			topic := s.output
			if which == "changelog" {
				topic = s.changelog
			}
			a := s.start("a", vfs.NewMem())
			s.send(10)
			s.caughtUp()
			s.cluster.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: topic, Err: kerr.TopicAuthorizationFailed, Count: -1})
			s.send(10)
			err := a.exit()
			if !errors.Is(err, kerr.TopicAuthorizationFailed) {
				t.Fatalf("Run = %v; want it to stop on TOPIC_AUTHORIZATION_FAILED", err)
			}
			for _, want := range []string{"needs Write on topic " + topic, "Security and ACLs"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not say %q", err, want)
				}
			}
		})
	}
}
