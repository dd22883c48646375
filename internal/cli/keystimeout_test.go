package cli

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/meterline/meterline/internal/testenv"
)

// TestKeysTimeoutBoundsTheCredentialCheck: --timeout is the deadline for
// the whole keys or tenants command, the check of the credentials at its
// start included. Against a broker that accepts connections and never
// answers, `keys list --timeout 1s` ends about a second later, not when
// the check's own bound of 15 s runs out.
func TestKeysTimeoutBoundsTheCredentialCheck(t *testing.T) {
	silent := testenv.SilentBroker(t)
	var out, errb testenv.SyncBuffer
	start := time.Now()
	code := Main(context.Background(), []string{"keys", "list", "--brokers", silent, "--timeout", "1s"},
		IO{Stdin: strings.NewReader(""), Stdout: &out, Stderr: &errb})
	took := time.Since(start)
	if code == 0 {
		t.Errorf("keys list against a broker that never answers: exit 0, want an error\nstdout: %s", out.String())
	}
	if took > 6*time.Second {
		t.Errorf("keys list --timeout 1s took %s against a broker that never answers; want it to end about its --timeout\nstderr: %s",
			took.Round(time.Millisecond), errb.String())
	}
}
