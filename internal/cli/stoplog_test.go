package cli

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// TestStopLineWrittenBeforeMainReturns: the line that says a stop was
// requested is logged by a goroutine when the context ends; Main waits for
// it, so that its caller reads a whole stderr once Main returns (with
// -race, a write after the return is a data race on the caller's buffer).
// The context here ends before Main starts, and `version` returns at once.
func TestStopLineWrittenBeforeMainReturns(t *testing.T) {
	for i := range 20 {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		var out, errb bytes.Buffer
		if code := Main(ctx, []string{"version"}, IO{Stdin: strings.NewReader(""), Stdout: &out, Stderr: &errb}); code != 0 {
			t.Fatalf("version: exit %d\n%s", code, errb.String())
		}
		if l := errb.String(); !strings.Contains(l, "stop requested") {
			t.Fatalf("run %d: Main returned before the stop line was written; stderr:\n%s", i, l)
		}
	}
}
