package cli

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meterline/meterline/entitlements"
	"github.com/meterline/meterline/schemas"
)

// ratesDoc is a rate card document: the versions dated at froms, each
// pricing n meters whose names take nameBytes bytes.
func ratesDoc(froms []string, n, nameBytes int) string {
	var b strings.Builder
	b.WriteString("versions:\n")
	for _, from := range froms {
		fmt.Fprintf(&b, "  - effective_from: %q\n    rates:\n", from)
		for i := range n {
			fmt.Fprintf(&b, "      m%05d%s: 1000\n", i, strings.Repeat("x", nameBytes-6))
		}
	}
	return b.String()
}

// TestSetRatesRefusesACardTheAggregatorRefuses: the aggregator keeps a
// card's versions that can still price an event in one state value,
// bounded by entitlements.MaxVersionBytes, and refuses a card whose own
// versions pass it, whatever it read before (ErrTooManyVersions). A card
// of 10,000 rates of 50-byte meter names is about 540 KB, which Kafka
// takes: set-rates refuses it before writing, naming the bound, instead
// of writing a card that the aggregator refuses while get --rates shows
// it (the previous card, or none, pricing events meanwhile). A card whose
// past versions alone would pass the bound is written: the aggregator
// keeps only the one in effect and those after it.
func TestSetRatesRefusesACardTheAggregatorRefuses(t *testing.T) {
	dir := t.TempDir()
	write := func(name, doc string) string {
		f := filepath.Join(dir, name)
		if err := os.WriteFile(f, []byte(doc), 0o600); err != nil {
			t.Fatal(err)
		}
		return f
	}
	big := write("big.yaml", ratesDoc([]string{"2026-01-01T00:00:00Z"}, entitlements.MaxRates, 50))
	card := parseCard(t, big)
	if v, err := schemas.Encode(card); err != nil || len(v) > 900_000 {
		t.Fatalf("the card encodes to %d bytes (%v): want one that Kafka takes", len(v), err)
	}
	if err := applyCard(t, card); err == nil {
		t.Fatal("the aggregator's ledger applies the card: the test needs one that it refuses")
	}
	code, out, errs := run(t, "", "entitlements", "set-rates", "-f", big, "--validate")
	if code != 1 || !strings.Contains(errs, "bytes of rate cards") {
		t.Errorf("set-rates of a card the aggregator refuses: exit %d, stdout %q, stderr %.400q; want exit 1, naming the bytes", code, out, errs)
	}

	// The same rates over ten versions, nine of them past: the aggregator
	// keeps the last, 1,000 rates.
	var froms []string
	for i := range 10 {
		froms = append(froms, fmt.Sprintf("2026-01-%02dT00:00:00Z", i+1))
	}
	past := write("past.yaml", ratesDoc(froms, entitlements.MaxRates/10, 500))
	if err := applyCard(t, parseCard(t, past)); err != nil {
		t.Fatalf("the aggregator's ledger refuses a card of past versions: %v", err)
	}
	if code, out, errs := run(t, "", "entitlements", "set-rates", "-f", past, "--validate"); code != 0 {
		t.Errorf("set-rates of a card the aggregator applies: exit %d, stdout %q, stderr %.400q; want 0", code, out, errs)
	}
}

func parseCard(t *testing.T, f string) *schemas.RateCard {
	t.Helper()
	b, err := os.ReadFile(f)
	if err != nil {
		t.Fatal(err)
	}
	d, err := entitlements.ParseRatesDocument(b)
	if err != nil {
		t.Fatal(err)
	}
	c, err := d.Card(nil)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// applyCard applies the card, read now, to an aggregator's empty ledger.
func applyCard(t *testing.T, c *schemas.RateCard) error {
	t.Helper()
	l, err := entitlements.New(entitlements.Config{Prefix: []byte("e"), Period: func(ms int64) (int64, int64) { return ms, ms + 1 }})
	if err != nil {
		t.Fatal(err)
	}
	v, err := schemas.Encode(c)
	if err != nil {
		t.Fatal(err)
	}
	rec, err := entitlements.ParseRecord([]byte(schemas.RateCardKey), v, time.Now().UnixMilli())
	if err != nil {
		t.Fatal(err)
	}
	return l.Apply(mapStore{}, rec)
}

// mapStore is an entitlements.Store in a map (the ledger scans nothing
// to apply a rate card).
type mapStore map[string][]byte

func (m mapStore) Get(k []byte) ([]byte, bool, error) { v, ok := m[string(k)]; return v, ok, nil }
func (m mapStore) Put(k, v []byte)                    { m[string(k)] = v }
func (m mapStore) Delete(k []byte)                    { delete(m, string(k)) }
func (m mapStore) Scan(lo, hi []byte, fn func(k, v []byte) error) error {
	return nil
}
