package session

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/meterline/meterline/internal/kafka"
)

func fetchesWith(err error) kgo.Fetches {
	return kgo.Fetches{{Topics: []kgo.FetchTopic{{Partitions: []kgo.FetchPartition{{Partition: 0, Err: err}}}}}}
}

// TestFetchErrorRejoins: the losses of a group or of its coordinator that
// kgo repairs by rejoining never stop a stage, the sink or a stream stage
// (on a cluster, a killed or paused broker that coordinated the group
// produced each of these and stopped both sink instances); other errors
// still do.
func TestFetchErrorRejoins(t *testing.T) {
	session := func(err error) error { return &kgo.ErrGroupSession{Err: err} }
	for name, err := range map[string]error{
		"unknown member":     session(kerr.UnknownMemberID),
		"illegal generation": session(kerr.IllegalGeneration),
		"not coordinator":    session(kerr.NotCoordinator),
		"coordinator gone":   session(kerr.CoordinatorNotAvailable),
		"coordinator moving": session(kerr.CoordinatorLoadInProgress),
		"dial refused": session(fmt.Errorf("unable to dial: %w",
			&net.OpError{Op: "dial", Net: "tcp", Err: &os.SyscallError{Syscall: "connect", Err: syscall.ECONNREFUSED}})),
		"connection reset": session(&net.OpError{Op: "read", Net: "tcp", Err: &os.SyscallError{Syscall: "read", Err: syscall.ECONNRESET}}),
		"eof":              session(io.EOF),
		// kgo does not retry it without kgo.AlwaysRetryEOF: a broker
		// dropping connections (kfake in the demo) closes new ones too.
		"closed at the first request": session(&kgo.ErrFirstReadEOF{}),
	} {
		if got := FetchError(zap.NewNop(), "User:u", "g", fetchesWith(err)); got != nil {
			t.Errorf("%s: the stage stops with %v; it must rejoin", name, got)
		}
	}
	for name, err := range map[string]error{
		"group not authorized": session(kerr.GroupAuthorizationFailed),
		"topic not authorized": kerr.TopicAuthorizationFailed,
		"offset out of range":  kerr.OffsetOutOfRange,
	} {
		got := FetchError(zap.NewNop(), "User:u", "g", fetchesWith(err))
		if got == nil || !errors.Is(got, errors.Unwrap(err)) && !errors.Is(got, err) {
			t.Errorf("%s: FetchError = %v, want the stage to stop with it", name, got)
		}
	}
}

// TestFetchErrorNamesMissingACL: a fetch refused for want of an ACL says
// which (Read on the topic, or on the consumer group) and points to the
// documented ACLs, and does not send the operator to offsets, which an
// authorization failure has nothing to do with.
func TestFetchErrorNamesMissingACL(t *testing.T) {
	topicFetch := kgo.Fetches{{Topics: []kgo.FetchTopic{{Topic: "usage.events",
		Partitions: []kgo.FetchPartition{{Partition: 3, Err: kerr.TopicAuthorizationFailed}}}}}}
	groupFetch := fetchesWith(&kgo.ErrGroupSession{Err: kerr.GroupAuthorizationFailed})
	for name, tc := range map[string]struct {
		fs   kgo.Fetches
		want []string
	}{
		"topic": {topicFetch, []string{"usage.events/3", "Read on topic usage.events", "Security and ACLs"}},
		"group": {groupFetch, []string{"Read on group meterline-dedup", "Security and ACLs"}},
	} {
		got := FetchError(zap.NewNop(), "User:u", "meterline-dedup", tc.fs)
		if got == nil {
			t.Fatalf("%s: no error", name)
		}
		for _, w := range tc.want {
			if !strings.Contains(got.Error(), w) {
				t.Errorf("%s: error %q does not say %q", name, got, w)
			}
		}
		if strings.Contains(got.Error(), "offsets are never reset") {
			t.Errorf("%s: error %q points to offsets", name, got)
		}
	}
	got := FetchError(zap.NewNop(), "User:u", "meterline-dedup", fetchesWith(kerr.OffsetOutOfRange))
	if got == nil || !strings.Contains(got.Error(), "offsets are never reset automatically") {
		t.Errorf("offset out of range: error %v, want the offsets hint", got)
	}
}

// TestTransactionalIDNotAuthorized: an error of a principal without Write
// on the instance's transactional ID names the ID, its prefix and the
// documented ACLs; other errors are returned as they are.
func TestTransactionalIDNotAuthorized(t *testing.T) {
	c := &Config{Group: "meterline-sink", InstanceID: "sink-1"}
	err := c.TransactionalIDError(fmt.Errorf("producer ID has a fatal, unrecoverable error, err: %w", kerr.TransactionalIDAuthorizationFailed))
	if !errors.Is(err, kerr.TransactionalIDAuthorizationFailed) {
		t.Fatalf("error %v does not wrap the cause", err)
	}
	for _, want := range []string{"Write on transactional ID meterline-sink-sink-1", "prefix meterline-sink-", "Security and ACLs"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if err := c.TransactionalIDError(kerr.OffsetOutOfRange); err != kerr.OffsetOutOfRange {
		t.Errorf("another error became %v", err)
	}
}

// TestFetchErrorNamesRefusedCredentials: brokers that refuse the stage's
// SASL user or password while it runs (a password changed on the cluster)
// stop it with an authentication error that says the password is read at
// start, not with the offsets hint.
func TestFetchErrorNamesRefusedCredentials(t *testing.T) {
	for _, cause := range []error{kerr.SaslAuthenticationFailed, kerr.UnsupportedSaslMechanism} {
		got := FetchError(zap.NewNop(), "User:u", "meterline-dedup", fetchesWith(&kgo.ErrGroupSession{Err: cause}))
		if got == nil {
			t.Fatalf("%v: no error", cause)
		}
		if !errors.Is(got, kafka.ErrAuthentication) || !strings.Contains(got.Error(), "read at start") {
			t.Errorf("%v: error %q is not an authentication error saying the password is read at start", cause, got)
		}
		if strings.Contains(got.Error(), "offsets are never reset") {
			t.Errorf("%v: error %q points to offsets", cause, got)
		}
	}
}
