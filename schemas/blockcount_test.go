package schemas

import (
	"encoding/binary"
	"errors"
	"math"
	"runtime"
	"testing"
)

// TestDecodeHambaCountOverflow: block counts that overflow int64 are
// rejected in every schema hamba/avro decodes, not only in those fast.go
// reads. hamba v2.31.0 takes a count of -2⁶³ (or counts whose sum wraps)
// as a slice of negative length and writes the following block's items
// outside it: a record of another kind written to a topic a stage decodes
// (dedup decodes whatever is in usage.events to name its kind) corrupted
// the process's memory, and with a few thousand items stopped it with a
// fatal runtime error.
func TestDecodeHambaCountOverflow(t *testing.T) {
	r := mustLoad()
	minLong := binary.AppendVarint(nil, math.MinInt64)
	// Block headers; one of 1 item ({2}) is followed by an item; the
	// array ends with 0.
	arrays := map[string][][]byte{
		// -2⁶³ items (and a byte size), then one item: hamba wrote it at
		// index -2⁶³, the slice's start, past its capacity 0.
		"count -2^63, then 1": {append(append([]byte{}, minLong...), 0), {2}},
		"sum overflows":       {{2}, binary.AppendVarint(nil, math.MaxInt64), {2}},
	}
	array := func(heads [][]byte, item []byte) []byte {
		var b []byte
		for _, h := range heads {
			b = append(b, h...)
			if len(h) == 1 && h[0] == 2 {
				b = append(b, item...)
			}
		}
		return append(b, 0)
	}
	for name, heads := range arrays {
		t.Run("Aggregate/"+name, func(t *testing.T) {
			b := append(r.headers[KindAggregate][:], 2, 'c', 2, 'm')
			b = append(b, array(heads, []byte{0, 0})...) // Property{"", ""}
			b = append(b, 2, 'S', 2, 2, 2, 2, 2, 2, 2, 2, 2)
			if _, err := Decode(b); !errors.Is(err, ErrUndecodable) || !errors.Is(err, errCountOverflow) {
				t.Fatalf("Decode = %v, want ErrUndecodable and errCountOverflow", err)
			}
		})
		t.Run("Balance/"+name, func(t *testing.T) {
			b := append(r.headers[KindBalance][:], 2, 'c', 2, 'p', 0, 2, 2, 2, 2)
			b = append(b, 0)                                            // no meters
			b = append(b, array(heads, []byte{0, 2, 2, 2, 2, 2, 2})...) // GrantBalance
			b = append(b, 0, 2, 2, 2)
			if _, err := Decode(b); !errors.Is(err, ErrUndecodable) || !errors.Is(err, errCountOverflow) {
				t.Fatalf("Decode = %v, want ErrUndecodable and errCountOverflow", err)
			}
		})
	}
}

// TestDecodeHambaAllocBoundedByBody: an array whose block count, or a
// string whose length, claims more than its body holds is refused before
// hamba/avro reads it. hamba grows the slice to the claimed count, and
// allocates the claimed length of a string, before it reads the first
// byte: a Balance of 23 bytes claiming 65,536 grants cost 4 MB and about
// a millisecond to refuse, a Tick of 13 bytes claiming a 1 MiB
// instance_id 1 MiB and a quarter of a millisecond, 100 to 600 times
// what dedup spends on another bad record, so that a producer writing
// such records to usage.events slowed dedup to a few thousand records a
// second.
func TestDecodeHambaAllocBoundedByBody(t *testing.T) {
	r := mustLoad()
	balance := append(r.headers[KindBalance][:], 2, 'c', 2, 'p', 0, 2, 2, 2, 2, 0) // … no meters,
	balance = binary.AppendVarint(balance, maxSliceAlloc)                          // 65,536 grants and no bytes
	tick := append(r.headers[KindTick][:], binary.AppendVarint(nil, maxByteSlice)...)
	for name, b := range map[string][]byte{"Balance": balance, "Tick": tick} {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		_, err := Decode(b)
		runtime.ReadMemStats(&after)
		if !errors.Is(err, ErrUndecodable) {
			t.Fatalf("%s: Decode = %v, want ErrUndecodable", name, err)
		}
		if n := after.TotalAlloc - before.TotalAlloc; n > 64<<10 {
			t.Errorf("%s: refusing a %d-byte message allocated %d bytes", name, len(b), n)
		}
	}
}

// FuzzCheckBody: checkBody refuses only bodies hamba/avro refuses too
// (or would take with overflowing block counts, which are kept away from
// it), so that Decode accepts what it accepted. Every input's body is
// tried under the header of every known schema.
func FuzzCheckBody(f *testing.F) {
	for _, b := range fuzzSeeds(f) {
		f.Add(b)
		f.Add(b[:len(b)/2])
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		r := mustLoad()
		body := b
		if IsSingleObject(b) {
			body = b[headerSize:]
		}
		for _, w := range r.writers {
			err := checkBody(w.kind, w.writer, body)
			if err == nil || errors.Is(err, errCountOverflow) {
				continue
			}
			if !errors.Is(err, ErrUndecodable) {
				t.Fatalf("%s: checkBody = %v, want ErrUndecodable", w.kind, err)
			}
			if herr := readHamba(r, w, body, newMessage(w.kind)); herr == nil {
				t.Fatalf("%s: checkBody refused what hamba decodes: %v\nbody: % x", w.kind, err, body)
			}
		}
	})
}
