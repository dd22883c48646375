package entitlements

import (
	"fmt"
	"slices"
	"testing"
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
