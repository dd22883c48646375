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
// too small, too large, unknown), however the reader splits the body and
// whatever buffer it is given to reuse, and passes on a read error.
func TestReadAll(t *testing.T) {
	body := strings.Repeat("0123456789", 1000)
	for _, hint := range []int64{-1, 0, 1, 511, 512, int64(len(body)) - 1, int64(len(body)), int64(len(body)) + 1, 1 << 20} {
		for _, reader := range []func() io.Reader{
			func() io.Reader { return strings.NewReader(body) },
			func() io.Reader { return iotest.OneByteReader(strings.NewReader(body)) },
			func() io.Reader { return iotest.DataErrReader(strings.NewReader(body)) },
		} {
			// Into a new buffer, a small one and a large one holding bytes.
			for _, buf := range [][]byte{nil, []byte("xyz"), append(make([]byte, 0, 1<<16), "stale"...)} {
				got, err := readAll(buf, reader(), hint)
				if err != nil || !bytes.Equal(got, []byte(body)) {
					t.Fatalf("hint %d, buffer of %d: read %d bytes, %v; want %d", hint, cap(buf), len(got), err, len(body))
				}
			}
		}
	}
	boom := errors.New("boom")
	if _, err := readAll(nil, io.MultiReader(strings.NewReader(body), iotest.ErrReader(boom)), int64(len(body))); !errors.Is(err, boom) {
		t.Fatalf("err %v, want boom", err)
	}
}
