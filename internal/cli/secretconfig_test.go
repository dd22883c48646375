package cli

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/meterline/meterline/internal/testenv"
)

// TestSecretInConfigNeverShown: a secret set in --config where the name
// of its file belongs, as a value YAML reads as no string (a password of
// digits, a list, a map), names no file either: the error names the key
// and never shows the value (docs/operations.md, Secrets), as it does for
// a string there, on the command line and in the environment.
func TestSecretInConfigNeverShown(t *testing.T) {
	file := tempFiles(t)
	for _, key := range []string{"kafka_sasl_password_file", "clickhouse_password_file", "kafka_tls_key_file",
		"clickhouse_tls_key_file", "dedup_keys_file", "ingest_tls_key_file"} {
		for _, v := range []struct{ yaml, shown string }{
			{"83920184736", "8.3920184736"}, // YAML reads a password of digits as a number
			{"839201.84736", "839201.84736"},
			{"0x5ec7ab12", "1590143762"},
			{"[hunter2-Secret]", "hunter2"},
			{"{hunter2: Secret}", "hunter2"},
		} {
			cfg := file("c.yaml", key+": "+v.yaml+"\n")
			code, out, errOut := run(t, "", "run", "--validate", "--instance-id", "a", "--config", cfg)
			if code != 2 || strings.Contains(out+errOut, v.shown) || !strings.Contains(errOut, "is not shown") {
				t.Errorf("%s: %s in --config: exit %d, want 2 and an error that does not show the value:\n%s%s", key, v.yaml, code, out, errOut)
			}
		}
	}
}

// TestSecretFileTooLarge: a secret file larger than any secret (a device
// such as /dev/zero, a log named by mistake) is a configuration error
// (exit 2) naming its flag and the file, found by --validate as by a
// start, instead of being read whole into memory: /dev/zero would be
// read until the process ran out of memory.
func TestSecretFileTooLarge(t *testing.T) {
	big := filepath.Join(t.TempDir(), "big")
	if err := os.WriteFile(big, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(big, 4<<20+1); err != nil {
		t.Fatal(err)
	}
	keys := testenv.DedupKeysFile(t)
	certs := testenv.NewCerts(t)
	run1 := []string{"run", "--validate", "--instance-id", "a", "--dedup-keys-file", keys}
	for _, args := range [][]string{
		append(slices.Clone(run1), "--kafka-sasl-mechanism", "SCRAM-SHA-512", "--kafka-sasl-user", "u", "--kafka-sasl-password-file", big),
		append(slices.Clone(run1), "--clickhouse-password-file", big),
		append(slices.Clone(run1), "--kafka-tls-ca-file", big),
		append(slices.Clone(run1), "--kafka-tls-cert-file", certs.ClientCertFile, "--kafka-tls-key-file", big),
		{"run", "--validate", "--instance-id", "a", "--dedup-keys-file", big},
	} {
		code, out, errOut := run(t, "", args...)
		if code != 2 || !strings.Contains(errOut, big) || !strings.Contains(errOut, "larger than") {
			t.Errorf("%s: exit %d, want 2 and an error naming the file and the bound:\n%s%s", args[len(args)-2:], code, out, errOut)
		}
	}
}
