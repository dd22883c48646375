package dedup

import (
	"encoding/binary"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/schemas"
)

// TestOtherKindWithOverflowingArrayCounts: a producer writes to
// usage.events a record of another kind whose array block counts overflow
// (an Aggregate whose group starts with a block of -2⁶³ items, then one of
// 5,000 empty properties). Dedup decodes any known kind to name it in its
// rejection; hamba/avro wrote the 5,000 items outside their slice, which
// corrupted the process and stopped it with a fatal runtime error (the
// whole test binary), on every restart. It is rejected as undecodable, and
// the next event is forwarded (docs/design.md, Bad input).
func TestOtherKindWithOverflowingArrayCounts(t *testing.T) {
	h := newHarness(t, nil, 1)
	st := h.start(h.configWith("a", prometheus.NewRegistry()))
	arr := t0 + 10*day
	v := []byte{0xC3, 0x01}
	v = binary.LittleEndian.AppendUint64(v, schemas.Fingerprint(schemas.KindAggregate))
	v = append(v, 2, 'c', 2, 'm')                 // customer_id, meter
	v = binary.AppendVarint(v, math.MinInt64)     // group: a block of -2⁶³ items,
	v = append(v, 0)                              // its byte size,
	v = binary.AppendVarint(v, 5000)              // then one of 5,000
	v = append(v, make([]byte, 2*5000)...)        // empty properties,
	v = append(v, 0, 2, 'S', 2, 2, 2, 2, 2, 2, 2) // the end, aggregation … updated_at
	v = append(v, 2, 2)
	r := rejectedBeforeEvent(t, h, st, &kgo.Record{Topic: h.names.EventsTopic(), Partition: 0, Key: []byte("k"), Value: v, Timestamp: time.UnixMilli(arr)})
	if r.Reason != schemas.ReasonUndecodable || !strings.Contains(r.Detail, "block count") {
		t.Errorf("rejected as %s (%s), want %s naming the block count", r.Reason, r.Detail, schemas.ReasonUndecodable)
	}
}
