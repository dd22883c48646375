// Package secret holds passwords and keys so that they do not leak: a
// Secret prints, formats and marshals as "[redacted]", and Load reads one
// from a file or an environment variable, never from a command-line value
// (docs/operations.md, Secrets).
package secret

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// Redacted is what a Secret shows of itself in logs, errors and JSON.
const Redacted = "[redacted]"

// Secret is a password or another credential. Its zero value is "no
// secret". Only Reveal returns the value: String, GoString, Format and the
// JSON and text marshalers all give Redacted, so a Secret inside a config
// struct passed to a logger, fmt's %v or %+v, or encoding/json stays
// hidden.
type Secret struct {
	v string
}

// New wraps a value.
func New(v string) Secret { return Secret{v: v} }

// Reveal returns the value, for the one call that needs it (a SASL
// mechanism, a database driver's options).
func (s Secret) Reveal() string { return s.v }

// IsZero reports whether no secret is set.
func (s Secret) IsZero() bool { return s.v == "" }

// String implements fmt.Stringer.
func (s Secret) String() string {
	if s.v == "" {
		return ""
	}
	return Redacted
}

// GoString implements fmt.GoStringer (%#v).
func (s Secret) GoString() string { return `secret.Secret("` + s.String() + `")` }

// Format implements fmt.Formatter: every verb prints String.
func (s Secret) Format(f fmt.State, _ rune) { _, _ = f.Write([]byte(s.String())) }

// MarshalText implements encoding.TextMarshaler (zap, YAML, JSON keys).
func (s Secret) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// MarshalJSON implements json.Marshaler.
func (s Secret) MarshalJSON() ([]byte, error) { return []byte(`"` + s.String() + `"`), nil }

// ErrEmpty is returned (wrapped) by FromFile and Load when the file or the
// variable holds nothing: an empty password is a mistake, not a choice.
var ErrEmpty = errors.New("secret: empty")

// FromFile reads a secret from a file. One trailing line break ("\n" or
// "\r\n") is dropped, as `echo pw > file` adds it; every other byte is
// kept. The error names the file (as ReadFile does), never its content.
func FromFile(path string) (Secret, error) {
	s, err := fromFile(path)
	if err != nil && !errors.Is(err, ErrEmpty) {
		return Secret{}, fmt.Errorf("secret: %w", err)
	}
	return s, err
}

func fromFile(path string) (Secret, error) {
	b, err := ReadFile(path)
	if err != nil {
		return Secret{}, err
	}
	v := strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r")
	if v == "" {
		return Secret{}, fmt.Errorf("%w: file %s", ErrEmpty, path)
	}
	return New(v), nil
}

// Load returns the secret from the file named by file, or else from the
// environment variable env (looked up with lookupEnv; os.LookupEnv when
// nil), or no secret when neither is set. Setting both is an error: which
// one wins would be a guess. flag names the file's flag in errors.
func Load(file, flag, env string, lookupEnv func(string) (string, bool)) (Secret, error) {
	if lookupEnv == nil {
		lookupEnv = os.LookupEnv
	}
	v, inEnv := lookupEnv(env)
	switch {
	case file != "" && inEnv:
		return Secret{}, fmt.Errorf("secret: both %s and %s are set; use one", flag, env)
	case file != "":
		s, err := fromFile(file)
		if err != nil && !errors.Is(err, ErrEmpty) {
			return Secret{}, fmt.Errorf("secret: %s: %w", flag, err)
		}
		return s, err
	case inEnv && v == "":
		return Secret{}, fmt.Errorf("%w: %s is set but empty", ErrEmpty, env)
	case inEnv:
		return New(v), nil
	}
	return Secret{}, nil
}

// MaxFileBytes bounds what ReadFile reads: a password, a key, a key ring
// or a bundle of CA certificates (the system's takes some 200 KB) is
// smaller.
const MaxFileBytes = 4 << 20

// ErrTooLarge is returned (wrapped) by ReadFile for a file larger than
// MaxFileBytes.
var ErrTooLarge = fmt.Errorf("larger than %d MiB: no password, key or certificate file is that large", MaxFileBytes>>20)

// ReadFile is os.ReadFile, except that its error names path only when
// path looks like one: it exists, or it has a directory part that exists
// (a file missing from /run/secrets/). Any other value may be a secret set
// where the name of its file belongs (a password in
// --kafka-sasl-password-file, a PEM key in METERLINE_KAFKA_TLS_KEY_FILE):
// the error then gives its length, never the value. It still wraps the
// cause (errors.Is(err, fs.ErrNotExist)).
//
// It reads at most MaxFileBytes: a larger file (a device such as
// /dev/zero, which never ends, or a log named by mistake) is an error
// wrapping ErrTooLarge that names it, not a process out of memory.
func ReadFile(path string) ([]byte, error) {
	b, err := readBounded(path)
	if err == nil {
		return b, nil
	}
	var pe *fs.PathError
	if errors.As(err, &pe) && pe.Path == path && !looksLikePath(path) {
		return nil, fmt.Errorf("%s a file whose name (%d bytes) is not shown, as it may be a secret given where the name of its file belongs: %w", pe.Op, len(path), pe.Err)
	}
	return nil, err
}

// readBounded is os.ReadFile of at most MaxFileBytes.
func readBounded(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, MaxFileBytes+1))
	if err != nil {
		return nil, err
	}
	if len(b) > MaxFileBytes {
		// The file opened: its name is one.
		return nil, fmt.Errorf("read %s: %w", path, ErrTooLarge)
	}
	return b, nil
}

func looksLikePath(path string) bool {
	if _, err := os.Lstat(path); err == nil {
		return true
	}
	dir := filepath.Dir(path)
	if dir == "." || !strings.ContainsRune(path, filepath.Separator) {
		return false
	}
	fi, err := os.Stat(dir)
	return err == nil && fi.IsDir()
}

// ReadableByOthers reports whether the regular file at path may be read
// by every user of the machine (its mode has o+r, 0o004), and its
// permission bits. It follows symbolic links: the files of a Kubernetes
// secret volume are links to files of mode defaultMode (0644 unless set).
// A path that does not name a regular file (missing, or a secret given
// where the name of its file belongs) is not reported: reading it fails
// on its own.
func ReadableByOthers(path string) (fs.FileMode, bool) {
	fi, err := os.Stat(path)
	if err != nil || !fi.Mode().IsRegular() {
		return 0, false
	}
	return fi.Mode().Perm(), fi.Mode().Perm()&0o004 != 0
}
