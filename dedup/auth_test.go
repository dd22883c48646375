package dedup

import (
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
