package testenv

import (
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// HangLeaveGroup makes cluster answer no LeaveGroup request once hang is
// called (a coordinator that hangs or whose packets are dropped), until
// the test ends.
func HangLeaveGroup(t testing.TB, cluster *kfake.Cluster) (hang func()) {
	t.Helper()
	release, hanging := make(chan struct{}), make(chan struct{})
	t.Cleanup(func() { close(release) })
	cluster.ControlKey(int16(kmsg.LeaveGroup), func(kmsg.Request) (kmsg.Response, error, bool) {
		cluster.KeepControl()
		select {
		case <-hanging:
			cluster.SleepControl(func() { <-release })
		default:
		}
		return nil, nil, false
	})
	return func() { close(hanging) }
}

// StopsWithin stops a stage with stop and fails the test unless its Run,
// which sends its result on done, returns nil within bound.
func StopsWithin(t testing.TB, stop func(), done <-chan error, bound time.Duration) {
	t.Helper()
	start := time.Now()
	stop()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run: %v", err)
		}
		t.Logf("stopped in %s", time.Since(start).Round(time.Millisecond))
	case <-time.After(bound):
		t.Fatalf("Run still running %s after the stop", bound)
	}
}
