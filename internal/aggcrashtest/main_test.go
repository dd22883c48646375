// Package aggcrashtest is the real-broker suite of the aggregator (issue 4,
// "On the real broker"): it runs the real `meterline aggregate` (and, for
// the idle-partition test, `meterline dedup`) binary as child processes
// against the real Kafka broker named by METERLINE_TEST_KAFKA, kills them
// at the named fault points (METERLINE_FAULT) or from outside, restarts
// them, and then checks every aggregate against the reference model of the
// bill in internal/testenv/oracle (docs/design.md, Time): exactly one FINAL
// per key, with the exact value, and the late events as adjustments whose
// deltas add up to the period's value. The scaffolding (topics, children,
// timings) is internal/testenv/crash, as for the dedup suite in
// internal/crashtest.
//
// Every test calls testenv.RealKafka, so `go test -short ./...` skips the
// package.
package aggcrashtest

import (
	"testing"

	"github.com/meterline/meterline/internal/testenv"
)

// TestMain removes the meterline binary that the tests run as child
// processes (testenv.Meterline builds it once, on the first test that does
// not skip).
func TestMain(m *testing.M) { testenv.Main(m) }
