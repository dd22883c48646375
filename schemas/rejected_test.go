package schemas

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"
)

func sha256Of(s string) []byte {
	sum := sha256.Sum256([]byte(s))
	return sum[:]
}

// TestRejectedBoundPoison: the rejection of a legal ~900 KiB record (400 KiB
// key, 500 KiB value) used to carry the key twice and the value once, more
// than the broker's 1 MiB limit. Bounded, it keeps a prefix of each, their
// whole lengths and their digests, and fits MaxRejectedBytes with its key.
func TestRejectedBoundPoison(t *testing.T) {
	key := bytes.Repeat([]byte("k"), 400<<10)
	val := bytes.Repeat([]byte{0xC3}, 500<<10)
	rej := &Rejected{Reason: ReasonOversized, Detail: strings.Repeat("d", 100<<10), Stage: "dedup",
		SourceTopic: "usage.events", RawKey: key, RawValue: val, CustomerID: strings.Repeat("é", 5000)}
	v, err := EncodeRejected(nil, rej)
	if err != nil {
		t.Fatal(err)
	}
	rk := RejectedKey(key)
	if rk != nil {
		t.Errorf("a 400 KiB key is the rejected record's key")
	}
	if n := len(v) + len(rk); n > MaxRejectedBytes {
		t.Fatalf("bounded record is %d bytes, more than %d", n, MaxRejectedBytes)
	}
	var got Rejected
	if err := DecodeInto(v, &got); err != nil {
		t.Fatal(err)
	}
	if got.RawKeyLength != int64(len(key)) || got.RawValueLength != int64(len(val)) {
		t.Errorf("lengths %d, %d; want %d, %d", got.RawKeyLength, got.RawValueLength, len(key), len(val))
	}
	if !bytes.Equal(got.RawKeySHA256, sha256Of(string(key))) || !bytes.Equal(got.RawValueSHA256, sha256Of(string(val))) {
		t.Error("digests are not the SHA-256 of the whole raw bytes")
	}
	if !bytes.Equal(got.RawKey, key[:MaxRejectedRawBytes]) || !bytes.Equal(got.RawValue, val[:MaxRejectedRawBytes]) {
		t.Error("raw bytes are not the prefixes of the source's")
	}
	if len(got.Detail) > MaxRejectedDetailBytes || !utf8.ValidString(got.CustomerID) || len(got.CustomerID) > MaxRejectedFieldBytes {
		t.Errorf("strings not bounded on UTF-8 boundaries: detail %d bytes, customer_id %d bytes valid=%v",
			len(got.Detail), len(got.CustomerID), utf8.ValidString(got.CustomerID))
	}
	// Idempotent: bounding the bounded record changes nothing.
	again := got
	again.Bound()
	if !reflect.DeepEqual(again, got) {
		t.Error("Bound of a bounded record changed it")
	}
}

// TestRejectedBoundKeepsSmall: a record within MaxEventBytes is kept
// whole; a null key stays null.
func TestRejectedBoundKeepsSmall(t *testing.T) {
	rej := &Rejected{Reason: ReasonUndecodable, RawValue: []byte("not avro")}
	rej.Bound()
	if rej.RawKey != nil || rej.RawKeyLength != 0 || rej.RawKeySHA256 != nil {
		t.Errorf("null key: %q %d %x", rej.RawKey, rej.RawKeyLength, rej.RawKeySHA256)
	}
	if string(rej.RawValue) != "not avro" || rej.RawValueLength != 8 || !bytes.Equal(rej.RawValueSHA256, sha256Of("not avro")) {
		t.Errorf("small value: %q %d %x", rej.RawValue, rej.RawValueLength, rej.RawValueSHA256)
	}
	if k := []byte("4:acme1:m1:e"); !bytes.Equal(RejectedKey(k), k) {
		t.Error("a small key is not kept as the record key")
	}
}

// TestOldRejectedFixture reads a Rejected record written with the first
// schema (history/rejected.v0.avsc, the golden bytes before bounding) with
// the current one: raw bytes whole, lengths -1, no digests.
func TestOldRejectedFixture(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("testdata", "rejected.v0.hex"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := hex.DecodeString(strings.TrimSpace(string(raw)))
	if err != nil {
		t.Fatal(err)
	}
	var got Rejected
	if err := DecodeInto(b, &got); err != nil {
		t.Fatal(err)
	}
	want := *samples()["rejected"].(*Rejected)
	want.RawKeyLength, want.RawKeySHA256, want.RawValueLength, want.RawValueSHA256 = -1, nil, -1, nil
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("old fixture:\n got %#v\nwant %#v", got, want)
	}
}

// FuzzBoundRejected: whatever the sizes of the source record and the
// strings, a bounded Rejected record fits MaxRejectedBytes with its key,
// decodes, and keeps valid UTF-8 valid.
func FuzzBoundRejected(f *testing.F) {
	f.Add([]byte("4:acme1:m1:e"), []byte("v"), "detail", "acme", 0)
	f.Add([]byte{}, []byte(nil), strings.Repeat("é", 3000), strings.Repeat("x", 2000), 900<<10)
	f.Fuzz(func(t *testing.T, key, val []byte, detail, id string, pad int) {
		if pad < 0 || pad > 2<<20 {
			pad = 0
		}
		val = append(val, make([]byte, pad)...)
		rej := &Rejected{Reason: ReasonOversized, Detail: detail, Stage: "dedup", SourceTopic: "usage.events",
			CustomerID: id, Meter: id, EventID: id, RawKey: key, RawValue: val}
		b, err := EncodeRejected(nil, rej)
		if err != nil {
			t.Fatal(err)
		}
		if n := len(b) + len(RejectedKey(key)); n > MaxRejectedBytes {
			t.Fatalf("%d bytes, more than %d", n, MaxRejectedBytes)
		}
		var got Rejected
		if err := DecodeInto(b, &got); err != nil {
			t.Fatal(err)
		}
		if got.RawValueLength != int64(len(val)) || got.RawKeyLength != int64(len(key)) {
			t.Fatalf("lengths %d %d, want %d %d", got.RawKeyLength, got.RawValueLength, len(key), len(val))
		}
		if utf8.ValidString(detail) && !utf8.ValidString(got.Detail) || utf8.ValidString(id) && !utf8.ValidString(got.CustomerID) {
			t.Fatal("truncation split a UTF-8 sequence")
		}
	})
}

// TestEncodeRejectedMatchesHamba: EncodeRejected's hand-written encoding
// is byte for byte hamba's (Encode after Bound), on random records with
// null, empty and non-empty raw bytes and digests, and extreme numbers.
func TestEncodeRejectedMatchesHamba(t *testing.T) {
	n := 20000
	if testing.Short() {
		n = 2000
	}
	rng := rand.New(rand.NewPCG(5, 0x72656a6563746564))
	randBytes := func() []byte {
		switch rng.IntN(4) {
		case 0:
			return nil
		case 1:
			return []byte{}
		}
		return []byte(randString(rng))
	}
	rs := []*Rejected{{}, {SourcePartition: math.MinInt32, SourceOffset: math.MinInt64, SourceTimestamp: math.MaxInt64,
		RawKeyLength: -1, RawValueLength: math.MinInt64, RawKey: []byte{}, RawValue: []byte{}, RawKeySHA256: []byte{}}}
	for i := 0; i < n; i++ {
		r := &Rejected{Reason: randString(rng), Detail: randString(rng), Stage: randString(rng), SourceTopic: randString(rng),
			SourcePartition: randInt(rng), SourceOffset: randLong(rng), SourceTimestamp: randLong(rng),
			CustomerID: randString(rng), Meter: randString(rng), EventID: randString(rng),
			RawKey: randBytes(), RawValue: randBytes()}
		if rng.IntN(2) == 0 {
			// Bound computes them; an already bounded record keeps them.
			r.RawKeyLength, r.RawKeySHA256 = randLong(rng), randBytes()
			r.RawValueLength, r.RawValueSHA256 = randLong(rng), randBytes()
		}
		rs = append(rs, r)
	}
	for _, r := range rs {
		bounded := *r
		bounded.Bound()
		want, err := hambaEncode(&bounded)
		if err != nil {
			t.Fatal(err)
		}
		got, err := EncodeRejected(nil, r)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("EncodeRejected(%#v)\n = % x\nhamba % x", r, got, want)
		}
		if got, err := EncodeRejected([]byte("prefix"), r); err != nil || !bytes.Equal(got, append([]byte("prefix"), want...)) {
			t.Fatal("EncodeRejected does not append the encoding")
		}
		if len(got) > RejectedSizeMax(r) {
			t.Fatalf("EncodeRejected wrote %d bytes, more than RejectedSizeMax %d", len(got), RejectedSizeMax(r))
		}
	}
}

// TestRejectedBoundWith: BoundWith bounds as Bound does, with the digests
// in the caller's memory, and allocates nothing; Bound allocates one
// array for both digests.
func TestRejectedBoundWith(t *testing.T) {
	key, value := []byte("cust-01234"), bytes.Repeat([]byte("v"), MaxRejectedRawBytes+5)
	mk := func() Rejected {
		return Rejected{Reason: ReasonOverLimit, Stage: "aggregator", RawKey: key, RawValue: value}
	}
	want := mk()
	want.Bound()
	var sums [2 * sha256.Size]byte
	got := mk()
	got.BoundWith(&sums)
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("BoundWith gave %+v, Bound %+v", got, want)
	}
	if !bytes.Equal(sums[:sha256.Size], sha256Of("cust-01234")) || &got.RawValueSHA256[0] != &sums[sha256.Size] {
		t.Fatalf("the digests are not in sums")
	}
	if n := testing.AllocsPerRun(100, func() { r := mk(); r.BoundWith(&sums) }); n != 0 {
		t.Errorf("BoundWith: %v allocations, want 0", n)
	}
	if n := testing.AllocsPerRun(100, func() { r := mk(); r.Bound() }); n != 1 {
		t.Errorf("Bound: %v allocations, want 1 (both digests in one array)", n)
	}
}

// TestRejectedBoundValidText: the strings of a Rejected record are valid
// UTF-8, as Avro strings are, whatever bytes the rejected record held.
// Dedup names the identity of an event it rejects, decoded from the
// producer's bytes, also of one rejected for invalid UTF-8 in it: a
// consumer of usage.rejected that decodes strings strictly could not read
// that rejection (fastavro 1.13 raises UnicodeDecodeError). Invalid bytes become
// U+FFFD; the raw key and value keep the bytes as they were.
func TestRejectedBoundValidText(t *testing.T) {
	r := &Rejected{Reason: ReasonInvalid, Detail: "customer_id: is not valid UTF-8 \xff", Stage: "dedup",
		SourceTopic: "usage.events", CustomerID: "ac\xffme", Meter: "m\xc3", EventID: "e\xed\xa0\x80",
		RawValue: []byte("ac\xffme")}
	b, err := EncodeRejected(nil, r)
	if err != nil {
		t.Fatal(err)
	}
	var got Rejected
	if err := DecodeInto(b, &got); err != nil {
		t.Fatal(err)
	}
	for name, s := range map[string]string{"detail": got.Detail, "customer_id": got.CustomerID, "meter": got.Meter, "event_id": got.EventID} {
		if !utf8.ValidString(s) {
			t.Errorf("%s %q is not valid UTF-8", name, s)
		}
	}
	if got.CustomerID != "ac\uFFFDme" {
		t.Errorf("customer_id %q, want %q", got.CustomerID, "ac\uFFFDme")
	}
	if string(got.RawValue) != "ac\xffme" {
		t.Errorf("raw value %q, want the bytes as they were", got.RawValue)
	}
}
