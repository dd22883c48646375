// Package standbytest is the real-broker test of standby replicas
// (docs/operations.md, Standby replicas): a dedup partition holding
// millions of keys, its owner killed with SIGKILL, and the instance that
// kept it warm taking over with a restore of the changelog's tail only.
// With METERLINE_FAILOVER_BENCH set it is also the failover benchmark (make
// bench-failover, docs/benchmarks.md).
//
// Every test calls testenv.RealKafka, so `go test -short ./...` skips the
// package; `make test` runs it.
package standbytest

import (
	"testing"

	"github.com/meterline/meterline/internal/testenv"
)

// TestMain removes the meterline binary the tests run as child processes.
func TestMain(m *testing.M) { testenv.Main(m) }
