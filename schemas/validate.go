package schemas

import (
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Limits on a UsageEvent. Producers check them before sending and dedup
// checks them again on every record, so an event from any client is held to
// the same rules.
const (
	// MaxIdentityFieldBytes bounds customer_id, meter and event_id.
	MaxIdentityFieldBytes = 1024
	// MaxSourceBytes bounds source.
	MaxSourceBytes = 256
	// MaxProperties bounds the number of properties of one event.
	MaxProperties = 64
	// MaxPropertiesBytes bounds the sum of the lengths of all property
	// names and values of one event.
	MaxPropertiesBytes = 8 << 10
	// MaxEventBytes bounds one encoded UsageEvent record (key + value).
	MaxEventBytes = 16 << 10
	// MinEventTime is 2000-01-01T00:00:00Z in epoch ms; earlier event times
	// are a producer bug (typically seconds sent as milliseconds).
	MinEventTime int64 = 946684800000
)

// ErrInvalidEvent is wrapped by every FieldError.
var ErrInvalidEvent = errors.New("invalid event")

// FieldError says which field of an event is wrong and why. Code is the
// rejection reason it maps to: ReasonInvalid or ReasonOversized.
type FieldError struct {
	Field  string // JSON/Avro field name, e.g. "quantity" or "properties.model"
	Code   string // ReasonInvalid or ReasonOversized
	Reason string // human-readable, e.g. "must not be negative (got -1)"
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Reason }

// Unwrap makes errors.Is(err, ErrInvalidEvent) hold.
func (e *FieldError) Unwrap() error { return ErrInvalidEvent }

func invalid(field, format string, args ...any) *FieldError {
	return &FieldError{Field: field, Code: ReasonInvalid, Reason: fmt.Sprintf(format, args...)}
}

func oversized(field, format string, args ...any) *FieldError {
	return &FieldError{Field: field, Code: ReasonOversized, Reason: fmt.Sprintf(format, args...)}
}

// CheckText returns a *FieldError naming field when v is not acceptable
// text (docs/design.md, Event identity and keys): not valid UTF-8, or, with
// identity (customer_id, meter, event_id and source), holding a character
// that hides or disguises what the text shows (identityRefused): a control
// character (C0, U+0000–U+001F; DEL, U+007F; C1, U+0080–U+009F), a format
// character (general category Cf: the bidirectional controls, U+200B,
// U+2060, U+FEFF, the soft hyphen U+00AD, tags …) but the zero-width
// joiner and non-joiner (U+200D, U+200C: emoji sequences, Persian and
// Indic words) where they join something (strayJoiner), another default-ignorable code point (U+034F, the Hangul
// fillers, the variation selectors) or a line or paragraph separator
// (U+2028, U+2029). With them, one customer's ID could be shown as
// another's ("acme-\u202e1x" shows as "acme-x1", "acme-1\u00ad" as
// "acme-1"). The check is on the bytes themselves, so two byte strings
// that a lenient decoder would both turn into U+FFFD can never become one
// identity.
func CheckText(field, v string, identity bool) *FieldError {
	// The common case, printable ASCII, in one pass.
	i := 0
	for i < len(v) && v[i] >= 0x20 && v[i] < 0x7f {
		i++
	}
	if i == len(v) {
		return nil
	}
	if !utf8.ValidString(v) {
		i := firstInvalidUTF8(v)
		return invalid(field, "is not valid UTF-8 (byte 0x%02x at offset %d)", v[i], i)
	}
	if identity {
		for i, r := range v {
			if identityRefused(r) {
				return invalid(field, "holds the %s U+%04X at offset %d (not allowed in identity fields and source)", charKind(r), r, i)
			}
			if (r == zwnj || r == zwj) && strayJoiner(v, i) {
				return invalid(field, "holds the %s U+%04X at offset %d where it joins nothing (allowed in identity fields and source only between emoji or letters of a script that joins)",
					charKind(r), r, i)
			}
		}
	}
	return nil
}

// The zero-width non-joiner and joiner.
const (
	zwnj = 0x200c
	zwj  = 0x200d
)

// strayJoiner reports whether the joiner at offset i of v (U+200C or
// U+200D, 3 bytes) joins nothing a reader could see joined: it is at the
// start or the end of v, or beside another joiner, white space, or a
// character of ASCII or of the Latin, Greek or Cyrillic scripts, which
// joiners leave as they are. There it only hides, as the soft hyphen
// does: "acme-1\u200d" shows as "acme-1", a lone joiner as nothing.
func strayJoiner(v string, i int) bool {
	if i == 0 || i+3 >= len(v) {
		return true
	}
	prev, _ := utf8.DecodeLastRuneInString(v[:i])
	next, _ := utf8.DecodeRuneInString(v[i+3:])
	return !joinable(prev) || !joinable(next)
}

// joinable reports whether a joiner beside r may join it to its other
// neighbour (strayJoiner).
func joinable(r rune) bool {
	return r >= 0x80 && r != zwnj && r != zwj && !unicode.IsSpace(r) &&
		!unicode.In(r, unicode.Latin, unicode.Greek, unicode.Cyrillic)
}

// identityRefused reports whether r is refused in identity fields and
// source (CheckText).
func identityRefused(r rune) bool {
	switch {
	case r < 0x20 || r >= 0x7f && r <= 0x9f:
		return true
	case r < 0xad:
		return false
	case r == zwnj || r == zwj: // unless they join nothing (strayJoiner)
		return false
	case r == 0x2028 || r == 0x2029:
		return true
	}
	return unicode.In(r, unicode.Cf, unicode.Other_Default_Ignorable_Code_Point, unicode.Variation_Selector)
}

// charKind names the kind of a character identityRefused refuses.
func charKind(r rune) string {
	switch {
	case r <= 0x9f:
		return "control character"
	case r == zwnj:
		return "zero-width non-joiner"
	case r == zwj:
		return "zero-width joiner"
	case r == 0x2028:
		return "line separator"
	case r == 0x2029:
		return "paragraph separator"
	case unicode.Is(unicode.Bidi_Control, r):
		return "bidirectional control"
	}
	return "invisible character"
}

// firstInvalidUTF8 returns the offset of the first byte of s that does not
// start a valid UTF-8 sequence, or len(s).
func firstInvalidUTF8(s string) int {
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && n == 1 {
			return i
		}
		i += n
	}
	return len(s)
}

// IsBlank reports whether v, not empty, holds only white space
// (unicode.IsSpace: " ", U+00A0, U+3000 …), which an identity field may
// not: such an ID is as good as none (docs/design.md, Event identity and
// keys), as the CloudEvents SDK reads an id, source, type or subject of
// white space as missing.
func IsBlank(v string) bool {
	return v != "" && strings.TrimSpace(v) == ""
}

// Validate checks the rules that do not depend on time of arrival: identity
// fields present and not blank (IsBlank), bounded, valid UTF-8 without control, bidirectional or
// invisible characters (CheckText); quantity non-negative; event_time on
// or after 2000-01-01; source valid UTF-8 without them either; properties sorted, unique, valid UTF-8 and
// bounded. It returns the first *FieldError found, or nil. The window rules
// (too_old, in_future) are dedup's and depend on the arrival time.
func (e *UsageEvent) Validate() error {
	for _, f := range [...]struct{ name, v string }{
		{"customer_id", e.CustomerID}, {"meter", e.Meter}, {"event_id", e.EventID},
	} {
		switch {
		case f.v == "":
			return invalid(f.name, "must not be empty")
		case len(f.v) > MaxIdentityFieldBytes:
			return oversized(f.name, "%d bytes, more than %d", len(f.v), MaxIdentityFieldBytes)
		}
		if fe := CheckText(f.name, f.v, true); fe != nil {
			return fe
		}
		if IsBlank(f.v) {
			return invalid(f.name, "must not be blank (white space only)")
		}
	}
	if e.Quantity < 0 {
		return invalid("quantity", "must not be negative (got %d)", e.Quantity)
	}
	if e.EventTime == 0 {
		return invalid("event_time", "is missing (zero)")
	}
	if e.EventTime < MinEventTime {
		return invalid("event_time", "%d ms is before 2000-01-01 (seconds sent as milliseconds?)", e.EventTime)
	}
	if len(e.Source) > MaxSourceBytes {
		return oversized("source", "%d bytes, more than %d", len(e.Source), MaxSourceBytes)
	}
	if fe := CheckText("source", e.Source, true); fe != nil {
		return fe
	}
	if len(e.Properties) > MaxProperties {
		return oversized("properties", "%d properties, more than %d", len(e.Properties), MaxProperties)
	}
	size := 0
	for i, p := range e.Properties {
		if p.Name == "" {
			return invalid("properties", "a property has an empty name")
		}
		if fe := CheckText("properties", p.Name, false); fe != nil {
			fe.Reason = "a property name " + fe.Reason
			return fe
		}
		if i > 0 && p.Name <= e.Properties[i-1].Name {
			return invalid("properties."+p.Name, "not sorted by name, or repeated")
		}
		if fe := CheckText("properties", p.Value, false); fe != nil {
			fe.Field = "properties." + p.Name // built only here: no allocation per valid event
			return fe
		}
		size += len(p.Name) + len(p.Value)
	}
	if size > MaxPropertiesBytes {
		return oversized("properties", "%d bytes, more than %d", size, MaxPropertiesBytes)
	}
	return nil
}
