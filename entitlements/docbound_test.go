package entitlements

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"
)

// allocated returns the bytes f allocates and how long it takes.
func allocated(f func()) (uint64, time.Duration) {
	runtime.GC()
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	start := time.Now()
	f()
	d := time.Since(start)
	runtime.ReadMemStats(&m1)
	return m1.TotalAlloc - m0.TotalAlloc, d
}

// TestFlatListRefusedBounded: a document of 16 MiB (the most set reads)
// holding one flat list of millions of items, in flow or block style, or
// as JSON that the YAML parser refuses (read as JSON), is refused as past
// the node limit, allocating a small share of its size: yaml.v3 built
// its whole node tree first, 2 GB and 14 s for a flow list of 8 million
// items, 1 GB for a block list of 4 million.
func TestFlatListRefusedBounded(t *testing.T) {
	const size = 16 << 20
	long := strings.Repeat("k", 1100) // a quoted key the YAML parser refuses
	docs := map[string][]byte{
		"flow":  []byte("caps: [" + strings.Repeat("x,", size/2-8) + "x]\n"),
		"block": []byte("caps:\n" + strings.Repeat("- x\n", size/4-4)),
		"json":  []byte(`{"` + long + `": 1, "caps": [` + strings.Repeat("1,", size/2-700) + "1]}"),
	}
	for name, doc := range docs {
		for what, parse := range map[string]func([]byte) error{
			"ParseDocument":      func(b []byte) error { _, err := ParseDocument(b); return err },
			"ParseRatesDocument": func(b []byte) error { _, err := ParseRatesDocument(b); return err },
		} {
			var err error
			n, d := allocated(func() { err = parse(doc) })
			t.Logf("%s, %s of %d bytes: %d bytes allocated, %v", what, name, len(doc), n, d)
			if want := fmt.Sprintf("the document expands to more than %d nodes", maxDocNodes); err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("%s, %s: %.200v; want it refused: %s", what, name, err, want)
			}
			if n > 1<<20 {
				t.Errorf("%s, %s: %d bytes allocated to refuse a document of %d", what, name, n, len(doc))
			}
		}
	}
}

// TestLongRateHistoryAccepted: a rate card at its limits (MaxRateVersions
// versions, MaxRates rates) of long meter names, with a comment per
// rate, close to 16 MiB, is read and accepted (about 180 MB allocated,
// 1 s).
func TestLongRateHistoryAccepted(t *testing.T) {
	var b strings.Builder
	b.WriteString("versions:\n")
	per := MaxRates / MaxRateVersions
	comment := "  # " + strings.Repeat("c", 560) + "\n"
	for v := range MaxRateVersions {
		fmt.Fprintf(&b, "- effective_from: %q\n  rates:\n", time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).Add(time.Duration(v)*time.Hour).Format(time.RFC3339))
		for r := range per {
			fmt.Fprintf(&b, "%s    ? %s%04d\n    : \"15/1000\"\n", comment, strings.Repeat("m", MaxNameBytes-4), r)
		}
	}
	doc := []byte(b.String())
	if len(doc) > 16<<20 || len(doc) < 15<<20 {
		t.Fatalf("the document is %d bytes, want close to 16 MiB", len(doc))
	}
	var err error
	n, d := allocated(func() {
		var rd *RatesDocument
		if rd, err = ParseRatesDocument(doc); err == nil {
			_, err = rd.Card(nil)
		}
	})
	t.Logf("a rate card of %d versions, %d rates, %d bytes: %d bytes allocated, %v", MaxRateVersions, MaxRates, len(doc), n, d)
	if err != nil {
		t.Fatalf("%.300v", err)
	}
	if n > 20*uint64(len(doc)) {
		t.Errorf("%d bytes allocated to read a rate card of %d", n, len(doc))
	}
}

// TestNodeLimitDocumentBounded: the costliest document within the node
// limit, a rate card of one version whose rates are one flow mapping of
// as many entries as the limit lets through (each entry is counted as one
// node before parsing, and its key costs nothing after, yet the parser
// builds two; Card refuses it past MaxRates only once it is read), is read
// allocating at most 192 MB (about 150 MB; at 1,048,576 nodes it was
// 1.2 GB, 770 MB of it live at once). The largest rate card within
// MaxRateVersions and MaxRates has about 25,000 nodes.
func TestNodeLimitDocumentBounded(t *testing.T) {
	var b strings.Builder
	b.WriteString("versions: [{effective_from: '2026-01-01T00:00:00Z', rates: {")
	for i := range maxDocNodes - 8 {
		fmt.Fprintf(&b, "m%d: '1',", i)
	}
	b.WriteString("}}]\n")
	doc := []byte(b.String())
	var err error
	n, d := allocated(func() { _, err = ParseRatesDocument(doc) })
	t.Logf("%d rates, %d bytes: %d bytes allocated, %v", maxDocNodes-8, len(doc), n, d)
	if err != nil {
		t.Fatalf("%.300v", err)
	}
	if n > 192<<20 {
		t.Errorf("%d bytes allocated to read a document within the node limit", n)
	}
	past := strings.Replace(b.String(), "}}]", strings.Repeat("x: '1',", 16)+"}}]", 1)
	if _, err := ParseRatesDocument([]byte(past)); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("more than %d nodes", maxDocNodes)) {
		t.Errorf("a document past the node limit: %.200v; want it refused", err)
	}
}

// TestEscapedTextBounded: the text limit holds for text as the document
// is converted, JSON, where a character may take six bytes (\u003c, \u0001):
// 255 aliases of a scalar of 64 KiB (a document of 68 KB, 16 MiB of text)
// of a character JSON escapes is read or refused allocating no more than
// one of letters (about 100 MB, 160 MB with the race detector); of '<'
// it took 820 MB, 7 s.
func TestEscapedTextBounded(t *testing.T) {
	for _, c := range []string{"a", "<", "&", `\x01`, `\u2028`, `\"`} {
		var b strings.Builder
		b.WriteString("versions: [{effective_from: '2026-01-01T00:00:00Z', rates: {a0: &s \"" + strings.Repeat(c, 64<<10) + "\"")
		for i := 1; i < 255; i++ {
			fmt.Fprintf(&b, ", a%d: *s", i)
		}
		b.WriteString("}}]\n")
		var err error
		n, d := allocated(func() { _, err = ParseRatesDocument([]byte(b.String())) })
		t.Logf("%s: %d bytes allocated, %v: %.100v", c, n, d, err)
		if n > 192<<20 {
			t.Errorf("%s: %d bytes allocated to read a document of %d bytes", c, n, b.Len())
		}
	}
}
