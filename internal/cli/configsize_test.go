package cli

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// TestConfigFileIsBounded: --config reads at most maxConfigBytes (1 MiB).
// A file one byte longer is refused, naming the flag, the file and the
// limit, with exit 2 as any config error; so is /dev/zero, at once rather
// than read whole into memory. A file of exactly the limit loads.
func TestConfigFileIsBounded(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, size int) string {
		head := "log_level: warn\n#"
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(head+strings.Repeat("x", size-len(head)-1)+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	if code, _, errOut := run(t, "", "version", "--config", write("at.yaml", maxConfigBytes)); code != 0 {
		t.Errorf("a config file of exactly %d bytes: exit %d, want 0:\n%.300s", maxConfigBytes, code, errOut)
	}
	cases := []string{write("over.yaml", maxConfigBytes+1)}
	if _, err := os.Stat("/dev/zero"); err == nil {
		cases = append(cases, "/dev/zero")
	}
	// What a command allocates with a config file of a few bytes.
	small := write("small.yaml", 64)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	run(t, "", "version", "--config", small)
	runtime.ReadMemStats(&after)
	base := after.TotalAlloc - before.TotalAlloc
	for _, p := range cases {
		runtime.ReadMemStats(&before)
		code, _, errOut := run(t, "", "version", "--config", p)
		runtime.ReadMemStats(&after)
		want := fmt.Sprintf("--config %s: the file is larger than 1 MiB", p)
		if code != 2 || !strings.Contains(errOut, want) {
			t.Errorf("--config %s: exit %d, want 2 saying %q:\n%.300s", p, code, want, errOut)
		}
		// Reading 1 MiB, in a buffer that grows to it, takes about 3 MiB.
		if alloc := after.TotalAlloc - before.TotalAlloc; alloc > base+8<<20 {
			t.Errorf("--config %s allocated %d MiB, %d MiB more than with a file of 64 bytes", p, alloc>>20, (alloc-base)>>20)
		}
	}
}

// endless is a reader that never ends, as /dev/zero, but gives up after
// giveUp bytes, so that a reader that does not bound its reads fails
// rather than fills the memory. It counts the bytes read.
type endless struct{ read, giveUp int }

var errReadTooFar = errors.New("read past the bound")

func (e *endless) Read(p []byte) (int, error) {
	if e.read >= e.giveUp {
		return 0, errReadTooFar
	}
	n := min(len(p), e.giveUp-e.read)
	clear(p[:n])
	e.read += n
	return n, nil
}

// TestConfigLoaderReadsAtMostTheLimit: the --config loader stops reading
// a file that does not end one byte past the limit.
func TestConfigLoaderReadsAtMostTheLimit(t *testing.T) {
	r := &endless{giveUp: 64 << 20}
	_, err := yamlLoader(r)
	if err == nil || !strings.Contains(err.Error(), "the file is larger than 1 MiB") {
		t.Errorf("an endless --config file: %v, want it refused as larger than 1 MiB", err)
	}
	if r.read > maxConfigBytes+1 {
		t.Errorf("an endless --config file: %d bytes read, want at most %d", r.read, maxConfigBytes+1)
	}
}
