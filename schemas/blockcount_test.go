package schemas

import (
	"encoding/binary"
	"errors"
	"math"
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
