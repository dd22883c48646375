package entitlements

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestLongJSONRateCardRead: a rate card printed as JSON (get --rates -o
// json) at the limits, its meters named by MaxNameBytes bytes (a quoted
// key the YAML parser refuses, so it is read as JSON), is read back in
// one pass over its bytes to number its lines: the line of each token was
// counted from the start of the document, 40 thousand times over 10 MB
// (20 s).
func TestLongJSONRateCardRead(t *testing.T) {
	type version struct {
		EffectiveFrom string            `json:"effective_from"`
		Rates         map[string]string `json:"rates"`
	}
	var doc struct {
		Versions []version `json:"versions"`
	}
	per := MaxRates / MaxRateVersions
	for v := range MaxRateVersions {
		ver := version{EffectiveFrom: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).Add(time.Duration(v) * time.Hour).Format(time.RFC3339), Rates: map[string]string{}}
		for r := range per {
			ver.Rates[fmt.Sprintf("%s%04d", strings.Repeat("m", MaxNameBytes-4), r)] = "15/1000"
		}
		doc.Versions = append(doc.Versions, ver)
	}
	b, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	jsonLineBytes.Store(0)
	d, err := ParseRatesDocument(b)
	took, numbered := time.Since(start), int(jsonLineBytes.Load())
	t.Logf("%d bytes of JSON read in %v, %d bytes read to number its lines", len(b), took, numbered)
	if err != nil {
		t.Fatalf("%.300v", err)
	}
	if len(d.Versions) != MaxRateVersions {
		t.Fatalf("%d versions read, want %d", len(d.Versions), MaxRateVersions)
	}
	// Each byte is read once to number the lines (the document may be
	// read as JSON twice: to check it, then to build it).
	if numbered > 2*len(b) {
		t.Errorf("%d bytes read to number the lines of %d bytes of JSON", numbered, len(b))
	}
}
