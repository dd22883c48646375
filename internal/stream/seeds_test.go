package stream

import (
	"context"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/twmb/franz-go/pkg/kadm"
	"go.uber.org/zap"

	"github.com/meterline/meterline/internal/clock"
	"github.com/meterline/meterline/internal/testenv"
)

// TestClientsSeededByListedBrokers: the stage's seed broker stops
// answering (paused, its host cut off) while the cluster runs on. The
// client a restore makes for its copy of the changelog starts from the
// brokers the cluster lists, not from that seed: with it, the client's
// first requests wait for the dial or request timeout, and each restore
// of a failover, even of a promoted standby, takes that long
// (docs/operations.md, Standby replicas).
func TestClientsSeededByListedBrokers(t *testing.T) {
	w := newKVWorld(t, nil)
	proxy := testenv.NewProxy(t, w.brokers[0])
	// The stage's only seed is the proxy; the cluster lists the broker
	// itself.
	w.brokers = []string{proxy.Addr()}
	rt, _ := w.startOwner("a", vfs.NewMem(), clock.Real{}, zap.NewNop())
	w.send("k", "v")
	deadline := time.Now().Add(20 * time.Second)
	for owned := 0; owned == 0; {
		if time.Now().After(deadline) {
			t.Fatal("the stage did not take its partition")
		}
		time.Sleep(50 * time.Millisecond)
		rt.EachPartitionStatus(func(int32, bool, int64, string, string) { owned++ })
	}

	proxy.Silence()
	c, err := rt.newChangelogCopy(0, "restore", 0, 0, -1, time.Now(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.close()
	lctx, lcancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer lcancel()
	ends, err := kadm.NewClient(c.cl).ListEndOffsets(lctx, w.changelog)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		t.Fatalf("a restore's client with the stage's seed broker silent: %v", err)
	}
}
