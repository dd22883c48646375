package schemas

import (
	"bytes"
	"errors"
	"testing"
)

func TestEntitlementsKeys(t *testing.T) {
	for _, c := range []string{"acme", "a:b", "9:x", "ünï", "!default"} {
		k := CustomerKey(c)
		got, err := ParseEntitlementsKey(k)
		if err != nil || got != (EntitlementsKey{Customer: c}) {
			t.Errorf("ParseEntitlementsKey(CustomerKey(%q)) = %+v, %v", c, got, err)
		}
		// The customer key is the first part of the canonical identity
		// key, so events and entitlements frame a customer alike.
		if id := (Identity{CustomerID: c, Meter: "m", EventID: "e"}).Key(); !bytes.HasPrefix(id, k) {
			t.Errorf("identity key %q does not start with the customer key %q", id, k)
		}
	}
	for _, r := range []string{DefaultPlanKey, RateCardKey, TickKey} {
		got, err := ParseEntitlementsKey([]byte(r))
		if err != nil || got != (EntitlementsKey{Reserved: r}) {
			t.Errorf("ParseEntitlementsKey(%q) = %+v, %v", r, got, err)
		}
	}
	for _, bad := range []string{"", "acme", "0:", "4:acme9:api_calls", "!other", "04:acme", "5:acme", "4:acmex"} {
		if got, err := ParseEntitlementsKey([]byte(bad)); !errors.Is(err, ErrBadKey) {
			t.Errorf("ParseEntitlementsKey(%q) = %+v, %v; want ErrBadKey", bad, got, err)
		}
	}
}

// FuzzParseEntitlementsKey: a key of usage.entitlements (written by any
// client) parses only when it is exactly a customer key or a reserved key.
func FuzzParseEntitlementsKey(f *testing.F) {
	f.Add([]byte("4:acme"))
	f.Add([]byte(DefaultPlanKey))
	f.Add([]byte("0:"))
	f.Add([]byte("1:a1:b"))
	f.Fuzz(func(t *testing.T, b []byte) {
		k, err := ParseEntitlementsKey(b)
		if err != nil {
			if !errors.Is(err, ErrBadKey) {
				t.Fatalf("unexpected error class: %v", err)
			}
			return
		}
		if k.Reserved != "" {
			if k.Reserved != string(b) || k.Customer != "" {
				t.Fatalf("reserved key %q parsed as %+v", b, k)
			}
			return
		}
		if k.Customer == "" || !bytes.Equal(CustomerKey(k.Customer), b) {
			t.Fatalf("ParseEntitlementsKey accepted %q as %+v, which is not its customer key", b, k)
		}
	})
}
