package ingest

import (
	"net/http"
	"strings"
	"testing"

	"github.com/meterline/meterline/producer"
)

// TestQuantityLongExponent: a quantity whose exponent has more than six
// digits is read exactly, as any other: a body of up to --max-body-bytes
// (1 MiB) holds a mantissa of a million digits, which such an exponent
// brings back into range. 1 followed by a million zeros, times 10^-1000000,
// is 1 (not 10, as an exponent taken for -999999 would make it), and so
// is 0.000…01 with a million zeros, times 10^1000001, as a number or a
// numeric string.
func TestQuantityLongExponent(t *testing.T) {
	e := newEnv(t, nil)
	zeros := strings.Repeat("0", 1_000_000)
	ids := map[string]int64{}
	for i, q := range []string{"1" + zeros + "e-1000000", `"1` + zeros + `e-1000000"`, "0." + zeros + "1e1000001", "1" + zeros + "e-999999"} {
		want := int64(1)
		if i == 3 {
			want = 10
		}
		body := `{"specversion":"1.0","id":"q` + string(rune('0'+i)) + `","source":"s","type":"job","subject":"acme-1","time":"2026-11-29T12:00:00Z","data":{"seconds":` + q + `}}`
		code, _, b := e.post("/api/v1/events", "application/cloudevents+json", e.token, []byte(body))
		if code != http.StatusNoContent {
			t.Fatalf("quantity %d: %d %.300s; want 204", i, code, b)
		}
		ids[producer.EventID("s", "q"+string(rune('0'+i)))] = want * 1000 // gpu_ms has scale 3
	}
	recs := e.records()
	if len(recs) != len(ids) {
		t.Fatalf("%d records; want %d", len(recs), len(ids))
	}
	for _, r := range recs {
		if r.Quantity != ids[r.EventID] {
			t.Errorf("event %s: %d base units; want %d", r.EventID, r.Quantity, ids[r.EventID])
		}
	}
}
