package bench

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"hash"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/internal/topics"
	"github.com/meterline/meterline/producer"
	"github.com/meterline/meterline/schemas"
)

// inputNow is the fixed "now" of the golden inputs.
var inputNow = time.Date(2026, 11, 30, 12, 34, 56, 789_000_000, time.UTC)

func hashRecord(h hash.Hash, r *kgo.Record) {
	var b [8]byte
	binary.BigEndian.PutUint32(b[:4], uint32(r.Partition))
	h.Write(b[:4])
	binary.BigEndian.PutUint64(b[:], uint64(r.Timestamp.UnixNano()))
	h.Write(b[:])
	for _, p := range [][]byte{r.Key, r.Value} {
		binary.BigEndian.PutUint32(b[:4], uint32(len(p)))
		h.Write(b[:4])
		h.Write(p)
	}
}

// TestInputsAreTheSame pins each benchmark's input, generated for a fixed
// now, to the bytes b9acd11 generated (aggregate: the bytes since its event
// times lie in the second before their arrival, so that the rate card
// prices them, docs/entitlements.md, The rate card; numbers of earlier
// binaries are not comparable with later ones): scripts/bench-ab.sh
// compares two binaries each on its own input, which is only fair while the
// inputs are the same. A change to an input fails here; if it is meant,
// every earlier measurement stops being comparable, so say so where the
// numbers are kept, and update the hash.
func TestInputsAreTheSame(t *testing.T) {
	golden := map[string]string{
		"produce":   "904080877b93e8a40ca30d70cbb0950b635ea1ccecb079d3876412996b5ed73b",
		"dedup":     "7e0642e6651413839ea6d969837954b4a6037e8ef561cb6747ca78d2ece00c58",
		"aggregate": "e14dc7b2b313666b456ba2f98e807bcab7bda40d9c2ac1a893b878da5bbd3a18",
		"sink":      "4f38452fa0a147291724382e2ca8a9dcd324a1b20865563be3dcd79863922b9b",
	}
	got := map[string]string{}

	h := sha256.New()
	path := filepath.Join(t.TempDir(), "events.ndjson")
	if err := writeProduceEvents(path, 5000, 100, inputNow); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	h.Write(b)
	got["produce"] = hex.EncodeToString(h.Sum(nil))

	h = sha256.New()
	p, err := producer.New(producer.WithSource("bench"), producer.WithClock(func() time.Time { return inputNow }))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	unique, err := dedupInput{n: 5000, rate: 0.05, now: inputNow}.each(func(e producer.Event) error {
		r, err := p.Record(e)
		if err == nil {
			hashRecord(h, r)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if unique != 4750 {
		t.Errorf("dedup input: %d unique events of 5000 at 5%% copies, want 4750", unique)
	}
	got["dedup"] = hex.EncodeToString(h.Sum(nil))

	h = sha256.New()
	for i := range 5000 {
		r, err := dedupedRecord("usage.deduped.v2", 16, aggregateEvent(i, 100, inputNow))
		if err != nil {
			t.Fatal(err)
		}
		hashRecord(h, r)
	}
	wm, err := aggregateWatermark(inputNow)
	if err != nil {
		t.Fatal(err)
	}
	h.Write(wm)
	got["aggregate"] = hex.EncodeToString(h.Sum(nil))

	h = sha256.New()
	recs, err := sinkRecords("usage.deduped", 5000, 16, 100, inputNow.Add(-time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		hashRecord(h, r)
	}
	got["sink"] = hex.EncodeToString(h.Sum(nil))

	for name, want := range golden {
		if got[name] != want {
			t.Errorf("%s input: sha256 %s, want %s", name, got[name], want)
		}
	}
}

// TestAggregateWatermarksClaimTheEventsPartitions: the aggregator takes
// the number of dedup sources from usage.events' partition count, and
// ignores, with a warning, a watermark that claims another. bench
// aggregate's usage.events has as many partitions as its input's
// watermark records claim sources, whatever --partitions is, so that the
// aggregators measured apply them.
func TestAggregateWatermarksClaimTheEventsPartitions(t *testing.T) {
	layout := topics.DefaultLayout()
	layout.Partitions = 16
	b := &aggregateBench{stageBench: &stageBench{names: topics.DefaultNames(), layout: layout},
		cfg: AggregateConfig{StageConfig: StageConfig{Partitions: 16, Rounds: 1}}}
	v, err := aggregateWatermark(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	m, err := schemas.Decode(v)
	if err != nil {
		t.Fatal(err)
	}
	w, ok := m.(*schemas.Watermark)
	if !ok {
		t.Fatalf("the input's watermark decodes as %T", m)
	}
	found := false
	for _, s := range b.specs() {
		if s.Name != b.names.EventsTopic() {
			continue
		}
		found = true
		if s.Partitions != w.SourcePartitions {
			t.Errorf("usage.events has %d partitions, the input's watermarks claim %d sources", s.Partitions, w.SourcePartitions)
		}
	}
	if !found {
		t.Error("bench aggregate makes no usage.events")
	}
}
