package cli

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// TestEntitlementsSetSaysItReadsATerminal: set, set-default and set-rates
// without -f read the document from standard input; when that is a
// terminal, where they would otherwise wait in silence, they first say
// so on stderr, once, and how to end the input or give a file instead.
// Piped input, and a document given with -f, draw no such line.
func TestEntitlementsSetSaysItReadsATerminal(t *testing.T) {
	doc := tempFiles(t)("default.yaml", "plan: free\n")
	rates := tempFiles(t)("rates.yaml", "versions:\n- effective_from: 2020-01-01T00:00:00Z\n  rates: {tokens: 15/1000}\n")
	docs := map[string]string{"set": "customer: acme\nplan: free\n", "set-default": "plan: free\n", "set-rates": "versions:\n- effective_from: 2020-01-01T00:00:00Z\n  rates: {tokens: 15/1000}\n"}
	files := map[string]string{"set": doc, "set-default": doc, "set-rates": rates}
	for _, cmd := range []string{"set", "set-default", "set-rates"} {
		for _, c := range []struct {
			terminal, file bool
		}{{true, false}, {false, false}, {true, true}} {
			args := []string{"entitlements", cmd, "--validate"}
			if cmd == "set" && c.file {
				args = append(args, "acme")
			}
			if c.file {
				args = append(args, "-f", files[cmd])
			}
			var out, errb bytes.Buffer
			code := Main(context.Background(), args, IO{Stdin: strings.NewReader(docs[cmd]), Stdout: &out, Stderr: &errb, StdinIsTerminal: c.terminal})
			if code != 0 {
				t.Fatalf("%v: exit %d\n%s%s", args, code, out.String(), errb.String())
			}
			n := strings.Count(errb.String(), "reading the document from standard input (end it with Ctrl-D); or give a file with -f FILE")
			if want := map[bool]int{true: 1}[c.terminal && !c.file]; n != want {
				t.Errorf("%v with stdin a terminal %v: the line that says it reads standard input is there %d times, want %d\n%s", args, c.terminal, n, want, errb.String())
			}
		}
	}
}
