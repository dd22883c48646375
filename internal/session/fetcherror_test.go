package session

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"testing"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"
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
	} {
		if got := FetchError(zap.NewNop(), fetchesWith(err)); got != nil {
			t.Errorf("%s: the stage stops with %v; it must rejoin", name, got)
		}
	}
	for name, err := range map[string]error{
		"group not authorized": session(kerr.GroupAuthorizationFailed),
		"topic not authorized": kerr.TopicAuthorizationFailed,
		"offset out of range":  kerr.OffsetOutOfRange,
	} {
		got := FetchError(zap.NewNop(), fetchesWith(err))
		if got == nil || !errors.Is(got, errors.Unwrap(err)) && !errors.Is(got, err) {
			t.Errorf("%s: FetchError = %v, want the stage to stop with it", name, got)
		}
	}
}
