package schemas

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"math/rand/v2"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// TestEncodeBalanceMatchesHamba: Encode of a Balance (hand-written,
// balance.go) is byte for byte hamba's, on random balances: strings of
// every length, extreme longs, empty and nil arrays and arrays of more
// than one block; a value that is no enum symbol fails as with hamba.
func TestEncodeBalanceMatchesHamba(t *testing.T) {
	n := 5000
	if testing.Short() {
		n = 500
	}
	rng := rand.New(rand.NewPCG(7, 0x62616c616e6365))
	onLimits := []OnLimit{OnLimitReject, OnLimitAllow}
	policies := []OverdraftPolicy{OverdraftAllow, OverdraftDeny}
	count := func() int {
		switch rng.IntN(6) {
		case 0:
			return -1 // nil
		case 1:
			return 0
		case 2:
			return 95 + rng.IntN(120) // past a block of hambaBlockLength
		}
		return 1 + rng.IntN(4)
	}
	bs := []*Balance{{}, {OverdraftPolicy: OverdraftDeny}}
	for range n {
		b := &Balance{CustomerID: randString(rng), Plan: randString(rng), Unmetered: rng.IntN(2) == 0,
			Revision: randLong(rng), UpdatedAt: randLong(rng), PeriodStart: randLong(rng), PeriodEnd: randLong(rng),
			OverdraftPolicy: policies[rng.IntN(2)], OverdraftLimit: randLong(rng), Overdrawn: randLong(rng), CapsUntil: randLong(rng)}
		if c := count(); c >= 0 {
			b.Meters = make([]MeterBalance, c)
			for i := range b.Meters {
				b.Meters[i] = MeterBalance{Meter: randString(rng), Usage: randLong(rng), Limit: randLong(rng), OnLimit: onLimits[rng.IntN(2)]}
			}
		}
		if c := count(); c >= 0 {
			b.Grants = make([]GrantBalance, c)
			for i := range b.Grants {
				b.Grants[i] = GrantBalance{ID: randString(rng), Priority: randInt(rng), EffectiveFrom: randLong(rng), ExpiresAt: randLong(rng),
					Amount: randLong(rng), Consumed: randLong(rng), Remaining: randLong(rng)}
			}
		}
		bs = append(bs, b)
	}
	for _, b := range bs {
		if !balanceEncodable(b) {
			// The zero Balance: its overdraft policy is no symbol.
			continue
		}
		want, err := hambaEncode(b)
		if err != nil {
			t.Fatal(err)
		}
		got, err := Encode(b)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("Encode(%#v)\n = % x\nhamba % x", b, got, want)
		}
		if got, err := AppendEncode([]byte("prefix"), b); err != nil || !bytes.Equal(got, append([]byte("prefix"), want...)) {
			t.Fatal("AppendEncode does not append the encoding")
		}
		if len(got) > balanceSizeHint(b) {
			t.Fatalf("the encoding has %d bytes, more than balanceSizeHint %d", len(got), balanceSizeHint(b))
		}
	}
	for _, b := range []*Balance{{}, {OverdraftPolicy: "MAYBE"}, {OverdraftPolicy: OverdraftDeny, Meters: []MeterBalance{{OnLimit: "SOMETIMES"}}}} {
		if _, err := Encode(b); err == nil {
			t.Errorf("Encode(%#v): no error, want hamba's (no enum symbol)", b)
		}
	}
}

// TestOldBalanceFixture reads a Balance written with the schema before
// caps_until (history/balance.v0.avsc; the fixture is that schema's golden
// bytes) with the current one, by Decode and DecodeInto: caps_until is 0,
// no scheduled change known.
func TestOldBalanceFixture(t *testing.T) {
	b, err := hex.DecodeString(strings.TrimSpace(string(mustReadFile(t, filepath.Join("testdata", "balance.v0.hex")))))
	if err != nil {
		t.Fatal(err)
	}
	if binary.LittleEndian.Uint64(b[2:10]) == Fingerprint(KindBalance) {
		t.Fatal("fixture carries the current fingerprint; it must be written with the old schema")
	}
	want := samples()["balance"].(*Balance)
	want.CapsUntil = 0
	var into Balance
	for name, dec := range map[string]func() (Message, error){
		"Decode":     func() (Message, error) { return Decode(b) },
		"DecodeInto": func() (Message, error) { return &into, DecodeInto(b, &into) },
	} {
		m, err := dec()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !reflect.DeepEqual(m, want) {
			t.Fatalf("%s of the old fixture:\n got %#v\nwant %#v", name, m, want)
		}
	}
}
