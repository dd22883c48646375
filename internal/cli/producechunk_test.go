package cli

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// TestProduceChunkBytes: a chunk of lines waiting for an encoder holds
// about chunkBytes, however long its lines: 512 lines of up to
// maxLineBytes made chunks of 512 MiB, and the chunks queued for the
// encoders (twice GOMAXPROCS and more) gigabytes (1.1 GB for 3 GB of
// 1 MB lines at GOMAXPROCS 2).
func TestProduceChunkBytes(t *testing.T) {
	line := `{"x":"` + strings.Repeat("a", 64<<10) + `"}` + "\n"
	in := bytes.NewReader([]byte(strings.Repeat(line, 600)))
	jobs, ordered := make(chan *chunk, 600), make(chan *chunk, 600)
	r := &produceRun{}
	r.read(context.Background(), in, jobs, ordered, make(chan error, 1))
	lines, most := 0, 0
	for c := range jobs {
		n := 0
		for _, l := range c.lines {
			n += len(l.b)
		}
		lines += len(c.lines)
		most = max(most, n)
	}
	if lines != 600 {
		t.Fatalf("%d lines read, want 600", lines)
	}
	if most > chunkBytes+len(line) {
		t.Errorf("a chunk of %d KiB, want at most %d KiB and a line", most>>10, chunkBytes>>10)
	}
}
