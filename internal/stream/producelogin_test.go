package stream

import (
	"errors"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/meterline/meterline/internal/kafka"
)

// TestProduceLoginRefusedStopsStage: a stage whose password the brokers
// refuse on the connection its producer opens while it runs (the password
// changed on the cluster; the stage reads it at start only) stops with the
// authentication error docs/operations.md ("Kafka: SASL and TLS")
// describes, naming the user and saying the password is read at start
// only, as the refusals of its other connections do. On a real cluster the
// records of the transaction fail with SASL_AUTHENTICATION_FAILED; kfake
// answers the produce requests with it.
func TestProduceLoginRefusedStopsStage(t *testing.T) {
	s := newSuite(t, nil, nil)
	a := s.start("a", vfs.NewMem())
	s.send(10)
	s.caughtUp()
	s.cluster.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: s.output, Err: kerr.SaslAuthenticationFailed, Count: -1})
	s.send(10)
	err := a.exit()
	if !errors.Is(err, kafka.ErrAuthentication) || !strings.Contains(err.Error(), "read at start") {
		t.Fatalf("Run = %v; want an authentication error saying the password is read at start only", err)
	}
}
