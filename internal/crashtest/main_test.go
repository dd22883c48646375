// Package crashtest is the real-broker crash suite of the dedup stage
// (docs/design.md, Exactly-once, "Crash windows"): it runs the real
// `meterline dedup` binary as child processes against the real Kafka broker
// named by METERLINE_TEST_KAFKA, kills them at the named fault points (or
// with SIGKILL, SIGTERM, SIGSTOP from outside), restarts them, and counts
// the outputs afterwards: every identity exactly once in usage.deduped,
// every other copy in usage.duplicates, nothing lost. The scaffolding
// (topics, children, timings) is internal/testenv/crash, shared with the
// aggregator's suite in internal/aggcrashtest.
//
// Every test calls testenv.RealKafka, so `go test -short ./...` skips the
// package; `make test` runs it.
package crashtest

import (
	"testing"

	"github.com/meterline/meterline/internal/testenv"
)

// TestMain removes the meterline binary that the tests run as child
// processes (testenv.Meterline builds it once, on the first test that does
// not skip).
func TestMain(m *testing.M) { testenv.Main(m) }
