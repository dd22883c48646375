package dedup

import (
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestKeyRingErrorsNeverQuoteSecrets: a ring whose lines are mistyped —
// the two fields swapped, the secret pasted in place of the ID, a secret
// of one hex digit too many — is refused with an error that names the
// line but shows no secret, whether it comes from the file or from
// METERLINE_DEDUP_KEYS.
func TestKeyRingErrorsNeverQuoteSecrets(t *testing.T) {
	secret := strings.Repeat("5ec7", 16) // 32 bytes as hex
	cases := map[string]string{
		"swapped, ID not hex": secret + " k1\n",
		"swapped, ID is hex":  secret + " 2026\n", // "2026" decodes as a (short) secret
		"secret as the ID":    secret + " " + secret + "\n",
		"ID and secret glued": "k1" + secret + " " + secret + "\n",
		"odd hex digits":      "k1 " + secret + "f\n",
		"three fields":        "k1 " + secret + " " + secret + "\n",
		"second line swapped": "k1 " + strings.Repeat("ab", 32) + "\n" + secret + " k2\n",
	}
	for name, ring := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := ParseKeys([]byte(ring))
			if err == nil {
				t.Fatal("ParseKeys accepted the ring")
			}
			if strings.Contains(err.Error(), secret[:32]) {
				t.Errorf("ParseKeys error shows the secret: %v", err)
			}
			file := filepath.Join(t.TempDir(), "dedup.keys")
			if err := os.WriteFile(file, []byte(ring), 0o600); err != nil {
				t.Fatal(err)
			}
			if _, err := LoadKeys(file); err == nil || strings.Contains(err.Error(), secret[:32]) {
				t.Errorf("LoadKeys(file) error shows the secret (or none): %v", err)
			}
			t.Setenv(KeysEnv, strings.ReplaceAll(ring, "\n", ","))
			if _, err := LoadKeys(""); err == nil || strings.Contains(err.Error(), secret[:32]) {
				t.Errorf("LoadKeys(%s) error shows the secret (or none): %v", KeysEnv, err)
			}
		})
	}
}

// TestKeyRingGivenAsItsFileName: a ring set where its file's name belongs
// (--dedup-keys-file, METERLINE_DEDUP_KEYS_FILE) names no file; the error
// says so without showing the ring.
func TestKeyRingGivenAsItsFileName(t *testing.T) {
	k, err := GenerateKey("k1")
	if err != nil {
		t.Fatal(err)
	}
	hexSecret := hex.EncodeToString(k.Secret)
	for _, v := range []string{string(FormatKeys(k)), "k1 " + hexSecret, hexSecret} {
		if _, err := LoadKeys(v); err == nil || strings.Contains(err.Error(), hexSecret[:16]) {
			t.Errorf("LoadKeys(the ring as its file name): %v; want an error without the secret", err)
		}
	}
	// The ring in METERLINE_DEDUP_KEYS_FILE and METERLINE_DEDUP_KEYS both
	// set: the error that refuses both shows neither.
	t.Setenv(KeysEnv, "other "+strings.Repeat("ab", 32))
	for _, v := range []string{string(FormatKeys(k)), "k1 " + hexSecret} {
		if _, err := LoadKeys(v); err == nil || strings.Contains(err.Error(), hexSecret[:16]) || !strings.Contains(err.Error(), KeysEnv) {
			t.Errorf("LoadKeys(the ring as its file name) with %s set: %v; want an error naming %[1]s without the secret", KeysEnv, err)
		}
	}
}

// TestKeyRingFromOnePlace: a ring named both by a file and by
// METERLINE_DEDUP_KEYS is refused, as a password set both ways is: which
// one wins would be a guess, and an instance that silently kept the file's
// ring after the variable moved on to a new signing key would take the
// others' signatures for forgeries.
func TestKeyRingFromOnePlace(t *testing.T) {
	fileKey, err := GenerateKey("file")
	if err != nil {
		t.Fatal(err)
	}
	envKey, err := GenerateKey("env")
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "dedup.keys")
	if err := os.WriteFile(file, FormatKeys(fileKey), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv(KeysEnv, string(FormatKeys(envKey)))
	keys, err := LoadKeys(file)
	if err == nil {
		t.Fatalf("LoadKeys took the ring of %s (key %s) and ignored %s", file, keys[0].ID, KeysEnv)
	}
	if !strings.Contains(err.Error(), KeysEnv) || strings.Contains(err.Error(), hex.EncodeToString(envKey.Secret)) {
		t.Errorf("error %q: want one that names %s and shows no secret", err, KeysEnv)
	}
	if keys, err := LoadKeys(""); err != nil || len(keys) != 1 || keys[0].ID != "env" {
		t.Errorf("LoadKeys from %s alone: %v, %v", KeysEnv, keys, err)
	}
}
