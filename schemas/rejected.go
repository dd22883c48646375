package schemas

import (
	"crypto/sha256"
	"encoding/binary"
	"strings"
	"unicode/utf8"
)

// Bounds of a Rejected record (docs/design.md, Bad input): whatever a stage
// derives from one input stays far under the broker's size limit, so one
// input can never make its own rejection unwritable.
const (
	// MaxRejectedRawBytes bounds the prefix of the source key, and of the
	// source value, that a Rejected record carries. A record within
	// MaxEventBytes is therefore kept whole.
	MaxRejectedRawBytes = MaxEventBytes
	// MaxRejectedDetailBytes bounds Detail.
	MaxRejectedDetailBytes = 4 << 10
	// MaxRejectedFieldBytes bounds each other string of a Rejected record:
	// reason, stage, source topic and the identity fields.
	MaxRejectedFieldBytes = MaxIdentityFieldBytes
	// MaxRejectedBytes bounds a bounded Rejected record on the wire: its
	// encoding (EncodeRejected, or Encode after Bound) plus the record key
	// RejectedKey gives. It is far below Kafka's default message.max.bytes
	// (1 MiB).
	MaxRejectedBytes = 64 << 10
)

// Bound makes r fit MaxRejectedBytes (docs/design.md, Bad input): RawKey
// and RawValue keep at most their first MaxRejectedRawBytes, with the whole
// lengths in RawKeyLength and RawValueLength and SHA-256 digests of the
// whole bytes in RawKeySHA256 and RawValueSHA256; Detail and the other
// strings are made valid UTF-8 (invalid bytes become U+FFFD) and cut to
// their bounds on a UTF-8 boundary. Call it with RawKey
// and RawValue holding the whole source bytes. It is idempotent: raw bytes
// that already carry their digest are left alone. A prefix shares the
// source's memory.
func (r *Rejected) Bound() { r.BoundWith(nil) }

// BoundWith is Bound with the digests it computes written into sums (the
// key's first, then the value's), which they then share, instead of
// memory of their own (nil: allocated): a caller that encodes r at once
// (EncodeRejected) can keep sums in scratch memory, as long as it does
// not change them while r is in use.
func (r *Rejected) BoundWith(sums *[2 * sha256.Size]byte) {
	if sums == nil && (r.RawKeySHA256 == nil && r.RawKey != nil || r.RawValueSHA256 == nil && r.RawValue != nil) {
		sums = new([2 * sha256.Size]byte) // one allocation for both
	}
	if r.RawKeySHA256 == nil {
		r.RawKey, r.RawKeyLength, r.RawKeySHA256 = boundRaw(r.RawKey, sums, 0)
	}
	if r.RawValueSHA256 == nil {
		r.RawValue, r.RawValueLength, r.RawValueSHA256 = boundRaw(r.RawValue, sums, 1)
	}
	r.Detail = truncateText(validText(r.Detail), MaxRejectedDetailBytes)
	for _, s := range []*string{&r.Reason, &r.Stage, &r.SourceTopic, &r.CustomerID, &r.Meter, &r.EventID} {
		*s = truncateText(validText(*s), MaxRejectedFieldBytes)
	}
}

// boundRaw returns b's bounded prefix, its length and its digest, written
// into the i-th digest of sums.
func boundRaw(b []byte, sums *[2 * sha256.Size]byte, i int) (prefix []byte, n int64, sum []byte) {
	if b == nil {
		return nil, 0, nil
	}
	s := sha256.Sum256(b)
	sum = sums[i*sha256.Size : (i+1)*sha256.Size : (i+1)*sha256.Size]
	copy(sum, s[:])
	if len(b) > MaxRejectedRawBytes {
		return b[:MaxRejectedRawBytes:MaxRejectedRawBytes], int64(len(b)), sum
	}
	return b, int64(len(b)), sum
}

// validText returns s with each run of bytes that is not valid UTF-8
// replaced by U+FFFD: an Avro string is UTF-8, and a rejected event's
// identity fields are the producer's bytes, of an event perhaps rejected
// for them (its raw key and value keep them as they were).
func validText(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	return strings.ToValidUTF8(s, "\uFFFD")
}

// truncated ends a string Bound cut.
const truncated = "…"

// truncateText returns s, or when longer than max bytes its longest prefix
// of at most max−len(truncated) bytes that does not split a UTF-8 sequence,
// followed by "…".
func truncateText(s string, max int) string {
	if len(s) <= max {
		return s
	}
	cut := max - len(truncated)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + truncated
}

// RejectedKey returns the record key of the usage.rejected record derived
// from a source record whose key is k: k itself, or nil when k is longer
// than MaxRejectedRawBytes (the Rejected value keeps its prefix, length
// and digest). Place the record by the whole k, as before.
func RejectedKey(k []byte) []byte {
	if len(k) > MaxRejectedRawBytes {
		return nil
	}
	return k
}

// EncodeRejected bounds r (Bound) and appends its single-object encoding
// to dst. With RejectedKey's key the record stays within MaxRejectedBytes.
//
// The encoding is hand-written, byte for byte what hamba writes (Encode;
// TestEncodeRejectedMatchesHamba): a stage that refuses many events (the
// aggregator's over_limit) writes one record each.
func EncodeRejected(dst []byte, r *Rejected) ([]byte, error) {
	r.Bound()
	reg, err := load()
	if err != nil {
		return dst, err
	}
	if dst == nil {
		dst = make([]byte, 0, RejectedSizeMax(r))
	}
	return appendRejectedBody(append(dst, reg.headers[KindRejected][:]...), r), nil
}

// RejectedSizeMax is the most bytes EncodeRejected appends for r once
// bounded (Bound): a capacity that holds its encoding in one allocation.
func RejectedSizeMax(r *Rejected) int {
	return headerSize + 16*maxLongBytes + len(r.Reason) + len(r.Detail) + len(r.Stage) + len(r.SourceTopic) +
		len(r.CustomerID) + len(r.Meter) + len(r.EventID) + len(r.RawKey) + len(r.RawValue) +
		len(r.RawKeySHA256) + len(r.RawValueSHA256)
}

// appendRejectedBody appends r's Avro body as hamba writes it: the fields
// in schema order; a ["null", "bytes"] union as index 0 for a nil slice,
// else index 1 and the bytes.
func appendRejectedBody(dst []byte, r *Rejected) []byte {
	dst = appendString(dst, r.Reason)
	dst = appendString(dst, r.Detail)
	dst = appendString(dst, r.Stage)
	dst = appendString(dst, r.SourceTopic)
	dst = binary.AppendVarint(dst, int64(r.SourcePartition))
	dst = binary.AppendVarint(dst, r.SourceOffset)
	dst = binary.AppendVarint(dst, r.SourceTimestamp)
	dst = appendString(dst, r.CustomerID)
	dst = appendString(dst, r.Meter)
	dst = appendString(dst, r.EventID)
	dst = appendNullableBytes(dst, r.RawKey)
	dst = appendNullableBytes(dst, r.RawValue)
	dst = binary.AppendVarint(dst, r.RawKeyLength)
	dst = appendNullableBytes(dst, r.RawKeySHA256)
	dst = binary.AppendVarint(dst, r.RawValueLength)
	return appendNullableBytes(dst, r.RawValueSHA256)
}

// appendNullableBytes appends a ["null", "bytes"] union: null for nil.
func appendNullableBytes(dst, b []byte) []byte {
	if b == nil {
		return append(dst, 0)
	}
	dst = append(dst, 2) // index 1, zigzag
	dst = binary.AppendVarint(dst, int64(len(b)))
	return append(dst, b...)
}
