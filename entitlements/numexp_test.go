package entitlements

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
)

// TestHugeExponentReadCheaply: an integer with an exponent is read
// exactly, but one whose exponent no 64-bit integer needs (1e999999,
// nine bytes) is refused from its text: read through math/big it cost
// 36 ms and megabytes each, so that a document of 1,000 such limits
// (26 KB) took 35 s to read, and one of 16 MiB hours. What an exponent
// still writes exactly is read as before.
func TestHugeExponentReadCheaply(t *testing.T) {
	var b strings.Builder
	b.WriteString("caps:\n")
	for i := range 50 {
		fmt.Fprintf(&b, "  m%d: {limit: 1e999999}\n", i)
	}
	doc := []byte(b.String())
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	d, err := ParseDocument(doc)
	runtime.ReadMemStats(&m1)
	if err != nil {
		t.Fatal(err)
	}
	if n := m1.TotalAlloc - m0.TotalAlloc; n > 200*uint64(len(doc)) {
		t.Errorf("%d bytes allocated to read a document of %d", n, len(doc))
	}
	if _, err := d.Record("acme", nil); err == nil || !strings.Contains(err.Error(), `caps.m0.limit: not a 64-bit integer ("1e999999")`) {
		t.Errorf("Record: %v, want m0's limit refused as not a 64-bit integer", err)
	}
	for s, want := range map[string]int64{
		"0e999999": 0, "0.000e-999999": 0, "-0e99": 0, "1e18": 1_000_000_000_000_000_000,
		"9.223372036854775807e18": 9223372036854775807, "100000e-5": 1,
		"0.0000000000000000000000000000000000000000000000000000000001e58": 1,
		"1000000000000000000000000000000000000000000000000000000000e-57":  1,
	} {
		if v, ok := exactInt(s); !ok || v != want {
			t.Errorf("exactInt(%s) = %d, %v, want %d", s, v, ok, want)
		}
	}
	for _, s := range []string{"1e999999", "1e-999999", "1e19", "9.223372036854775808e18", "1e-1", "5e-99"} {
		if v, ok := exactInt(s); ok {
			t.Errorf("exactInt(%s) = %d, want refused", s, v)
		}
	}
}
