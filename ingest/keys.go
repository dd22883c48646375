package ingest

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/meterline/meterline/schemas"
)

// API keys and tenants (docs/ingest.md, API keys and tenants).
//
// A key is a bearer token of 256 random bits. Only its SHA-256 is stored:
// the token is shown once, when the key is made. A slow password hash
// (bcrypt, argon2) protects guessable secrets; a 256-bit random token is
// beyond guessing, so one SHA-256 suffices and keeps every request cheap.
// The token carries its key's ID in the clear, so a request looks its key
// up by ID and compares hashes in constant time.
//
// Keys and tenants are records of a compacted topic (meterline.keys by
// default), keyed "key/<id>" and "tenant/<name>", with JSON values. Every
// ingest replica reads the topic from its start and follows it, so a key
// made or revoked anywhere takes effect on every replica within the time
// a record takes to reach a consumer (milliseconds), without a restart.

// Key is an API key as stored: its hash and scope, never the token.
type Key struct {
	ID     string `json:"id"`
	Tenant string `json:"tenant"`
	// Customers are the customers (subjects) the key may write: IDs, or
	// prefixes ending in "*" ("team-*"), or "*" for all of its tenant's.
	Customers []string `json:"customers"`
	// Meters, when not empty, are the only meters the key may write.
	Meters []string `json:"meters,omitempty"`
	// Rate bounds the events per second the key may send to each ingest
	// replica; 0 is no bound.
	Rate float64 `json:"rate,omitempty"`
	// Hash is the SHA-256 of the token, in hex.
	Hash      string    `json:"sha256"`
	Created   time.Time `json:"created"`
	Revoked   time.Time `json:"revoked,omitzero"`
	CreatedBy string    `json:"created_by,omitempty"`
}

// Tenant is a named set of customers; every key belongs to one tenant and
// writes only its customers.
type Tenant struct {
	Name      string    `json:"name"`
	Customers []string  `json:"customers"`
	Updated   time.Time `json:"updated"`
}

// record is the value of a record of the keys topic.
type record struct {
	V      int     `json:"v"`
	Key    *Key    `json:"key,omitempty"`
	Tenant *Tenant `json:"tenant,omitempty"`
}

const recordVersion = 1

// Record keys of the keys topic.
func keyRecordKey(id string) string      { return "key/" + id }
func tenantRecordKey(name string) string { return "tenant/" + name }

// tokenPrefix starts every token: "mlk_<16 hex id>_<43 base64url>".
const tokenPrefix = "mlk_"

// newToken makes a key ID and its token from 64 + 256 random bits.
func newToken() (id, token string, err error) {
	var idb [8]byte
	var secret [32]byte
	if _, err := rand.Read(idb[:]); err != nil {
		return "", "", fmt.Errorf("ingest: random key ID: %w", err)
	}
	if _, err := rand.Read(secret[:]); err != nil {
		return "", "", fmt.Errorf("ingest: random key: %w", err)
	}
	id = hex.EncodeToString(idb[:])
	return id, tokenPrefix + id + "_" + base64.RawURLEncoding.EncodeToString(secret[:]), nil
}

// tokenID returns the key ID a token names, or "" when the token is not of
// the form newToken makes.
func tokenID(token string) string {
	rest, ok := strings.CutPrefix(token, tokenPrefix)
	if !ok || len(rest) != 16+1+43 || rest[16] != '_' {
		return ""
	}
	if id := rest[:16]; isKeyID(id) {
		return id
	}
	return ""
}

// isKeyID reports whether id is a key ID as newToken makes them: 16
// lowercase hex digits.
func isKeyID(id string) bool {
	if len(id) != 16 {
		return false
	}
	_, err := hex.DecodeString(id)
	return err == nil && strings.ToLower(id) == id
}

func hashToken(token string) [sha256.Size]byte { return sha256.Sum256([]byte(token)) }

// matches reports whether the key's stored hash is the token's, in time
// that does not depend on where they differ.
func (k *Key) matches(token string) bool {
	want, err := hex.DecodeString(k.Hash)
	if err != nil || len(want) != sha256.Size {
		return false
	}
	got := hashToken(token)
	return subtle.ConstantTimeCompare(got[:], want) == 1
}

// Active reports whether the key is not revoked.
func (k *Key) Active() bool { return k.Revoked.IsZero() }

// ErrBadPattern is wrapped by the errors of CheckPatterns.
var ErrBadPattern = errors.New("bad customer pattern")

// CheckPatterns checks customer patterns: non-empty; an ID, a prefix
// followed by one "*" at the end, or "*".
func CheckPatterns(field string, ps []string) error {
	if len(ps) == 0 {
		return fmt.Errorf("ingest: %s: %w: none given", field, ErrBadPattern)
	}
	var errs []error
	for _, p := range ps {
		if p == "" || strings.Contains(strings.TrimSuffix(p, "*"), "*") {
			errs = append(errs, fmt.Errorf("ingest: %s: %w %q: want a customer ID, a prefix ending in *, or *", field, ErrBadPattern, p))
		}
	}
	return errors.Join(errs...)
}

// ErrBadMeter is wrapped by the errors of CheckMeters.
var ErrBadMeter = errors.New("bad meter name")

// CheckMeters checks a key's meters (keys create --allow-meters): exact
// meter names, as an event's meter is (schemas.UsageEvent.Validate), and
// no patterns: a name with * would be kept as a name no meter has, so the
// key could write none of what was meant.
func CheckMeters(ms []string) error {
	var errs []error
	for _, m := range ms {
		var why string
		switch {
		case strings.Contains(m, "*"):
			why = "meters are exact meter names, not patterns (only customers take prefixes ending in *): name each meter"
		case m == "" || schemas.IsBlank(m):
			why = "a meter name must not be empty or blank"
		case len(m) > schemas.MaxIdentityFieldBytes:
			why = fmt.Sprintf("a meter name is at most %d bytes", schemas.MaxIdentityFieldBytes)
		default:
			if fe := schemas.CheckText("meter", m, true); fe != nil {
				why = "a meter name " + fe.Reason
			}
		}
		if why != "" {
			errs = append(errs, fmt.Errorf("ingest: meters: %w %q: %s", ErrBadMeter, m, why))
		}
	}
	return errors.Join(errs...)
}

// matchCustomer reports whether customer c is matched by a pattern.
func matchCustomer(patterns []string, c string) bool {
	for _, p := range patterns {
		if prefix, ok := strings.CutSuffix(p, "*"); ok {
			if strings.HasPrefix(c, prefix) {
				return true
			}
		} else if p == c {
			return true
		}
	}
	return false
}

// covers reports whether every customer pattern p could match is matched
// by one of the outer patterns.
func covers(outer []string, p string) bool {
	for _, o := range outer {
		op, oWild := strings.CutSuffix(o, "*")
		pp, _ := strings.CutSuffix(p, "*")
		switch {
		case oWild && strings.HasPrefix(pp, op):
			return true
		case !oWild && o == p:
			return true
		}
	}
	return false
}

// Allows reports why the key (of tenant t) may not write customer c and
// meter m, or "" when it may.
func (k *Key) allows(t *Tenant, c, m string) string {
	if why := k.allowsCustomer(t, c); why != "" {
		return why
	}
	if len(k.Meters) > 0 && !slices.Contains(k.Meters, m) {
		return fmt.Sprintf("meter %q is outside the key's meters", clip(m))
	}
	return ""
}

// allowsCustomer is allows for customer c alone, whatever the meter.
func (k *Key) allowsCustomer(t *Tenant, c string) string {
	switch {
	case t == nil:
		return fmt.Sprintf("the key's tenant %q does not exist", k.Tenant)
	case !matchCustomer(t.Customers, c):
		return fmt.Sprintf("customer %q is not one of tenant %s's customers", clip(c), t.Name)
	case !matchCustomer(k.Customers, c):
		return fmt.Sprintf("customer %q is outside the key's customers", clip(c))
	}
	return ""
}

func encodeRecord(r record) []byte {
	r.V = recordVersion
	b, _ := json.Marshal(r) // plain structs always marshal
	return b
}

// decodeRecord decodes a keys-topic value; a tombstone (nil) deletes.
func decodeRecord(key string, value []byte) (record, error) {
	var r record
	if err := json.Unmarshal(value, &r); err != nil {
		return r, fmt.Errorf("ingest: keys topic record %q: %w", key, err)
	}
	if r.V != recordVersion {
		return r, fmt.Errorf("ingest: keys topic record %q: version %d, want %d (a newer Meterline wrote it?)", key, r.V, recordVersion)
	}
	// A record carries one key or one tenant, the one its record key
	// names: a second one would change what no record of its own says,
	// and would outlive that one's compaction.
	switch {
	case r.Key != nil && r.Tenant != nil:
		return r, fmt.Errorf("ingest: keys topic record %q: the value carries both a key and a tenant", key)
	case r.Key != nil && key == keyRecordKey(r.Key.ID):
	case r.Tenant != nil && key == tenantRecordKey(r.Tenant.Name):
	default:
		return r, fmt.Errorf("ingest: keys topic record %q: the value does not match the key", key)
	}
	return r, nil
}
