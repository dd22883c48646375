package ingest

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"
)

// TestReadAll: readAll reads every byte whatever the size hint (exact,
// too small, too large, unknown) and however the reader splits the body,
// and passes on a read error.
func TestReadAll(t *testing.T) {
	body := strings.Repeat("0123456789", 1000)
	for _, hint := range []int64{-1, 0, 1, 511, 512, int64(len(body)) - 1, int64(len(body)), int64(len(body)) + 1, 1 << 20} {
		for _, r := range []io.Reader{strings.NewReader(body), iotest.OneByteReader(strings.NewReader(body)), iotest.DataErrReader(strings.NewReader(body))} {
			got, err := readAll(r, hint)
			if err != nil || !bytes.Equal(got, []byte(body)) {
				t.Fatalf("hint %d: read %d bytes, %v; want %d", hint, len(got), err, len(body))
			}
		}
	}
	boom := errors.New("boom")
	if _, err := readAll(io.MultiReader(strings.NewReader(body), iotest.ErrReader(boom)), int64(len(body))); !errors.Is(err, boom) {
		t.Fatalf("err %v, want boom", err)
	}
}
