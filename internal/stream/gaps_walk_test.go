package stream

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/meterline/meterline/internal/testenv"
)

// TestGapWalkLinear: the walk of a poll's gaps reads the batches of its
// fetch once, not once a gap. A transactional producer that commits a
// record a transaction leaves a gap (its commit marker) every other batch:
// 1 MiB of them is about 7,000 gaps, which a walk from the fetch's first
// batch at each gap took seconds of CPU to check, for one poll of one
// partition (quadratic in the gaps), where once through takes
// milliseconds.
func TestGapWalkLinear(t *testing.T) {
	data := testenv.RecordBatch(kgo.CodecNone, deltaRecord(0, "b0", "t00000"))
	control := slices.Clone(data)
	control[22] |= 0x20 // attributes, low byte: a control batch
	var raw []byte
	var gaps []int64
	off := int64(0)
	for ; len(raw) < 1<<20; off += 2 {
		raw = append(raw, batchBytes(off, data)...)
		raw = append(raw, batchBytes(off+1, control)...)
		gaps = append(gaps, off+1)
	}
	// Then a forged batch, which the last gap holds, and a record.
	raw = append(raw, batchBytes(off, testenv.RecordBatch(kgo.CodecNone, deltaRecord(3, "b0", "hostile")))...)
	raw = append(raw, batchBytes(off+1, data)...)
	w := &gapWalk{rt: &Runtime{log: zap.NewNop()}, topic: "in", raw: raw}
	start := time.Now()
	for _, g := range gaps {
		bad, deleted, err := w.verify(context.Background(), g, g+1)
		if bad != nil || deleted || err != nil {
			t.Fatalf("gap at %d: malformed %+v, deleted %v, error %v; want it sound", g, bad, deleted, err)
		}
	}
	if took := time.Since(start); took > 500*time.Millisecond {
		t.Errorf("%d gaps in %d bytes of batches checked in %v, want under half a second", len(gaps), len(raw), took)
	}
	bad, _, err := w.verify(context.Background(), off, off+1)
	if err != nil || bad == nil || bad.From != off || bad.Next != off+1 {
		t.Errorf("the gap of the forged batch at %d: malformed %+v, error %v; want that batch", off, bad, err)
	}
}
