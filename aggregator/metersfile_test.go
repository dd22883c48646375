package aggregator

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestLoadMetersIsBounded: a meters file is read up to maxMetersBytes
// (16 MiB): one byte longer is refused, naming the file and the limit,
// rather than read whole into memory (a multi-GB file, /dev/zero given by
// mistake); one of exactly the limit loads.
func TestLoadMetersIsBounded(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, size int) string {
		head := "meters: [{name: api_calls, aggregation: SUM, unit: call}]\n#"
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(head+strings.Repeat("x", size-len(head)-1)+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	if _, err := LoadMeters(write("at.yaml", maxMetersBytes)); err != nil {
		t.Errorf("a meters file of exactly %d bytes: %v", maxMetersBytes, err)
	}
	over := write("over.yaml", maxMetersBytes+1)
	if _, err := LoadMeters(over); err == nil || !strings.Contains(err.Error(), "meters: "+over+": the file is larger than 16 MiB") {
		t.Errorf("a meters file of %d bytes: %v, want it refused as larger than 16 MiB", maxMetersBytes+1, err)
	}
}
