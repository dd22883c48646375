package testenv

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"path/filepath"
	"testing"
)

// DedupKeysFile writes a key ring of one fresh key, in the format of
// dedup.ParseKeys ("<id> <secret hex>"), to the test's temporary directory
// and returns its path, for `meterline dedup` and `meterline run`
// (--dedup-keys-file). Every instance a test starts shares it.
func DedupKeysFile(t testing.TB) string {
	t.Helper()
	secret := make([]byte, 32)
	if _, err := rand.Read(secret); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "dedup.keys")
	if err := os.WriteFile(path, []byte("test "+hex.EncodeToString(secret)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}
