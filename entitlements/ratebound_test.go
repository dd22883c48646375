package entitlements

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/meterline/meterline/schemas"
)

// TestParseRecordRefusesRateCountsBeforeDecoding: a rate card written
// straight to the topic with 330,000 rates (about 1 MB, 6 versions of
// 55,000) cost about 10 MB and 16 ms to decode, to be refused for its
// count. It is refused by its counts before it is decoded, with what
// ParseRecord says of it decoded (ErrWrongKind under a key that does not
// take it, else invalid naming the count), allocating a small share of
// its size; so is a card of more versions than the bound; a card at the
// bounds is decoded as before.
func TestParseRecordRefusesRateCountsBeforeDecoding(t *testing.T) {
	// card has versions of rates each, of distinct meters, or of none
	// (3 bytes a rate) when blank.
	card := func(versions, rates int, blank bool) []byte {
		c := &schemas.RateCard{}
		for i := range versions {
			v := schemas.RateVersion{EffectiveFrom: int64(i + 1), Rates: make([]schemas.Rate, rates)}
			for j := range v.Rates {
				if !blank {
					v.Rates[j] = schemas.Rate{Meter: fmt.Sprintf("m%05d", j), MicroCredits: 1, PerUnits: 1}
				}
			}
			c.Versions = append(c.Versions, v)
		}
		return schemas.MustEncode(c)
	}
	huge := card(6, 55_000, true)
	for _, c := range []struct {
		name  string
		key   []byte
		value []byte
		kind  error
		says  string
	}{
		{"rate card", []byte(schemas.RateCardKey), huge, ErrInvalid, "330000 rates in all, more than 10000"},
		{"versions", []byte(schemas.RateCardKey), card(MaxRateVersions+1, 0, false), ErrInvalid, "1001 versions, more than 1000"},
		{"one rate past the bound", []byte(schemas.RateCardKey), card(1, MaxRates+1, false), ErrInvalid, "10001 rates in all, more than 10000"},
		{"customer key", schemas.CustomerKey("acme"), huge, ErrWrongKind, "a RateCard under"},
		{"default plan key", []byte(schemas.DefaultPlanKey), huge, ErrWrongKind, "a RateCard under"},
	} {
		var m0, m1 runtime.MemStats
		runtime.ReadMemStats(&m0)
		start := time.Now()
		_, err := ParseRecord(c.key, c.value, 1)
		took := time.Since(start)
		runtime.ReadMemStats(&m1)
		if !errors.Is(err, c.kind) || err == nil || !strings.Contains(err.Error(), c.says) || Reason(err) != schemas.ReasonInvalid {
			t.Errorf("%s: %v, want %v saying %q", c.name, err, c.kind, c.says)
		}
		n := m1.TotalAlloc - m0.TotalAlloc
		if n > max(uint64(len(c.value))/4, 4096) {
			t.Errorf("%s: %d bytes allocated to refuse a record of %d", c.name, n, len(c.value))
		}
		t.Logf("%s: a record of %d bytes refused in %v, %d bytes allocated", c.name, len(c.value), took, n)
	}
	if _, err := ParseRecord([]byte(schemas.RateCardKey), card(1, MaxRates, false), 1); err != nil {
		t.Errorf("a card of %d rates: %v", MaxRates, err)
	}
	if _, err := ParseRecord([]byte(schemas.RateCardKey), card(MaxRateVersions, 0, false), 1); err != nil {
		t.Errorf("a card of %d versions: %v", MaxRateVersions, err)
	}
}
