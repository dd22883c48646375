package bench

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/meterline/meterline/ingest"
	"github.com/meterline/meterline/internal/testenv"
)

// TestIngestLeavesNothingBehind runs bench ingest small on kfake to the end
// and stopped by Ctrl-C during its rounds: it prints the table (events
// counted as Kafka records, the CPU per record of each run) and leaves no
// topic behind either way.
func TestIngestLeavesNothingBehind(t *testing.T) {
	for _, interrupt := range []bool{false, true} {
		t.Run(map[bool]string{false: "to the end", true: "Ctrl-C in a round"}[interrupt], func(t *testing.T) {
			_, brokers := testenv.KFake(t)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			w := &watcher{}
			if interrupt {
				w.at, w.cancel = "round 1 baseline", cancel
			}
			env, out := testEnv(t, brokers, w)
			err := Ingest(ctx, env, IngestConfig{Events: 400, Batch: 20, Connections: 4, Partitions: 2, Rounds: 2, LatencyFor: 200 * time.Millisecond})
			t.Logf("progress:\n%s", w.buf.String())
			switch {
			case !interrupt && err != nil:
				t.Fatalf("bench: %v", err)
			case interrupt && !errors.Is(err, context.Canceled):
				t.Fatalf("bench returned %v, want context.Canceled", err)
			case !interrupt && (!strings.Contains(out.String(), "meterline ingest:") || !strings.Contains(out.String(), "p99") ||
				!strings.Contains(out.String(), "CPU per record (this process):") || !strings.Contains(w.buf.String(), "µs CPU per record")):
				t.Errorf("no result table:\n%s", out.String())
			}
			if left := leftBehind(t, testenv.Admin(t, brokers), env.Topics.Prefix, t.TempDir()+"/none"); len(left) > 0 {
				t.Errorf("left behind: %v", left)
			}
		})
	}
}

func TestIngestConfigValidate(t *testing.T) {
	err := (&IngestConfig{Events: 150, Batch: 100, Connections: 0, Partitions: 1, Rounds: 1, LatencyFor: time.Second}).Validate()
	if err == nil || !strings.Contains(err.Error(), "multiple of batch") || !strings.Contains(err.Error(), "connections must be positive") {
		t.Errorf("Validate: %v", err)
	}
}

// TestIngestBoundsFitConnections: the measured ingest serves every
// connection of the bench at once; its one key is never refused
// too-many-in-flight (which the bench would take for a failure).
func TestIngestBoundsFitConnections(t *testing.T) {
	for _, conns := range []int{4, ingest.DefaultMaxInFlightPerTenant + 1, ingest.DefaultMaxInFlight + 1} {
		b := &ingestBench{env: &Env{}, cfg: IngestConfig{Connections: conns, Batch: 10}}
		cfg := b.ingestConfig("t")
		// The tenant's last request is admitted while it holds fewer
		// than are free: conns-1 < MaxInFlight-(conns-1).
		if cfg.MaxInFlightPerTenant < conns || cfg.MaxInFlight < 2*conns-1 {
			t.Errorf("%d connections: in-flight bounds %d per tenant, %d in all", conns, cfg.MaxInFlightPerTenant, cfg.MaxInFlight)
		}
	}
}
