package dedup

import (
	"crypto/sha256"
	"encoding/binary"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/meterline/meterline/internal/stream"
)

// filterLoadKeys and filterLoadBuckets shape BenchmarkFilterLoad's state:
// a million identity keys over 35 daily arrival buckets, the keys of a
// partition with 35 days of about 28,600 events a day.
const (
	filterLoadKeys    = 1_000_000
	filterLoadBuckets = 35
)

// BenchmarkFilterLoad is what a partition's open costs when it builds its
// Bloom filters from every identity key of its state (no standby's or
// kept filters: docs/operations.md, Rebalances that give a partition
// back): an op restores a state of filterLoadKeys identity keys into an
// in-memory store (untimed) and opens the partition. s/Mkeys is the
// build alone, as meterline_dedup_filter_load_seconds measures it, per
// million keys.
func BenchmarkFilterLoad(b *testing.B) {
	changelog := filterLoadChangelog()
	var built float64
	for b.Loop() {
		b.StopTimer()
		reg := prometheus.NewRegistry()
		pr := filterLoadProcessor(b, reg)
		b.StartTimer()
		l, err := stream.RestoreLocal(pr, 0, pr.eventsTopic, changelog)
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		built += histogramSum(b, reg, "meterline_dedup_filter_load_seconds")
		if err := l.Close(); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	b.ReportMetric(built/float64(b.N)*1e6/filterLoadKeys, "s/Mkeys")
}

// TestFilterLoadFindsEveryKey: the partition BenchmarkFilterLoad opens
// holds every key of its state in its filters, each in its own bucket's.
func TestFilterLoadFindsEveryKey(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a state of a million keys")
	}
	changelog := filterLoadChangelog()
	fs := newFilters()
	for _, r := range changelog {
		fs.add(r.Key)
	}
	n := 0
	for _, c := range fs.keys {
		n += c
	}
	if n != filterLoadKeys || len(fs.blooms) != filterLoadBuckets {
		t.Fatalf("%d keys in %d buckets, want %d in %d", n, len(fs.blooms), filterLoadKeys, filterLoadBuckets)
	}
	for _, r := range changelog {
		if !fs.blooms[binary.BigEndian.Uint32(r.Key[1:5])].mayContain(r.Key[5:]) {
			t.Fatalf("key %x not in its bucket's filter", r.Key)
		}
	}
}

// filterLoadChangelog is the changelog of a state of filterLoadKeys
// identity keys (random hashes) over filterLoadBuckets buckets.
func filterLoadChangelog() []*kgo.Record {
	recs := make([]*kgo.Record, filterLoadKeys)
	value := make([]byte, verifyLen+payloadLen+8)
	for i := range recs {
		h := sha256.Sum256(binary.BigEndian.AppendUint64(nil, uint64(i)))
		k := make([]byte, identityKeyLen)
		k[0] = prefixIdentity
		binary.BigEndian.PutUint32(k[1:5], uint32(20_000+i%filterLoadBuckets))
		copy(k[5:], h[:hashLen])
		recs[i] = &kgo.Record{Key: k, Value: value}
	}
	return recs
}

func filterLoadProcessor(b *testing.B, reg *prometheus.Registry) *processor {
	return localProcessor(b, Config{}, reg)
}

// localProcessor is a processor of cfg (the key ring fuzzKey, the other
// fields defaulted) for a stream.Local: every topic has one partition,
// and the events topic's end and retention are not read from a broker.
func localProcessor(tb testing.TB, cfg Config, reg *prometheus.Registry) *processor {
	return localProcessorOf(tb, cfg, reg, partitionCountsT{events: 1, deduped: 1, duplicates: 1, rejected: 1})
}

// localProcessorOf is localProcessor with the partition counts n.
func localProcessorOf(tb testing.TB, cfg Config, reg *prometheus.Registry, n partitionCountsT) *processor {
	cfg.Keys = []Key{fuzzKey}
	cfg.Stream.Registerer = reg
	cfg.Stream.InstanceID = "local"
	cfg.EnsureDefaults()
	pr, err := newProcessor(cfg, n, zap.NewNop())
	if err != nil {
		tb.Fatal(err)
	}
	pr.endOffset = func(int32) (int64, error) { return 0, nil }
	pr.eventsRetention = func() (time.Duration, error) { return -1, nil }
	return pr
}

// histogramSum is the sum of the observations of the histogram name in
// reg, over all its label values.
func histogramSum(t testing.TB, reg *prometheus.Registry, name string) float64 {
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	s := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			s += m.GetHistogram().GetSampleSum()
		}
	}
	return s
}
