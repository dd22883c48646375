package cli

import (
	"strings"
	"testing"

	"github.com/meterline/meterline/internal/testenv"
)

// TestEmptyDirFlagsRefused: a directory flag with a default set to ""
// (--state-dir "", or METERLINE_STATE_DIR= from a template whose value
// was left out) is left empty by the parser rather than given its default,
// and the stages then kept their state in the working directory
// (<cwd>/dedup-<instance-id>), wherever the process was started, with no
// word. Refused with exit status 2, naming the flag; "." still names the
// working directory on purpose.
func TestEmptyDirFlagsRefused(t *testing.T) {
	keys := testenv.DedupKeysFile(t)
	for _, args := range [][]string{
		{"dedup", "--validate", "--instance-id", "a", "--dedup-keys-file", keys, "--state-dir", ""},
		{"aggregate", "--validate", "--instance-id", "a", "--state-dir="},
		{"run", "--validate", "--instance-id", "a", "--dedup-keys-file", keys, "--state-dir", ""},
		{"demo", "--dir", "", "--duration", "1s"},
	} {
		code, out, errOut := run(t, "", args...)
		flag := "--state-dir"
		if args[0] == "demo" {
			flag = "--dir"
		}
		if code != 2 || !strings.Contains(errOut, flag+" is set but empty") {
			t.Errorf("%v: exit %d, want 2 saying %s is set but empty\n%s%s", args, code, flag, out, errOut)
		}
	}
	t.Run("env", func(t *testing.T) {
		t.Setenv("METERLINE_STATE_DIR", "")
		code, out, errOut := run(t, "", "run", "--validate", "--instance-id", "a", "--dedup-keys-file", keys)
		if code != 2 || !strings.Contains(errOut, "--state-dir is set but empty") {
			t.Errorf("METERLINE_STATE_DIR=: exit %d, want 2 naming --state-dir\n%s%s", code, out, errOut)
		}
	})
	if code, out, errOut := run(t, "", "run", "--validate", "--instance-id", "a", "--dedup-keys-file", keys, "--state-dir", "."); code != 0 {
		t.Errorf("--state-dir .: exit %d\n%s%s", code, out, errOut)
	}
}
