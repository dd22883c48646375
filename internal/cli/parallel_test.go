package cli

import (
	"sync"
	"testing"
)

// waitingSlots lets the package's long tests that mostly wait (a broker
// of their own starting and stopping, a command's grace period) run two
// at a time, whatever -parallel is (docs/testing.md, Time by part). Each
// has its own processes, ports, data directories, topics and databases.
var waitingSlots = make(chan struct{}, 2)

// parallelWaitingTest runs t beside the package's other waiting tests:
// it marks t parallel, takes each of locks (resources t shares with some
// of them, such as a script broker's ports) and then one of waitingSlots,
// and gives them back when t ends, after t's later cleanups (a broker it
// started is stopped before the next test takes its ports). A test
// waiting for a lock holds no slot. Call it after the test's skip checks.
func parallelWaitingTest(t *testing.T, locks ...*sync.Mutex) {
	t.Helper()
	t.Parallel()
	for _, mu := range locks {
		mu.Lock()
		t.Cleanup(mu.Unlock)
	}
	waitingSlots <- struct{}{}
	t.Cleanup(func() { <-waitingSlots })
}
