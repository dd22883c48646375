package dedup

// Authentication of the headers dedup writes (docs/design.md, Event
// identity and keys, "Signed headers").
//
// Dedup writes two kinds of records into usage.events: re-routed events and
// ticks. Anything a producer can write, it can also forge, so dedup signs
// both with HMAC-SHA256 under a secret shared by every dedup instance of a
// deployment, and trusts their headers only when the signature verifies:
//
//   - a re-routed record's signature covers the topic, the partition it was
//     written to, its key, the SHA-256 of its value, the original record's
//     coordinates and its arrival, so a header captured from one record
//     fails on any other record or partition;
//   - a tick's covers the topic, its partition and its value.
//
// The header meterline-auth is "v1:<key id>:<base64url MAC>". Keys have IDs:
// the first key of the ring signs, every key verifies, so a rotation adds a
// key, makes it the signer, and retires the old one only once no record it
// signed can still be read (the retention of usage.events).

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"os"
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/internal/secret"
)

// HeaderAuth carries the signature of a record dedup wrote: a re-routed
// event or a tick. Value: "v1:<key id>:<base64url HMAC-SHA256, no padding>".
const HeaderAuth = "meterline-auth"

// KeysEnv is the environment variable LoadKeys reads the key ring from when
// no file is named. Its value has the key file's format (keys separated by
// newlines or commas).
const KeysEnv = "METERLINE_DEDUP_KEYS"

// MinSecretBytes is the shortest secret a key may have.
const MinSecretBytes = 32

// maxKeyIDBytes bounds a key ID (it travels in every signed header).
const maxKeyIDBytes = 32

// ErrNoKeys is returned when no key authenticates dedup's headers: dedup
// refuses to run without one, since re-routed events would otherwise lose
// their arrival time or trust forged headers.
var ErrNoKeys = errors.New("no header key")

// keysHelp says how to make a key ring; every error about a missing or bad
// ring ends with it.
const keysHelp = "make one with `meterline dedup-key --out dedup.keys` (or: printf 'k1 %s\\n' \"$(openssl rand -hex 32)\" > dedup.keys), " +
	"then pass --dedup-keys-file dedup.keys (or put its line in " + KeysEnv + "); every dedup instance of the deployment needs the same file"

// Secret is key material. It formats as "[redacted]" so that a logged or
// printed configuration never shows it.
type Secret []byte

// String implements fmt.Stringer.
func (Secret) String() string { return "[redacted]" }

// GoString implements fmt.GoStringer.
func (Secret) GoString() string { return "dedup.Secret([redacted])" }

// Format implements fmt.Formatter, so %x and %v print no key bytes either.
func (Secret) Format(f fmt.State, _ rune) { _, _ = f.Write([]byte("[redacted]")) }

// MarshalText implements encoding.TextMarshaler (JSON, zap).
func (Secret) MarshalText() ([]byte, error) { return []byte("[redacted]"), nil }

// Key is one HMAC-SHA256 key of the ring that authenticates dedup's headers.
type Key struct {
	// ID names the key in the headers it signs: 1 to 32 bytes of
	// [A-Za-z0-9._-].
	ID string
	// Secret is at least MinSecretBytes of random bytes.
	Secret Secret
}

func validKeyID(id string) bool {
	if id == "" || len(id) > maxKeyIDBytes {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// validateKeys reports every problem of a key ring.
func validateKeys(keys []Key) error {
	if len(keys) == 0 {
		return fmt.Errorf("dedup: %w: dedup signs the headers of the records it re-routes and of its ticks; %s", ErrNoKeys, keysHelp)
	}
	var errs []error
	seen := map[string]bool{}
	for i, k := range keys {
		name := keyName(i+1, k.ID)
		if !validKeyID(k.ID) {
			errs = append(errs, fmt.Errorf("dedup: %s: its ID (%d bytes) must be 1 to %d bytes of [A-Za-z0-9._-]; a key is \"<id> <secret as hex>\"", name, len(k.ID), maxKeyIDBytes))
		} else if seen[k.ID] {
			errs = append(errs, fmt.Errorf("dedup: %s: its ID is used twice", name))
		}
		seen[k.ID] = true
		if len(k.Secret) < MinSecretBytes {
			errs = append(errs, fmt.Errorf("dedup: %s: secret of %d bytes, want at least %d; %s", name, len(k.Secret), MinSecretBytes, keysHelp))
		}
	}
	return errors.Join(errs...)
}

// keyName names key n of a ring in an error: by its position, and by its
// ID only when that is a valid key ID. A field that is not one may be a
// secret typed in the wrong place (the two fields swapped), and an error
// must never show a secret; a valid ID is at most maxKeyIDBytes long, too
// short to hold one.
func keyName(n int, id string) string {
	if validKeyID(id) {
		return fmt.Sprintf("key %d (%q)", n, id)
	}
	return fmt.Sprintf("key %d", n)
}

// ParseKeys reads a key ring: one key per line (or comma-separated), each
// "<id> <secret as hex>"; blank lines and lines starting with # are
// ignored. The first key signs; every key verifies. Errors never quote a
// secret.
func ParseKeys(b []byte) ([]Key, error) {
	var keys []Key
	var errs []error
	for i, line := range strings.FieldsFunc(string(b), func(r rune) bool { return r == '\n' || r == ',' }) {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) != 2 {
			errs = append(errs, fmt.Errorf("dedup: key entry %d: want \"<id> <secret as hex>\", got %d fields", i+1, len(f)))
			continue
		}
		secret, err := hex.DecodeString(f[1])
		if err != nil {
			errs = append(errs, fmt.Errorf("dedup: %s: secret is not hex (a key is \"<id> <secret as hex>\")", keyName(i+1, f[0])))
			continue
		}
		keys = append(keys, Key{ID: f[0], Secret: secret})
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if err := validateKeys(keys); err != nil {
		return nil, err
	}
	return keys, nil
}

// LoadKeys reads the key ring from file, or when file is empty from the
// environment variable KeysEnv. Setting both is an error: which one wins
// would be a guess. Never pass a secret on a command line.
func LoadKeys(file string) ([]Key, error) {
	if _, inEnv := os.LookupEnv(KeysEnv); inEnv && file != "" {
		// The file is not named: its name may be a ring set where the
		// name belongs (secret.ReadFile).
		return nil, fmt.Errorf("dedup: both a key file (--dedup-keys-file) and %s are set; use one", KeysEnv)
	}
	if file != "" {
		// secret.ReadFile: a ring set where its file's name belongs is
		// not quoted by the error.
		b, err := secret.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("dedup: read key file: %w", err)
		}
		keys, err := ParseKeys(b)
		if err != nil {
			return nil, fmt.Errorf("key file %s: %w", file, err)
		}
		return keys, nil
	}
	v, ok := os.LookupEnv(KeysEnv)
	if !ok {
		return nil, validateKeys(nil)
	}
	keys, err := ParseKeys([]byte(v))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", KeysEnv, err)
	}
	return keys, nil
}

// GenerateKey returns a new key of 32 random bytes. `meterline demo` and
// tests use one; a deployment keeps its ring in a file (FormatKeys).
func GenerateKey(id string) (Key, error) {
	s := make(Secret, MinSecretBytes)
	if _, err := rand.Read(s); err != nil {
		return Key{}, fmt.Errorf("dedup: generate key: %w", err)
	}
	k := Key{ID: id, Secret: s}
	if err := validateKeys([]Key{k}); err != nil {
		return Key{}, err
	}
	return k, nil
}

// FormatKeys writes keys in the format ParseKeys reads.
func FormatKeys(keys ...Key) []byte {
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "%s %s\n", k.ID, hex.EncodeToString(k.Secret))
	}
	return []byte(b.String())
}

// keyring signs with its first key and verifies with any.
type keyring struct {
	signID string
	sign   []byte
	byID   map[string][]byte
	check  map[string][keyCheckLen]byte // keyCheck of each key
}

func newKeyring(keys []Key) *keyring {
	kr := &keyring{signID: keys[0].ID, sign: keys[0].Secret, byID: make(map[string][]byte, len(keys)),
		check: make(map[string][keyCheckLen]byte, len(keys))}
	for _, k := range keys {
		kr.byID[k.ID] = k.Secret
		kr.check[k.ID] = keyCheck(k.Secret)
	}
	return kr
}

// keyCheckLen is the length of a key check value.
const keyCheckLen = 8

// keyCheck tells secrets apart without revealing them: the first bytes of
// an HMAC under the secret of a fixed message. The state keeps it beside a
// key's last use (keyuse.go), so that a key ID given another secret is not
// taken for the key that signed under that ID.
func keyCheck(secret []byte) (c [keyCheckLen]byte) {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(domainKeyCheck))
	copy(c[:], m.Sum(nil))
	return c
}

// Domains separate the two kinds of signed records.
const (
	domainReroute = "meterline/reroute/v1\x00"
	domainTick    = "meterline/tick/v1\x00"
	// domainKeyCheck is the message of keyCheck.
	domainKeyCheck = "meterline/key-check/v1\x00"
	authVersion    = "v1:"
)

// macInput writes the fields a signature covers, each with a fixed width
// or a length prefix, so that no two inputs share an encoding.
type macInput struct{ h hash.Hash }

func (m macInput) bytes(b []byte) {
	var l [8]byte
	binary.BigEndian.PutUint64(l[:], uint64(len(b)))
	m.h.Write(l[:])
	m.h.Write(b)
}

func (m macInput) str(s string) { m.bytes([]byte(s)) }

func (m macInput) i64(v int64) {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(v))
	m.h.Write(b[:])
}

// rerouted is what a re-routed record's signature covers besides the topic,
// partition, key and value of the record itself.
type rerouted struct {
	origPartition int32
	origOffset    int64
	arrival       int64
}

func (kr *keyring) rerouteMAC(secret []byte, topic string, partition int32, key, value []byte, rr rerouted) [sha256.Size]byte {
	m := macInput{hmac.New(sha256.New, secret)}
	m.h.Write([]byte(domainReroute))
	m.str(topic)
	m.i64(int64(partition))
	m.bytes(key)
	vs := sha256.Sum256(value)
	m.h.Write(vs[:])
	m.i64(int64(rr.origPartition))
	m.i64(rr.origOffset)
	m.i64(rr.arrival)
	var out [sha256.Size]byte
	m.h.Sum(out[:0])
	return out
}

func (kr *keyring) tickMAC(secret []byte, topic string, partition int32, value []byte) [sha256.Size]byte {
	m := macInput{hmac.New(sha256.New, secret)}
	m.h.Write([]byte(domainTick))
	m.str(topic)
	m.i64(int64(partition))
	m.bytes(value)
	var out [sha256.Size]byte
	m.h.Sum(out[:0])
	return out
}

func (kr *keyring) authValue(mac [sha256.Size]byte) []byte {
	v := make([]byte, 0, len(authVersion)+len(kr.signID)+1+authEncoding.EncodedLen(len(mac)))
	v = append(v, authVersion...)
	v = append(v, kr.signID...)
	v = append(v, ':')
	return authEncoding.AppendEncode(v, mac[:])
}

// authEncoding encodes a MAC in a header. Strict: a MAC has one spelling
// (the unused bits of the last character must be zero).
var authEncoding = base64.RawURLEncoding.Strict()

// rerouteHeaders returns the headers of a record re-routed to partition of
// topic with key and value: the original's coordinates, its arrival, and
// their signature.
func (kr *keyring) rerouteHeaders(topic string, partition int32, key, value []byte, rr rerouted) []kgo.RecordHeader {
	return []kgo.RecordHeader{
		{Key: HeaderRerouted, Value: fmt.Appendf(nil, "%d/%d", rr.origPartition, rr.origOffset)},
		{Key: HeaderArrival, Value: fmt.Appendf(nil, "%d", rr.arrival)},
		{Key: HeaderAuth, Value: kr.authValue(kr.rerouteMAC(kr.sign, topic, partition, key, value, rr))},
	}
}

// tickHeaders returns the header that signs a tick of partition.
func (kr *keyring) tickHeaders(topic string, partition int32, value []byte) []kgo.RecordHeader {
	return []kgo.RecordHeader{{Key: HeaderAuth, Value: kr.authValue(kr.tickMAC(kr.sign, topic, partition, value))}}
}

// parseAuth splits an auth header value into the secret of its key and its
// MAC. It fails on an unknown key ID or a malformed value.
func (kr *keyring) parseAuth(v []byte, mac *[sha256.Size]byte) ([]byte, string) {
	if len(v) < len(authVersion) || string(v[:len(authVersion)]) != authVersion {
		return nil, "unknown auth header version"
	}
	v = v[len(authVersion):]
	i := 0
	for i < len(v) && v[i] != ':' {
		i++
	}
	if i == len(v) {
		return nil, "malformed auth header"
	}
	secret, ok := kr.byID[string(v[:i])]
	if !ok {
		return nil, "unknown key ID"
	}
	enc := v[i+1:]
	if authEncoding.DecodedLen(len(enc)) != sha256.Size {
		return nil, "malformed MAC"
	}
	if n, err := authEncoding.Decode(mac[:], enc); err != nil || n != sha256.Size {
		return nil, "malformed MAC"
	}
	return secret, ""
}

// dedupHeaders are dedup's own headers found on a record.
type dedupHeaders struct {
	any                              bool // at least one of them
	dup                              bool // one of them more than once
	hasRerouted, hasArrival, hasAuth bool
	rerouted, arrival, auth          []byte
}

// scanHeaders finds dedup's headers without allocating.
func scanHeaders(hs []kgo.RecordHeader) (h dedupHeaders) {
	for i := range hs {
		switch hs[i].Key {
		case HeaderRerouted:
			h.dup = h.dup || h.hasRerouted
			h.hasRerouted, h.rerouted = true, hs[i].Value
		case HeaderArrival:
			h.dup = h.dup || h.hasArrival
			h.hasArrival, h.arrival = true, hs[i].Value
		case HeaderAuth:
			h.dup = h.dup || h.hasAuth
			h.hasAuth, h.auth = true, hs[i].Value
		default:
			continue
		}
		h.any = true
	}
	return h
}

// parseDec parses a decimal int64: an optional '-', then 1 to 19 digits,
// without a leading zero unless the number is 0. It is strict so that a
// value has one spelling only.
func parseDec(b []byte) (int64, bool) {
	neg := len(b) > 0 && b[0] == '-'
	if neg {
		b = b[1:]
	}
	if len(b) == 0 || len(b) > 19 || (b[0] == '0' && len(b) > 1) || (neg && b[0] == '0') {
		return 0, false
	}
	var v uint64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		v = v*10 + uint64(c-'0')
	}
	if v > 1<<63-1 {
		return 0, false
	}
	if neg {
		return -int64(v), true
	}
	return int64(v), true
}

// parseRerouted reads the coordinates and arrival headers.
func parseRerouted(h *dedupHeaders) (rerouted, bool) {
	if !h.hasRerouted || !h.hasArrival || h.dup {
		return rerouted{}, false
	}
	slash := -1
	for i, c := range h.rerouted {
		if c == '/' {
			slash = i
			break
		}
	}
	if slash < 0 {
		return rerouted{}, false
	}
	p, ok1 := parseDec(h.rerouted[:slash])
	o, ok2 := parseDec(h.rerouted[slash+1:])
	a, ok3 := parseDec(h.arrival)
	if !ok1 || !ok2 || !ok3 || p < 0 || p > 1<<31-1 || o < 0 {
		return rerouted{}, false
	}
	return rerouted{origPartition: int32(p), origOffset: o, arrival: a}, true
}

// verifyReroute checks the signature of a record that carries re-route
// headers. It returns why it fails, or "".
func (kr *keyring) verifyReroute(topic string, r *kgo.Record, h *dedupHeaders) (rerouted, string) {
	rr, ok := parseRerouted(h)
	if !ok {
		return rerouted{}, "malformed or repeated re-route headers"
	}
	if !h.hasAuth {
		return rerouted{}, "no signature"
	}
	var mac [sha256.Size]byte
	secret, why := kr.parseAuth(h.auth, &mac)
	if why != "" {
		return rerouted{}, why
	}
	want := kr.rerouteMAC(secret, topic, r.Partition, r.Key, r.Value, rr)
	if !hmac.Equal(mac[:], want[:]) {
		return rerouted{}, "signature does not match"
	}
	return rr, ""
}

// verifyTick checks the signature of a tick. It returns why it fails, or "".
func (kr *keyring) verifyTick(topic string, r *kgo.Record, h *dedupHeaders) string {
	if !h.hasAuth {
		return "no signature"
	}
	if h.dup || h.hasRerouted || h.hasArrival {
		return "unexpected headers on a tick"
	}
	var mac [sha256.Size]byte
	secret, why := kr.parseAuth(h.auth, &mac)
	if why != "" {
		return why
	}
	want := kr.tickMAC(secret, topic, r.Partition, r.Value)
	if !hmac.Equal(mac[:], want[:]) {
		return "signature does not match"
	}
	return ""
}
