//go:build failoverbench

package standbytest

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestRealFailoverBenchmark is the failover benchmark. Only make
// bench-failover builds it (the failoverbench tag), so that make test has
// no test that skips: METERLINE_FAILOVER_BENCH lists key counts
// ("5000000,20000000"); each runs with and without a standby, and the
// table goes to the test log.
func TestRealFailoverBenchmark(t *testing.T) {
	spec := os.Getenv("METERLINE_FAILOVER_BENCH")
	if spec == "" {
		t.Fatal("METERLINE_FAILOVER_BENCH is not set: run make bench-failover")
	}
	var rows []failover
	for _, s := range strings.Split(spec, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n <= 0 {
			t.Fatalf("METERLINE_FAILOVER_BENCH: %q is not a key count", s)
		}
		for _, standby := range []bool{true, false} {
			rows = append(rows, run(t, fmt.Sprintf("failover-bench-%d-%v", n, standby), n, standby))
		}
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "\n| keys | standby | detection (kill → restore start) | restore (start → restored) | restore start → first commit | records replayed | restore | standby CPU per record | apply time per record |\n|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range rows {
		fmt.Fprintf(&sb, "| %d | %v | %s | %s | %s | %d | %s | %.2f µs | %.2f µs |\n", r.keys, r.standby, r.detect.Round(time.Millisecond),
			r.restore.Round(time.Millisecond), r.toCommit.Round(time.Millisecond), r.replayed, r.kind, r.standbyCPU*1e6, r.applyCPU*1e6)
	}
	t.Log(sb.String())
}
