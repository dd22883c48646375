package cli

import (
	"strings"
	"testing"

	"github.com/meterline/meterline/internal/testenv"
)

// TestLagNamesAGroupWithoutOffsets: a group that `meterline lag` shows no
// partition of (a misspelt --group, or a group that never committed) is
// named on stderr, rather than left out of the table without a word.
func TestLagNamesAGroupWithoutOffsets(t *testing.T) {
	_, brokers := testenv.KFake(t)
	code, stdout, stderr := run(t, "", "lag", "--brokers", strings.Join(brokers, ","), "--group", "meterline-dedp")
	if code != 0 {
		t.Fatalf("exit %d\nstdout: %s\nstderr: %s", code, stdout, stderr)
	}
	if !strings.Contains(stdout, "0 partitions") {
		t.Errorf("stdout %q: want the empty table", stdout)
	}
	if !strings.Contains(stderr, `group "meterline-dedp" has no committed offsets`) {
		t.Errorf("stderr %q does not name the group without offsets", stderr)
	}
}
