package entitlements

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/meterline/meterline/schemas"
)

// TestKeptVersionsBoundedInBytes: a key's versions are one state value,
// written whole to the changelog, which takes no record past the broker's
// size (1 MB by default). A stage keeps the versions in effect from its
// watermark less the span on (the rate history: less the window W too),
// and its watermark is behind the broker time of the records it reads. A
// large record (A), a small one a millisecond later (C), and another
// large one (B) a span after C: counted from the span before B alone, C
// and B fit, but a stage whose watermark was a minute behind kept A too,
// and its state value passed 1 MB (a customer's timeline: 1,057,852
// bytes; the rate history, on every partition: 1,440,259), so that no
// transaction of the partition could commit. B is refused, by a stage
// caught up to within a minute and by one that never prunes alike, and
// the state value stays under MaxVersionBytes; B written once A is older
// than that is applied, on both.
func TestKeptVersionsBoundedInBytes(t *testing.T) {
	w := DefaultWindow
	span := w + 2*time.Hour
	lag := time.Minute.Milliseconds()
	small := bigPlan("small")
	small.Caps, small.Grants = small.Caps[:1], nil
	card := func(n int, price int64) *schemas.RateCard {
		v := schemas.RateVersion{}
		for i := range n {
			v.Rates = append(v.Rates, schemas.Rate{Meter: fmt.Sprintf("%04d", i) + strings.Repeat("m", MaxNameBytes-4), MicroCredits: price, PerUnits: 1})
		}
		return &schemas.RateCard{Versions: []schemas.RateVersion{v}}
	}
	for _, c := range []struct {
		name    string
		key     []byte
		a, c, b schemas.Message
		stored  func(*Ledger) []byte
	}{
		{"customer", schemas.CustomerKey("acme"), bigPlan("one"), small, bigPlan("two"),
			func(l *Ledger) []byte { return l.customerKey(subTimeline, "acme") }},
		{"rate card", []byte(schemas.RateCardKey), card(700, 1), card(1, 2), card(700, 3),
			func(l *Ledger) []byte { return l.keyRates }},
	} {
		t.Run(c.name, func(t *testing.T) {
			// sides[0] is caught up to within lag, sides[1] never prunes.
			var ls [2]*Ledger
			var sts [2]*memStore
			for k := range ls {
				l, err := New(Config{Prefix: []byte("e"), Period: monthBounds, Window: w, Span: span})
				if err != nil {
					t.Fatal(err)
				}
				ls[k], sts[k] = l, newMemStore()
			}
			apply := func(at int64, m schemas.Message) error {
				t.Helper()
				v, err := schemas.Encode(m)
				if err != nil {
					t.Fatal(err)
				}
				var errs [2]error
				for k, l := range ls {
					rec, err := ParseRecord(c.key, v, at)
					if err != nil {
						t.Fatal(err)
					}
					if errs[k] = l.Apply(sts[k], rec); errs[k] != nil && !errors.Is(errs[k], ErrTooManyVersions) {
						t.Fatal(errs[k])
					}
					if k == 0 {
						if err := l.PruneCustomer(sts[k], "acme", at-lag-span.Milliseconds()); err != nil {
							t.Fatal(err)
						}
						if err := l.PruneShared(sts[k], at-lag-span.Milliseconds()); err != nil {
							t.Fatal(err)
						}
						if v, _, _ := sts[k].Get(c.stored(l)); len(v) > MaxVersionBytes {
							t.Fatalf("at %d: the state value is %d bytes, more than %d", at, len(v), MaxVersionBytes)
						}
					}
				}
				if (errs[0] == nil) != (errs[1] == nil) {
					t.Fatalf("at %d: caught up %v, never pruned %v", at, errs[0], errs[1])
				}
				return errs[0]
			}
			t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC).UnixMilli()
			if err := apply(t0, c.a); err != nil {
				t.Fatal(err)
			}
			if err := apply(t0+1, c.c); err != nil {
				t.Fatal(err)
			}
			if err := apply(t0+span.Milliseconds()+2, c.b); !errors.Is(err, ErrTooManyVersions) {
				t.Fatalf("B a span after C, while a stage a minute behind keeps A: %v, want ErrTooManyVersions", err)
			}
			if err := apply(t0+3*span.Milliseconds(), c.b); err != nil {
				t.Fatalf("B once A is older than any stage within a span keeps: %v", err)
			}
		})
	}
}
