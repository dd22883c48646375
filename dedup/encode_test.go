package dedup

import (
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/schemas"
)

// TestReEncodeFailureRejects: an event written in an older schema is
// re-encoded as a DedupedEvent. Were that to fail, the event is rejected
// (invalid, counted, in usage.rejected) and the stage goes on; it leaves no
// state, so its next copy, with the encoding working again, is forwarded
// as the first, not dropped as a duplicate.
func TestReEncodeFailureRejects(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "schemas", "testdata", "usage_event.v0.hex"))
	if err != nil {
		t.Fatal(err)
	}
	v0, err := hex.DecodeString(strings.TrimSpace(string(raw)))
	if err != nil {
		t.Fatal(err)
	}
	var e schemas.UsageEvent
	if err := schemas.DecodeInto(v0, &e); err != nil {
		t.Fatal(err)
	}
	if _, current := schemas.AppendDedupedFromRaw(nil, v0, 0, 0, 0); current {
		t.Fatal("the v0 fixture is in the current schema: the test needs an older one")
	}

	h := newHarness(t, nil, 1)
	reg := prometheus.NewRegistry()
	run := h.start(h.configWith("a", reg))
	failing := errors.New("injected encoding failure")
	encode = func(schemas.Message) ([]byte, error) { return nil, failing }
	t.Cleanup(func() { encode = schemas.Encode })

	key := e.Identity().Key()
	rec := func(arrival int64) *kgo.Record {
		return &kgo.Record{Topic: h.names.EventsTopic(), Partition: 0, Key: key, Value: v0, Timestamp: time.UnixMilli(arrival)}
	}
	arrival := e.EventTime + 60_000
	h.produce(rec(arrival))
	h.caughtUp()
	o := h.outputs()
	if len(o.deduped) != 0 {
		t.Fatalf("%d events forwarded although the re-encoding failed", len(o.deduped))
	}
	rej := o.rejectedOf(e.EventID)
	if len(rej) != 1 || rej[0].Reason != schemas.ReasonInvalid || !strings.Contains(rej[0].Detail, failing.Error()) {
		t.Fatalf("rejected %+v, want one %s record saying %q", rej, schemas.ReasonInvalid, failing)
	}
	if got := metricValues(t, reg, "meterline_rejected_total")["reason=invalid,stage=dedup"]; got != 1 {
		t.Errorf("meterline_rejected_total{reason=invalid,stage=dedup} = %v, want 1", got)
	}

	encode = schemas.Encode
	h.produce(rec(arrival + 1000))
	h.caughtUp()
	o = h.outputs()
	if len(o.deduped) != 1 || o.deduped[0].EventID != e.EventID || len(o.duplicates) != 0 {
		t.Fatalf("the next copy: %d forwarded, %d duplicates; want it forwarded as the first", len(o.deduped), len(o.duplicates))
	}
	select {
	case <-run.done:
		t.Fatalf("the stage stopped: %v", run.err)
	default:
	}
}
