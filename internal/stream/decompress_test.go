package stream

import (
	"bytes"
	"encoding/binary"
	"testing"
)

// record encodes a v2 record with key and value (nil: null) and headers
// empty headers; claim, when not negative, is the header count it
// states instead.
func record(key, value []byte, headers, claim int) []byte {
	body := []byte{0}
	body = binary.AppendVarint(body, 0)
	body = binary.AppendVarint(body, 0)
	for _, b := range [][]byte{key, value} {
		if b == nil {
			body = binary.AppendVarint(body, -1)
			continue
		}
		body = binary.AppendVarint(body, int64(len(b)))
		body = append(body, b...)
	}
	if claim < 0 {
		claim = headers
	}
	body = binary.AppendVarint(body, int64(claim))
	body = append(body, bytes.Repeat([]byte{0, 1}, headers)...)
	return append(binary.AppendVarint(nil, int64(len(body))), body...)
}

// TestDecodedCost: what kgo allocates to decode a batch's records, besides
// their bytes: each record, and each header a record claims, up to one
// per byte left in it (kgo allocates them before reading them); the count
// stops where kgo stops decoding, and malformed bytes never panic.
func TestDecodedCost(t *testing.T) {
	cat := func(rs ...[]byte) []byte { return bytes.Join(rs, nil) }
	for _, c := range []struct {
		name string
		b    []byte
		want int64
	}{
		{"none", nil, 0},
		{"two records", cat(record([]byte("k"), []byte("v"), 0, -1), record(nil, nil, 0, -1)), 2 * recordCost},
		{"headers", record(nil, []byte("v"), 1000, -1), recordCost + 1000*headerCost},
		{"headers claimed, one byte each left", record(nil, nil, 10, 20), recordCost + 20*headerCost},
		{"more headers claimed than bytes left", record(nil, nil, 10, 21), recordCost},
		{"truncated record", record(nil, nil, 10, -1)[:5], 0},
		{"record longer than the bytes left", record(bytes.Repeat([]byte{'k'}, 100), nil, 0, -1)[:20], 0},
	} {
		if got := decodedCost(c.b); got != c.want {
			t.Errorf("%s: %d, want %d", c.name, got, c.want)
		}
	}
	// Every prefix of a batch, and every byte changed, without a panic.
	b := cat(record([]byte("key"), []byte("value"), 3, -1), record(nil, []byte("v"), 0, -1))
	for i := range b {
		_ = decodedCost(b[:i])
		for _, v := range []byte{0, 0x7f, 0x80, 0xff} {
			m := bytes.Clone(b)
			m[i] = v
			_ = decodedCost(m)
		}
	}
}
