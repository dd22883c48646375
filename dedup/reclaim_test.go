package dedup

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/internal/stream"
	"github.com/meterline/meterline/schemas"

	"github.com/meterline/meterline/internal/testenv"
)

// The shape of TestExpiredBucketsGiveDiskBack's state: reclaimBuckets
// hourly buckets of reclaimPerBucket keys, about 12 MiB of sstables (6
// files at the bottom level, whose target size is 4 MiB here), of which
// the oldest reclaimExpired buckets expire.
const (
	reclaimBuckets   = 4
	reclaimPerBucket = 100_000
	reclaimExpired   = 3
	// reclaimWait bounds how long Pebble may take to give the space back:
	// the store's delayed flush of a range deletion (10 s), then a
	// delete-only compaction.
	reclaimWait = 30 * time.Second
)

// TestExpiredBucketsGiveDiskBack: the sstables that hold only keys of
// buckets that expired leave the disk within a bounded time after the
// expiry commits, with no more writes to the store: disk use follows the
// window, not everything ever deduplicated (docs/operations.md, State on
// disk). The buckets are written through the partition as the stage
// writes them, on a store on disk, and compacted to the bottom level as
// the buckets of a long-running stage are; then one event moves the
// watermark past the oldest buckets' W + S.
func TestExpiredBucketsGiveDiskBack(t *testing.T) {
	if testing.Short() {
		t.Skip("writes 400,000 events and waits for Pebble's delayed flush (10 s)")
	}
	const B = time.Hour
	cfg := Config{Window: 2 * B, Skew: time.Minute, Bucket: B}
	pr := localProcessor(t, cfg, prometheus.NewRegistry())
	dir := t.TempDir()
	l, err := stream.NewLocalIn(pr, 0, pr.eventsTopic, dir)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	db := l.DB()

	bm := B.Milliseconds()
	start := int64(1_790_000_000_000) / bm * bm
	var offset int64
	give := func(id string, at int64) {
		e := &schemas.UsageEvent{EventID: id, CustomerID: "c", Meter: "m", Quantity: 1, EventTime: at, Source: "test"}
		key := e.Identity().Key()
		r := &kgo.Record{Topic: pr.eventsTopic, Key: key, Value: schemas.MustEncode(e), Offset: offset, Timestamp: time.UnixMilli(at)}
		offset++
		if err := l.Process([]*kgo.Record{r}); err != nil {
			t.Fatal(err)
		}
	}
	commit := func() {
		if err := l.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	for b := range int64(reclaimBuckets) {
		for i := range int64(reclaimPerBucket) {
			give(fmt.Sprintf("e%d-%d", b, i), start+b*bm+i*bm/reclaimPerBucket)
			if i%5000 == 4999 {
				commit()
			}
		}
	}
	commit()
	if err := db.Compact(context.Background(), []byte{0}, []byte{0xff}, true); err != nil {
		t.Fatal(err)
	}

	// The tables whose every key is an identity key of an expiring bucket:
	// state keys of partition 0 are 0x00 | 0x0000 | key (internal/stream,
	// Store).
	firstLive := make([]byte, 3+5)
	firstLive[3] = prefixIdentity
	binary.BigEndian.PutUint32(firstLive[4:], uint32(start/bm+reclaimExpired))
	identities := []byte{0, 0, 0, prefixIdentity}
	before := db.Metrics()
	expiring := testenv.TablesWithin(t, db, identities, firstLive)
	var size int64
	for _, n := range expiring {
		size += int64(n)
	}
	if len(expiring) < 2 || size < before.Total().TablesSize/2 {
		t.Fatalf("%d tables of %d bytes hold only keys of the expiring buckets, of %d tables of %d bytes: the test tests nothing",
			len(expiring), size, before.Total().TablesCount, before.Total().TablesSize)
	}
	dirBefore := dirBytes(t, dir)

	// One event at a watermark past the W + S of the oldest buckets.
	give("late", start+reclaimExpired*bm+cfg.Window.Milliseconds()+cfg.Skew.Milliseconds()+bm/2)
	commit()
	took := testenv.WaitTablesGone(t, db, dir, expiring, reclaimWait, "expired keys")
	after := db.Metrics()
	t.Logf("sstables: %d (%.1f MiB) before the expiry, %d of them (%.1f MiB) only expired keys; %d (%.1f MiB) %s after it; "+
		"the directory: %.1f MiB before, %.1f MiB after (with the WAL)",
		before.Total().TablesCount, mib(before.Total().TablesSize), len(expiring), mib(size),
		after.Total().TablesCount, mib(after.Total().TablesSize), took.Round(100*time.Millisecond),
		mib(dirBefore), mib(dirBytes(t, dir)))
}

// dirBytes is the size of the files in dir.
func dirBytes(t *testing.T, dir string) int64 {
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, e := range es {
		if fi, err := e.Info(); err == nil && fi.Mode().IsRegular() {
			n += fi.Size()
		}
	}
	return n
}

func mib(n int64) float64 { return float64(n) / (1 << 20) }
