package stream

import (
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// TestReadyWaitsForTransactionalID: a stage whose transaction coordinator
// does not answer its InitProducerID (the coordinator's broker paused,
// docs/operations.md, "One broker paused or killed") is not ready, even
// once it is a member of its group and has restored every partition it
// owns: no transaction can start. It was ready meanwhile: kgo joins the
// group and the partitions restore while InitProducerID waits.
func TestReadyWaitsForTransactionalID(t *testing.T) {
	t.Parallel()
	s := newSuite(t, nil, nil)
	var refuse atomic.Bool
	refuse.Store(true)
	// A coordinator that is loading answers every InitProducerID with a
	// retriable error: kgo retries it until the session's bound.
	s.cluster.Control(func(req kmsg.Request) (kmsg.Response, error, bool) {
		s.cluster.KeepControl()
		if r, ok := req.ResponseKind().(*kmsg.InitProducerIDResponse); ok && refuse.Load() {
			r.ErrorCode = kerr.CoordinatorLoadInProgress.Code
			return r, nil, true
		}
		return nil, nil, false
	})
	in := s.start("a", vfs.NewMem())
	// Member of the group, every assigned partition restored.
	deadline := time.Now().Add(15 * time.Second)
	for {
		parts, restoring := 0, 0
		in.rt.EachPartitionStatus(func(_ int32, r bool, _ int64, _, _ string) {
			parts++
			if r {
				restoring++
			}
		})
		if testutil.ToFloat64(in.rt.m.session.Member) == 1 && parts > 0 && restoring == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not a member with its partitions restored after 15 s: member %v, %d partitions, %d restoring",
				testutil.ToFloat64(in.rt.m.session.Member), parts, restoring)
		}
		time.Sleep(50 * time.Millisecond)
	}
	err := in.rt.Ready()
	if err == nil || !strings.Contains(err.Error(), "initialising transactional ID "+in.rt.cfg.TransactionalID()) {
		t.Fatalf("Ready() = %v while InitProducerID is refused, want not ready naming the transactional ID", err)
	}
	refuse.Store(false)
	deadline = time.Now().Add(30 * time.Second)
	for in.rt.Ready() != nil {
		if time.Now().After(deadline) {
			t.Fatalf("Ready() = %v 30 s after the coordinator answers", in.rt.Ready())
		}
		time.Sleep(50 * time.Millisecond)
	}
}
