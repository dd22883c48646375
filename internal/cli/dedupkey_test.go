package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meterline/meterline/dedup"
	"github.com/meterline/meterline/internal/testenv"
)

// TestDedupNeedsKeys: dedup and run refuse to start without the key ring
// that signs dedup's headers, and say how to make one; the ring comes from
// --dedup-keys-file or METERLINE_DEDUP_KEYS, never from a flag's value.
func TestDedupNeedsKeys(t *testing.T) {
	t.Setenv(dedup.KeysEnv, "")
	os.Unsetenv(dedup.KeysEnv)
	for _, cmd := range []string{"dedup", "run"} {
		code, _, errOut := run(t, "", cmd, "--validate", "--instance-id", "a")
		if code != 2 || !strings.Contains(errOut, "no header key") || !strings.Contains(errOut, "meterline dedup-key --out") {
			t.Errorf("%s without keys: exit %d, want 2 saying how to make a key:\n%s", cmd, code, errOut)
		}
	}
	file := testenv.DedupKeysFile(t)
	if code, out, errOut := run(t, "", "dedup", "--validate", "--instance-id", "a", "--dedup-keys-file", file); code != 0 {
		t.Errorf("with --dedup-keys-file: exit %d\n%s%s", code, out, errOut)
	}
	ring, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv(dedup.KeysEnv, string(ring))
	if code, out, errOut := run(t, "", "dedup", "--validate", "--instance-id", "a"); code != 0 {
		t.Errorf("with %s: exit %d\n%s%s", dedup.KeysEnv, code, out, errOut)
	}
}

// TestDedupKeyCommand: `meterline dedup-key --out FILE` writes a valid ring
// readable by its owner only, and keeps a ring that is already there.
func TestDedupKeyCommand(t *testing.T) {
	path := filepath.Join(t.TempDir(), "dedup.keys")
	if code, out, errOut := run(t, "", "dedup-key", "--id", "2026-12", "--out", path); code != 0 {
		t.Fatalf("exit %d\n%s%s", code, out, errOut)
	}
	first, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	keys, err := dedup.LoadKeys(path)
	if err != nil || len(keys) != 1 || keys[0].ID != "2026-12" {
		t.Fatalf("ring %v, %v", keys, err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("mode %v, %v; want 0600", fi.Mode().Perm(), err)
	}
	if code, out, _ := run(t, "", "dedup-key", "--out", path); code != 0 || !strings.Contains(out, "kept") {
		t.Errorf("second run: exit %d, %q", code, out)
	}
	if again, _ := os.ReadFile(path); string(again) != string(first) {
		t.Error("an existing ring was replaced")
	}
	if code, out, _ := run(t, "", "dedup-key"); code != 0 || len(strings.Fields(out)) != 2 {
		t.Errorf("dedup-key to stdout: exit %d, %d fields", code, len(strings.Fields(out)))
	}
}

// TestTimeParametersRefuseZero: a stage's Config takes a zero W, S, B or
// grace as "the default", so a flag set to 0 would silently run with the
// default (--skew 0 with an hour, --grace 0 with 48 hours). Dedup, run and
// the aggregator refuse 0 instead, naming the flag (refuseZeroFlags).
func TestTimeParametersRefuseZero(t *testing.T) {
	keys := testenv.DedupKeysFile(t)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"dedup", "--skew", "0"}, "--skew must not be 0"},
		{[]string{"dedup", "--window", "0"}, "--window must not be 0"},
		{[]string{"dedup", "--bucket", "0"}, "--bucket must not be 0"},
		{[]string{"run", "--dedup-skew", "0"}, "--dedup-skew must not be 0"},
		{[]string{"aggregate", "--skew", "0"}, "--skew must not be 0"},
		{[]string{"aggregate", "--window", "0"}, "--window must not be 0"},
		{[]string{"aggregate", "--grace", "0"}, "--grace must not be 0"},
		{[]string{"run", "--aggregate-grace", "0"}, "--aggregate-grace must not be 0"},
	} {
		args := append(c.args, "--validate", "--instance-id", "a", "--dedup-keys-file", keys)
		if c.args[0] == "aggregate" {
			args = append(c.args, "--validate", "--instance-id", "a")
		}
		code, out, errOut := run(t, "", args...)
		if code != 2 || !strings.Contains(errOut, c.want) {
			t.Errorf("%v: exit %d, want 2 saying %q\n%s%s", c.args, code, c.want, out, errOut)
		}
	}
	// A positive skew is honoured as given.
	if code, out, errOut := run(t, "", "dedup", "--skew", "1ms", "--validate", "--instance-id", "a", "--dedup-keys-file", keys); code != 0 {
		t.Errorf("dedup --skew 1ms: exit %d\n%s%s", code, out, errOut)
	}
}
