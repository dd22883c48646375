package schemas

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
)

// An event's identity is (customer_id, meter, event_id) (docs/design.md,
// Event identity and keys).

// Identity is the triple that names one usage event.
type Identity struct {
	CustomerID string
	Meter      string
	EventID    string
}

// Key returns the canonical Kafka key of the identity.
func (id Identity) Key() []byte { return id.AppendKey(make([]byte, 0, id.KeySize())) }

// AppendKey appends the canonical Kafka key of the identity to dst.
func (id Identity) AppendKey(dst []byte) []byte {
	dst = appendFramedPart(dst, id.CustomerID)
	dst = appendFramedPart(dst, id.Meter)
	return appendFramedPart(dst, id.EventID)
}

// KeySize is the length of the identity's key.
func (id Identity) KeySize() int {
	return framedSize(id.CustomerID) + framedSize(id.Meter) + framedSize(id.EventID)
}

func appendFramedPart(dst []byte, p string) []byte {
	dst = strconv.AppendInt(dst, int64(len(p)), 10)
	dst = append(dst, ':')
	return append(dst, p...)
}

// framedSize is the length of p framed: its length's digits, a colon, p.
func framedSize(p string) int {
	n := 2
	for l := len(p); l >= 10; l /= 10 {
		n++
	}
	return n + len(p)
}

func (id Identity) String() string { return string(id.Key()) }

// Identity returns the identity of the event.
func (e *UsageEvent) Identity() Identity {
	return Identity{CustomerID: e.CustomerID, Meter: e.Meter, EventID: e.EventID}
}

// AppendFramed appends each part prefixed by its length in bytes as a
// decimal number and a colon: "acme","api_calls" → "4:acme9:api_calls".
// Unlike a naive "a:b" join, two different part lists never frame to the
// same bytes.
func AppendFramed(dst []byte, parts ...string) []byte {
	for _, p := range parts {
		dst = appendFramedPart(dst, p)
	}
	return dst
}

// ErrBadKey is returned (wrapped) by ParseKey when a key is not the
// canonical encoding of an identity.
var ErrBadKey = errors.New("not a canonical identity key")

// ParseKey parses a canonical identity key. It accepts exactly the bytes
// Identity.Key produces: three parts, decimal lengths without sign or
// leading zeros, nothing after the third part.
func ParseKey(key []byte) (Identity, error) {
	var parts [3]string
	rest := key
	for i := range parts {
		j := 0
		for j < len(rest) && rest[j] != ':' {
			j++
		}
		digits := rest[:j]
		if j == len(rest) || len(digits) == 0 || len(digits) > 9 || (len(digits) > 1 && digits[0] == '0') {
			return Identity{}, fmt.Errorf("schemas: %w: part %d has no valid length prefix", ErrBadKey, i+1)
		}
		n := 0
		for _, c := range digits {
			if c < '0' || c > '9' {
				return Identity{}, fmt.Errorf("schemas: %w: part %d has no valid length prefix", ErrBadKey, i+1)
			}
			n = n*10 + int(c-'0')
		}
		rest = rest[j+1:]
		if n > len(rest) {
			return Identity{}, fmt.Errorf("schemas: %w: part %d is shorter than its length %d", ErrBadKey, i+1, n)
		}
		parts[i] = string(rest[:n])
		rest = rest[n:]
	}
	if len(rest) != 0 {
		return Identity{}, fmt.Errorf("schemas: %w: %d bytes after the third part", ErrBadKey, len(rest))
	}
	return Identity{CustomerID: parts[0], Meter: parts[1], EventID: parts[2]}, nil
}

// EventID derives a deterministic event ID from facts about the usage that
// stay the same on every retry. The parts are framed as AppendFramed does,
// hashed with SHA-256, and the first 16 bytes are returned as lowercase hex.
func EventID(parts ...string) string {
	var buf [256]byte // most IDs frame within it: no allocation but the result
	sum := sha256.Sum256(AppendFramed(buf[:0], parts...))
	var out [32]byte
	hex.Encode(out[:], sum[:16])
	return string(out[:])
}

// Murmur2 is the 32-bit murmur2 hash used by Kafka's Java client (and by
// franz-go's default partitioner) to choose a partition from a key.
func Murmur2(b []byte) int32 {
	const (
		seed = uint32(0x9747b28c)
		m    = uint32(0x5bd1e995)
		r    = 24
	)
	n := len(b)
	h := seed ^ uint32(n)
	i := 0
	for ; n-i >= 4; i += 4 {
		k := uint32(b[i]) | uint32(b[i+1])<<8 | uint32(b[i+2])<<16 | uint32(b[i+3])<<24
		k *= m
		k ^= k >> r
		k *= m
		h *= m
		h ^= k
	}
	switch n - i {
	case 3:
		h ^= uint32(b[i+2]) << 16
		fallthrough
	case 2:
		h ^= uint32(b[i+1]) << 8
		fallthrough
	case 1:
		h ^= uint32(b[i])
		h *= m
	}
	h ^= h >> 13
	h *= m
	h ^= h >> 15
	return int32(h)
}

// Partition returns the partition Kafka's default partitioner picks for a
// non-empty key among n partitions: (murmur2(key) & 0x7fffffff) mod n.
func Partition(key []byte, n int32) int32 {
	return (Murmur2(key) & 0x7fffffff) % n
}

// SplitFramed splits bytes made by AppendFramed back into their parts. It
// accepts exactly what AppendFramed produces (decimal lengths without sign
// or leading zeros), so two different byte strings never split into the
// same parts.
func SplitFramed(b []byte) ([]string, error) {
	var parts []string
	for len(b) > 0 {
		j := 0
		for j < len(b) && b[j] != ':' {
			j++
		}
		digits := b[:j]
		if j == len(b) || j == 0 || j > 9 || (j > 1 && digits[0] == '0') {
			return nil, fmt.Errorf("schemas: %w: bad length prefix", ErrBadKey)
		}
		n := 0
		for _, c := range digits {
			if c < '0' || c > '9' {
				return nil, fmt.Errorf("schemas: %w: bad length prefix", ErrBadKey)
			}
			n = n*10 + int(c-'0')
		}
		if n > len(b)-j-1 {
			return nil, fmt.Errorf("schemas: %w: bad part length", ErrBadKey)
		}
		parts = append(parts, string(b[j+1:j+1+n]))
		b = b[j+1+n:]
	}
	return parts, nil
}

// Keys of usage.entitlements and usage.balances (docs/entitlements.md,
// Topics). A customer's records are keyed by its framed customer_id
// (CustomerKey), so that the default partitioner places them with the
// customer's events. The records that apply to every customer are written
// to every partition under reserved keys, which start with '!' and so are
// never a framed customer (a framed part starts with a digit).
const (
	// DefaultPlanKey keys the default plan: an Entitlements record with
	// an empty CustomerID, for customers with no record of their own.
	DefaultPlanKey = "!default"
	// RateCardKey keys the RateCard.
	RateCardKey = "!rates"
	// TickKey keys the aggregator's Tick records in usage.entitlements
	// (the topic is compacted: each partition keeps its last tick).
	TickKey = "!tick"
)

// CustomerKey returns the record key of a customer: its customer_id
// framed as AppendFramed does, "4:acme".
func CustomerKey(customer string) []byte { return AppendFramed(nil, customer) }

// DedupedKeyScheme names the key of the records of usage.deduped: the
// customer (CustomerKey), so that Kafka's default partitioner places all of
// a customer's meters in one partition (docs/design.md, Topics). Dedup and
// the aggregator record it in their state and refuse state of another
// scheme (ErrKeyScheme). State written before schemes were recorded used
// "customer+meter" (AppendFramed of customer_id and meter), on other topic
// names.
const DedupedKeyScheme = "customer"

// ErrKeyScheme is returned (wrapped) by a stage whose state was built with
// another key scheme of usage.deduped than DedupedKeyScheme: a run that
// mixes them would split a customer's meters across partitions.
var ErrKeyScheme = errors.New("the state was built with another key scheme of the deduped topic")

// ParseCustomerKey parses a key made by CustomerKey. It accepts exactly
// those bytes: one framed part, nothing after it. Errors wrap ErrBadKey.
func ParseCustomerKey(key []byte) (string, error) {
	if len(key) == 0 || key[0] < '0' || key[0] > '9' {
		return "", fmt.Errorf("schemas: %w: not a framed customer", ErrBadKey)
	}
	parts, err := SplitFramed(key)
	if err != nil {
		return "", err
	}
	if len(parts) != 1 {
		return "", fmt.Errorf("schemas: %w: %d framed parts, want 1 (the customer)", ErrBadKey, len(parts))
	}
	if parts[0] == "" {
		return "", fmt.Errorf("schemas: %w: empty customer", ErrBadKey)
	}
	return parts[0], nil
}

// EntitlementsKey is a parsed key of usage.entitlements: either a
// customer, or one of the reserved keys (DefaultPlanKey, RateCardKey,
// TickKey).
type EntitlementsKey struct {
	Customer string // set when Reserved is empty
	Reserved string
}

// ParseEntitlementsKey parses a key of usage.entitlements. Errors wrap
// ErrBadKey: a key that is neither a framed customer nor a reserved key.
func ParseEntitlementsKey(key []byte) (EntitlementsKey, error) {
	switch string(key) {
	case DefaultPlanKey, RateCardKey, TickKey:
		return EntitlementsKey{Reserved: string(key)}, nil
	}
	c, err := ParseCustomerKey(key)
	if err != nil {
		return EntitlementsKey{}, err
	}
	return EntitlementsKey{Customer: c}, nil
}
