package cli

import (
	"strings"
	"testing"
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
