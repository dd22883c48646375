package entitlements

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"
)

// TestCustomersWithUsage: the customers with usage in one period, each
// once whatever its meters, in key order, in chunks with a cursor; a
// customer whose framed key is a prefix of another's, and the periods
// around, do not leak in.
func TestCustomersWithUsage(t *testing.T) {
	l, err := New(Config{Prefix: []byte("e"), Period: dayBounds})
	if err != nil {
		t.Fatal(err)
	}
	st := newMemStore()
	day := int64(24 * 3600 * 1000)
	d0 := 20 * day
	var want []string
	for i, c := range []string{"a", "acme", "b", "c:1", "zz", "acme2", "ä"} {
		for _, m := range []string{"tokens", "api_calls"}[:1+i%2] {
			ev := Event{Meter: m, Aggregation: "SUM", Quantity: 1, EventTime: d0 + 10, Arrival: d0 + 10}
			if _, err := l.Decide(st, c, ev); err != nil {
				t.Fatal(err)
			}
		}
		want = append(want, c)
	}
	// Usage in the days before and after.
	for _, at := range []int64{d0 - 1, d0 + day} {
		if _, err := l.Decide(st, "other", Event{Meter: "x", Aggregation: "COUNT", EventTime: at, Arrival: at}); err != nil {
			t.Fatal(err)
		}
	}
	// The order is that of the framed keys.
	slices.SortFunc(want, func(a, b string) int {
		return slices.Compare([]byte(fmt.Sprintf("%d:%s", len(a), a)), []byte(fmt.Sprintf("%d:%s", len(b), b)))
	})
	for _, chunk := range []int{1, 2, 3, 100} {
		var got []string
		after := ""
		for calls := 0; ; calls++ {
			cs, more, err := l.CustomersWithUsage(st, d0, after, chunk)
			if err != nil {
				t.Fatal(err)
			}
			if len(cs) > chunk {
				t.Fatalf("chunk %d: %d customers in one call", chunk, len(cs))
			}
			got = append(got, cs...)
			if !more {
				break
			}
			after = cs[len(cs)-1]
			if calls > 20 {
				t.Fatal("no end")
			}
		}
		if !slices.Equal(got, want) {
			t.Errorf("chunk %d: customers %q, want %q", chunk, got, want)
		}
	}
}

// TestCorruptPeriodIndexKeyIsAnError: a period index key too short to hold
// a period start (corrupt state) is an error wrapping ErrCorrupt for
// PrunePeriods and CustomersWithUsage, never a panic.
func TestCorruptPeriodIndexKeyIsAnError(t *testing.T) {
	base := time.Date(2026, time.December, 1, 0, 0, 0, 0, time.UTC).UnixMilli()
	l, err := New(Config{Prefix: []byte("e"), Period: monthBounds})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		key  []byte
		call func(Store) error
	}{
		{"PrunePeriods", []byte("eP\x00"), func(st Store) error {
			_, err := l.PrunePeriods(st, base+365*24*hourMs, 10)
			return err
		}},
		// Just past the index key of every customer of the period
		// starting at start (0x…00ff), and before the next period's
		// (0x…0100): a 7-byte start.
		{"CustomersWithUsage", []byte("eP\x00\x00\x00\x00\x00\x00\x01"), func(st Store) error {
			_, _, err := l.CustomersWithUsage(st, 0xff, "", 10)
			return err
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			st := newMemStore()
			st.Put(c.key, indexValue)
			var err error
			func() {
				defer func() {
					if r := recover(); r != nil {
						t.Fatalf("panic on the index key %q: %v", c.key, r)
					}
				}()
				err = c.call(st)
			}()
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("index key %q: %v, want ErrCorrupt", c.key, err)
			}
		})
	}
}
