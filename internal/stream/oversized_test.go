package stream

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/internal/testenv"
)

// TestTooLargeNotRejecter: a batch that decompresses past the bound, in the
// input of a partition that is no BatchRejecter, stops the stage with an
// error naming the batch (docs/design.md, Bad input), and nothing past it
// is committed.
func TestTooLargeNotRejecter(t *testing.T) {
	s := newSuite(t, nil, nil)
	testenv.ProduceBatch(t, s.brokers, s.input, 0, testenv.ZstdBomb(t, 4<<20))
	a := s.start("a", vfs.NewMem(), func(c *Config, _ *countProc) { c.MaxDecompressBatchBytes = 1 << 20 })
	select {
	case <-a.done:
	case <-time.After(time.Minute):
		t.Fatal("the stage did not stop")
	}
	var tl *kgo.ErrDecompressTooLarge
	if err := a.err; !errors.As(err, &tl) || tl.Offset != 0 || tl.NextOffset != 1 || !strings.Contains(err.Error(), "cannot reject") {
		t.Fatalf("stopped with %v, want the batch at offset 0 past the bound, which the stage cannot reject", err)
	}
	offs, err := s.adm.FetchOffsets(t.Context(), s.group)
	if err != nil {
		t.Fatal(err)
	}
	if o, ok := offs.Lookup(s.input, 0); ok && o.At > 0 {
		t.Errorf("committed offset %d of partition 0, want none past the batch", o.At)
	}
}
