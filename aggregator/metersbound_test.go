package aggregator

import (
	"runtime"
	"strings"
	"testing"
)

// TestMetersAliasesAreBounded: a meters file whose aliases name a long
// scalar many times is refused before it is converted to JSON, which
// writes the scalar once per alias: 64 KiB named 1,000 times, a 70 KB
// file, allocated hundreds of MiB (6 GB at 10,000 aliases).
func TestMetersAliasesAreBounded(t *testing.T) {
	doc := "meters: [&m {name: a, aggregation: SUM, unit: \"" + strings.Repeat("z", 64<<10) + "\"}" +
		strings.Repeat(", *m", 1000) + "]\n"
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err := ParseMeters([]byte(doc))
	runtime.ReadMemStats(&after)
	if err == nil || !strings.Contains(err.Error(), "expands to more than 16 MiB of text") {
		t.Errorf("a meters file of %d bytes expanding to 62 MiB: %v, want it refused", len(doc), err)
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 32<<20 {
		t.Errorf("a meters file of %d bytes allocated %d MiB", len(doc), alloc>>20)
	}
}
