package cli

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meterline/meterline/internal/testenv"
)

// TestStageStartedWithoutBrokersWaits starts dedup and the aggregator
// while no broker listens (every broker of the cluster down): each waits
// for the cluster, saying so in its log, rather than exit, and a stop
// meanwhile is a clean exit (docs/operations.md, Outages).
func TestStageStartedWithoutBrokersWaits(t *testing.T) {
	keys := testenv.DedupKeysFile(t)
	parallelWaitingTest(t, &idleLane)
	for _, stage := range []string{"dedup", "aggregate"} {
		t.Run(stage, func(t *testing.T) {
			t.Parallel()
			args := []string{stage, "--brokers", testenv.FreeAddr(t), "--instance-id", "i1", "--state-dir", filepath.Join(t.TempDir(), "state"),
				"--metrics-addr", "127.0.0.1:0"}
			if stage == "dedup" {
				args = append(args, "--dedup-keys-file", keys)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var out, errb testenv.SyncBuffer
			done := make(chan int, 1)
			go func() { done <- Main(ctx, args, IO{Stdin: strings.NewReader(""), Stdout: &out, Stderr: &errb}) }()
			select {
			case code := <-done:
				t.Fatalf("%s exited (status %d) while no broker was reachable; want it to wait\nstderr: %s", stage, code, errb.String())
			case <-time.After(8 * time.Second):
			}
			if !strings.Contains(errb.String(), "no broker answers; waiting for the cluster") {
				t.Errorf("%s's log does not say it waits for the cluster:\n%s", stage, errb.String())
			}
			cancel()
			select {
			case code := <-done:
				if code != 0 {
					t.Errorf("%s stopped while waiting: exit %d, want 0\nstderr: %s", stage, code, errb.String())
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("%s did not stop within 10 s of its stop", stage)
			}
		})
	}
}
