package aggregator

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/schemas"
)

// counterWith returns the value of the counter name{label=value}.
func counterWith(reg *prometheus.Registry, name, label, value string) float64 {
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// TestWatermarkSourceCountFromMetadata: the number of dedup source
// partitions is usage.events' partition count in the cluster's metadata
// (here 2), never a record's claim (docs/design.md, Time). Records that
// claim 1 source (which would close the period on one source's watermark),
// 0, a negative count or MaxInt32 (a 16 GiB slice, re-read from state on
// every restart), or name a source partition outside [0, 2), are counted by
// reason and ignored: the period stays open, across a restart, until both
// real sources passed end + grace.
func TestWatermarkSourceCountFromMetadata(t *testing.T) {
	h := newAggHarnessSources(t, nil, 1, 2)
	fs := vfs.NewMem()
	cfg := h.config("a", fs)
	cfg.Period, cfg.Grace = Day, time.Hour
	reg := prometheus.NewRegistry()
	cfg.Stream.Registerer = reg
	run := h.start(cfg)

	day := ms(t, "2026-05-04")
	past := day + 24*3600*1000 + 3600*1000 + 1 // end + grace + 1 ms
	h.produce(h.dedupedEvent(0, &schemas.DedupedEvent{EventID: "e1", CustomerID: "acme", Meter: "m", Quantity: 7,
		EventTime: day + 1000, IngestTime: day + 2000}))
	h.produce(
		h.watermark(0, 0, 1, past),
		h.watermark(0, 0, 0, past),
		h.watermark(0, 0, -1, past),
		h.watermark(0, 0, math.MaxInt32, past),
		h.watermark(0, 2, 2, past),
		h.watermark(0, -1, 2, past),
		h.watermark(0, 1, 3, past),
	)
	h.caughtUp()
	for _, a := range readAggregates(t, h) {
		if a.Status == schemas.StatusFinal {
			t.Fatalf("a FINAL (value %d) was decided on watermark records that disagree with the metadata", a.Value)
		}
	}
	if got := counterWith(reg, "meterline_aggregate_watermarks_ignored_total", "reason", "source_partitions"); got != 5 {
		t.Errorf("ignored for source_partitions: %v, want 5", got)
	}
	if got := counterWith(reg, "meterline_aggregate_watermarks_ignored_total", "reason", "source_partition"); got != 2 {
		t.Errorf("ignored for source_partition: %v, want 2", got)
	}

	// A restart reads the state back; nothing of the claims is in it.
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}
	h.start(cfg)
	// One real source alone does not close the period either.
	h.produce(h.watermark(0, 0, 2, past))
	h.caughtUp()
	for _, a := range readAggregates(t, h) {
		if a.Status == schemas.StatusFinal {
			t.Fatal("FINAL decided on one of two sources")
		}
	}
	h.produce(h.watermark(0, 1, 2, past))
	h.caughtUp()
	var finals []*schemas.Aggregate
	for _, a := range readAggregates(t, h) {
		if a.Status == schemas.StatusFinal {
			finals = append(finals, a)
		}
	}
	if len(finals) != 1 || finals[0].Value != 7 {
		t.Fatalf("FINALs after both sources passed end + grace: %+v, want one of value 7", finals)
	}
}

// mapState is a stateReader over a map, for load.
type mapState map[string][]byte

func (m mapState) Get(k []byte) ([]byte, bool, error) { v, ok := m[string(k)]; return v, ok, nil }

func (m mapState) Scan(lo, hi []byte, fn func(k, v []byte) error) error {
	var ks []string
	for k := range m {
		if bytes.Compare([]byte(k), lo) >= 0 && bytes.Compare([]byte(k), hi) < 0 {
			ks = append(ks, k)
		}
	}
	sort.Strings(ks)
	for _, k := range ks {
		if err := fn([]byte(k), m[k]); err != nil {
			return err
		}
	}
	return nil
}

// TestLoadIgnoresClaimedSourceCount: state written by a version that took
// the source count from watermark records may hold a claimed count of
// MaxInt32 ('n') and watermarks of sources that do not exist. Loading it
// sizes the sources from the metadata (3 here) and keeps only theirs.
func TestLoadIgnoresClaimedSourceCount(t *testing.T) {
	pr := &processor{counts: partitionCountsT{events: 3, deduped: 1}}
	pt := &partition{pr: pr}
	st := mapState{}
	var n [4]byte
	binary.BigEndian.PutUint32(n[:], math.MaxInt32)
	st["n"] = n[:]
	st[string(keyKeyScheme)] = []byte(schemas.DedupedKeyScheme) // else refused: TestKeySchemeRefused
	for s, wm := range map[uint32]int64{0: 500, 1: 300, 2: 400, 7: 100} {
		k := []byte{pfxSource, 0, 0, 0, 0}
		binary.BigEndian.PutUint32(k[1:], s)
		var v [8]byte
		binary.BigEndian.PutUint64(v[:], uint64(wm))
		st[string(k)] = v[:]
	}
	if err := pt.load(st); err != nil {
		t.Fatal(err)
	}
	if len(pt.sources) != 3 || pt.wm != 300 {
		t.Fatalf("sources %v, watermark %d; want 3 sources and the minimum 300", pt.sources, pt.wm)
	}
}

// TestDedupTimesLongerRefused: dedup states its W, B and S in every
// watermark record. A record stating none of them (written before the
// fields), the aggregator's own or shorter ones is taken; one stating a
// longer W, B or S stops the stage with ErrWindowTooShort,
// ErrBucketTooShort or ErrSkewTooShort, naming the flag to set (every one
// that is short), before the record counts (the watermark it carries would
// have finalized the period); the stage stops again on the same record
// after a restart.
func TestDedupTimesLongerRefused(t *testing.T) {
	const day = 24 * time.Hour
	type times struct{ w, b, s time.Duration }
	type want struct {
		err  error
		flag string
	}
	all := []error{ErrWindowTooShort, ErrBucketTooShort, ErrSkewTooShort}
	for _, c := range []struct {
		name    string
		taken   []times
		refused times
		want    []want
	}{
		{"window", []times{{}, {30 * day, 0, 0}, {7 * day, 0, 0}}, times{35 * day, 0, 0},
			[]want{{ErrWindowTooShort, "--window 840h0m0s or more"}}},
		{"bucket", []times{{30 * day, day, time.Hour}, {30 * day, time.Hour, time.Hour}}, times{30 * day, 2 * day, time.Hour},
			[]want{{ErrBucketTooShort, "--bucket 48h0m0s or more"}}},
		{"skew", []times{{30 * day, day, time.Hour}, {30 * day, day, time.Minute}}, times{7 * day, day, 3 * time.Hour},
			[]want{{ErrSkewTooShort, "--skew 3h0m0s or more"}}},
		{"bucket and skew", []times{{30 * day, day, time.Hour}}, times{30 * day, 2 * day, 3 * time.Hour},
			[]want{{ErrBucketTooShort, "--bucket 48h0m0s or more"}, {ErrSkewTooShort, "--skew 3h0m0s or more"}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := newAggHarnessSources(t, nil, 1, 1)
			cfg := h.config("a", vfs.NewMem())
			cfg.Period, cfg.Grace = Day, time.Hour
			cfg.Window, cfg.Bucket, cfg.Skew = 30*day, day, time.Hour
			run := h.start(cfg)

			dayStart := ms(t, "2026-05-04")
			wm := func(at int64, d times) *kgo.Record {
				return &kgo.Record{Topic: h.names.DedupedTopic(), Partition: 0, Value: schemas.MustEncode(&schemas.Watermark{
					SourcePartition: 0, SourcePartitions: 1, Watermark: at,
					WindowMs: d.w.Milliseconds(), BucketMs: d.b.Milliseconds(), SkewMs: d.s.Milliseconds()})}
			}
			h.produce(h.dedupedEvent(0, &schemas.DedupedEvent{EventID: "e1", CustomerID: "acme", Meter: "m", Quantity: 7,
				EventTime: dayStart + 1000, IngestTime: dayStart + 2000}))
			for i, d := range c.taken {
				h.produce(wm(dayStart+3000+int64(i), d))
			}
			h.caughtUp()
			select {
			case <-run.done:
				t.Fatalf("the aggregator stopped on a record it should take: %v", run.err)
			default:
			}
			h.produce(wm(dayStart+day.Milliseconds()+time.Hour.Milliseconds()+1, c.refused))
			checkErr := func(when string, err error) {
				t.Helper()
				for _, sentinel := range all {
					wanted := slices.ContainsFunc(c.want, func(w want) bool { return w.err == sentinel })
					if errors.Is(err, sentinel) != wanted {
						t.Fatalf("%s Run returned %v; want it to be %v: %v", when, err, sentinel, wanted)
					}
				}
				for _, w := range c.want {
					if !strings.Contains(err.Error(), w.flag) {
						t.Fatalf("%s Run returned %v, not naming %q", when, err, w.flag)
					}
				}
			}
			select {
			case <-run.done:
			case <-time.After(30 * time.Second):
				t.Fatal("the aggregator kept running on a watermark record of a longer dedup time")
			}
			checkErr("", run.err)
			for _, a := range readAggregates(t, h) {
				if a.Status == schemas.StatusFinal {
					t.Fatal("the refused record's watermark finalized the period")
				}
			}
			again := h.start(cfg)
			select {
			case <-again.done:
				checkErr("after a restart", again.err)
			case <-time.After(30 * time.Second):
				t.Fatal("after a restart the aggregator took the record of a longer dedup time")
			}
		})
	}
}
