package secret

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

const pw = "hunter2-Secret"

// TestNeverShown: a Secret prints, formats, marshals and logs as
// [redacted], alone or inside a struct; only Reveal gives the value.
func TestNeverShown(t *testing.T) {
	s := New(pw)
	type conf struct {
		User     string
		Password Secret
		Ptr      *Secret
	}
	c := conf{User: "u", Password: s, Ptr: &s}
	j, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zap.DebugLevel)
	zap.New(core).Info("x", zap.Any("conf", c), zap.Stringer("s", s), zap.Any("secret", s))
	var logged []string
	for _, e := range logs.All() {
		for k, v := range e.ContextMap() {
			logged = append(logged, fmt.Sprintf("%s=%v", k, v))
		}
	}
	var anyS any = s // every verb, %d included, past vet's static check
	shown := []string{fmt.Sprint(s), fmt.Sprintf("%v %+v %#v %s %q %x %d", anyS, anyS, anyS, anyS, anyS, anyS, anyS), fmt.Sprintf("%v %+v %#v %d", c, c, c, any(c)),
		s.String(), s.GoString(), string(j), strings.Join(logged, " ")}
	for _, out := range shown {
		if strings.Contains(out, pw) {
			t.Errorf("secret shown: %s", out)
		}
	}
	if !strings.Contains(string(j), Redacted) || s.Reveal() != pw {
		t.Fatalf("json %s, Reveal %q", j, s.Reveal())
	}
	if New("").String() != "" || !New("").IsZero() || s.IsZero() {
		t.Fatal("zero value")
	}
}

// TestLoad: from a file (one trailing line break dropped), from the
// environment, neither (no secret), both (an error naming both), empty
// (an error naming the source, never a value).
func TestLoad(t *testing.T) {
	dir := t.TempDir()
	write := func(name, v string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(v), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	env := func(m map[string]string) func(string) (string, bool) {
		return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
	}
	none := env(nil)
	for _, c := range []struct {
		content, want string
	}{{pw + "\n", pw}, {pw + "\r\n", pw}, {pw, pw}, {" " + pw + " \n\n", " " + pw + " \n"}} {
		got, err := Load(write("f", c.content), "--pw-file", "PW", none)
		if err != nil || got.Reveal() != c.want {
			t.Errorf("file %q: %q, %v; want %q", c.content, got.Reveal(), err, c.want)
		}
	}
	got, err := Load("", "--pw-file", "PW", env(map[string]string{"PW": pw}))
	if err != nil || got.Reveal() != pw {
		t.Errorf("env: %q, %v", got.Reveal(), err)
	}
	got, err = Load("", "--pw-file", "PW", none)
	if err != nil || !got.IsZero() {
		t.Errorf("neither: %q, %v; want no secret", got.Reveal(), err)
	}
	_, err = Load(write("g", pw), "--pw-file", "PW", env(map[string]string{"PW": pw}))
	if err == nil || !strings.Contains(err.Error(), "--pw-file") || !strings.Contains(err.Error(), "PW") || strings.Contains(err.Error(), pw) {
		t.Errorf("both: %v; want an error naming both sources", err)
	}
	empty := write("empty", "\n")
	if _, err = Load(empty, "--pw-file", "PW", none); !errors.Is(err, ErrEmpty) || !strings.Contains(err.Error(), empty) {
		t.Errorf("empty file: %v", err)
	}
	if _, err = Load("", "--pw-file", "PW", env(map[string]string{"PW": ""})); !errors.Is(err, ErrEmpty) || !strings.Contains(err.Error(), "PW") {
		t.Errorf("empty variable: %v", err)
	}
	if _, err = Load(filepath.Join(dir, "missing"), "--pw-file", "PW", none); err == nil || !strings.Contains(err.Error(), "missing") {
		t.Errorf("missing file: %v", err)
	}
}

// TestLoadNeverQuotesASecretGivenAsAFileName: a password set where its
// file's name belongs (--pw-file hunter2, or PW_FILE=hunter2 for PW) names
// no file; the error says so and names the flag, never the value. A path
// that is one (a missing file in a directory that exists) is still named.
func TestLoadNeverQuotesASecretGivenAsAFileName(t *testing.T) {
	none := func(string) (string, bool) { return "", false }
	for _, v := range []string{pw, "pw/with+slash=", "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBg/kqhkiG9w0BAQEFAASC\n-----END PRIVATE KEY-----\n"} {
		_, err := Load(v, "--pw-file", "PW", none)
		if err == nil || strings.Contains(err.Error(), v) || strings.Contains(err.Error(), "MIIEvQ") || !strings.Contains(err.Error(), "--pw-file") {
			t.Errorf("Load(%q as the file): %v; want an error naming --pw-file and not the value", v, err)
		}
		if _, err := ReadFile(v); err == nil || !errors.Is(err, os.ErrNotExist) || strings.Contains(err.Error(), "MIIEvQ") || strings.Contains(err.Error(), v) {
			t.Errorf("ReadFile(%q): %v; want os.ErrNotExist, without the value", v, err)
		}
	}
	missing := filepath.Join(t.TempDir(), "kafka.pw")
	if _, err := Load(missing, "--pw-file", "PW", none); err == nil || !strings.Contains(err.Error(), missing) || !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file in an existing directory: %v; want its path named", err)
	}
}

// TestReadableByOthers: a file every user may read (0644, 0604, through
// a symbolic link as in a Kubernetes secret volume) is reported with its
// mode; one of mode 0600, 0640 or 0400, a directory, a missing file and a
// secret given as the name are not.
func TestReadableByOthers(t *testing.T) {
	dir := t.TempDir()
	file := func(name string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(pw), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(file("target", 0o644), link); err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]os.FileMode{file("a", 0o644): 0o644, file("b", 0o604): 0o604, link: 0o644} {
		if mode, ok := ReadableByOthers(path); !ok || mode != want {
			t.Errorf("%s: %v, %v; want %v, true", path, mode, ok, want)
		}
	}
	for _, path := range []string{file("c", 0o600), file("d", 0o640), file("e", 0o400), dir, filepath.Join(dir, "missing"), pw} {
		if mode, ok := ReadableByOthers(path); ok {
			t.Errorf("%s: %v, reported readable by others", path, mode)
		}
	}
}

// TestReadFileBounded: a file larger than any password, key, certificate
// bundle or key ring (a device such as /dev/zero, a log given by mistake)
// is refused with an error naming it once MaxFileBytes are read, rather
// than read whole into memory, which /dev/zero never ends. A file of
// MaxFileBytes is read.
func TestReadFileBounded(t *testing.T) {
	dir := t.TempDir()
	sparse := func(name string, size int64) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(p, size); err != nil {
			t.Fatal(err)
		}
		return p
	}
	const maxBytes = 4 << 20
	big := sparse("big", maxBytes+1)
	if b, err := ReadFile(big); err == nil || !strings.Contains(err.Error(), big) || !strings.Contains(err.Error(), "larger than 4 MiB") {
		t.Errorf("ReadFile of %d bytes: %d bytes, %v; want an error naming the file and the bound", maxBytes+1, len(b), err)
	}
	if _, err := Load(big, "--pw-file", "PW", func(string) (string, bool) { return "", false }); err == nil || !strings.Contains(err.Error(), "--pw-file") {
		t.Errorf("Load of %d bytes: %v; want an error naming the flag", maxBytes+1, err)
	}
	if b, err := ReadFile(sparse("fits", maxBytes)); err != nil || len(b) != maxBytes {
		t.Errorf("ReadFile of %d bytes: %d bytes, %v", maxBytes, len(b), err)
	}
}
