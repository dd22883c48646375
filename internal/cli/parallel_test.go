package cli

import (
	"flag"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"
)

// The package's long tests that mostly wait (a broker of their own
// starting and stopping, a demo, a command's grace period, stages waiting
// for a cluster) run on three lanes, one test on each at a time, after the
// package's other tests (docs/testing.md, Time by part). Each has its own
// processes, ports, data directories, topics and databases, but the
// secured script broker, which its tests share (securedScriptBroker):
// they all take scriptBrokerLane, and so never overlap. The tests that
// only wait for a grace period, a timeout or a broker that never answers,
// with nothing but an in-process Kafka or none (the produce outage tests,
// TestProduceStopsWithAFullBuffer, TestStageStartedWithoutBrokersWaits),
// take idleLane, beside the two
// lanes whose tests start JVMs or whole pipelines: TestRealSecuredACLs
// and TestRealSecuredEntitlements take scriptBrokerLane too, which evens
// out those two; the others take otherLane.
var scriptBrokerLane, otherLane, idleLane sync.Mutex

// waitingTests is at least the number of parallel tests and subtests of
// the package: as -parallel when it is not given, so that every one of
// them is started at once and waits for its lane, not for a -parallel
// slot held by a test that waits for another lane.
const waitingTests = 16

// parallelWaitingTest marks t parallel and takes lane; it gives it back
// when t ends, after t's later cleanups (a broker it started is stopped
// before the next test on the lane takes its ports). The test's time
// includes its wait for the lane, which it logs. Call it after the test's
// skip checks.
func parallelWaitingTest(t *testing.T, lane *sync.Mutex) {
	t.Helper()
	t.Parallel()
	start := time.Now()
	lane.Lock()
	t.Cleanup(lane.Unlock)
	t.Logf("waited %s for its lane", time.Since(start).Round(time.Millisecond))
}

// TestMain sets -parallel to waitingTests unless it is given: the lanes,
// not -parallel, bound how many tests run at once (the two subtests of
// TestStageStartedWithoutBrokersWaits run beside each other on its lane).
// After the tests it stops the script broker they share, if one started it
// (securedScriptBroker).
func TestMain(m *testing.M) {
	flag.Parse()
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == "test.parallel" })
	if !given {
		if err := flag.Set("test.parallel", strconv.Itoa(waitingTests)); err != nil {
			panic(err)
		}
	}
	code := m.Run()
	stopSecuredScriptBroker()
	os.Exit(code)
}
